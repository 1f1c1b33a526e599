"""Part B under Lightning's DDP (2 CPU processes, gloo): SFT then GRPO end to end, and the mixture metrics of the
2-process evaluation equal the 1-process evaluation of the same checkpoints.

The held-out union is odd (3 ARC + 2 RACE fixture prompts), so the default DistributedSampler hands rank 1 a repeat
of prompt 0: it is evaluated on both ranks and must be counted once. Evaluation draws are seeded per prompt
(tests/ddp_policy_script.py's SeedPerPrompt), so a prompt gets the same completion on any rank and the counts can be
compared exactly; the persona fidelities (teacher-forced probabilities) to float rounding.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import mixture_fixtures  # noqa: F401  (repository root on sys.path)
from tests import ddp_policy_script as script

SCRIPT = script.__file__
HELD_OUT = 5  # ARC 3 + RACE 2


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("policy_ddp"))
    env = dict(os.environ)
    env.pop("MASTER_PORT", None)
    proc = subprocess.run([sys.executable, SCRIPT, out, "2"], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(SCRIPT))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = []
    for r in (0, 1):
        with open(os.path.join(out, f"run.rank{r}.json")) as f:
            ranks.append(json.load(f))
    return out, ranks


def test_sft_and_rl_complete_under_ddp(ddp_run):
    out, (r0, r1) = ddp_run
    for r in (r0, r1):
        assert r["sft_fit"]["global_step"] == script.SFT_STEPS
        assert r["rl_fit"]["global_step"] == script.RL_STEPS and r["rl_fit"]["rl_step"] == script.RL_STEPS
        assert r["rl_fit"]["history"] == [0, 2, 4]  # sanity pass (step 0) + every 2 RL steps, on both ranks
    # gradients are synced: both ranks end with the same weights, and RL moved them
    assert r0["sft_fit"]["checksum"] == r1["sft_fit"]["checksum"]
    assert r0["rl_fit"]["checksum"] == r1["rl_fit"]["checksum"]
    assert r0["rl_fit"]["checksum"] != r0["sft_fit"]["checksum"]
    # logged training values are the mean over ranks: the same number on both
    assert r0["sft_fit"]["loss"] == r1["sft_fit"]["loss"] and r0["rl_fit"]["reward"] == r1["rl_fit"]["reward"]
    # the ranks draw disjoint halves of the training prompts (no epoch boundary crossed: 64 / (2 x 2) = 16 RL steps)
    assert len(r0["rl_fit"]["train"]) == len(r1["rl_fit"]["train"]) == script.RL_STEPS * 2
    assert not set(r0["rl_fit"]["train"]) & set(r1["rl_fit"]["train"])
    # and sample from different random streams (same seed_everything seed, offset on rank 1)
    assert r0["rl_fit"]["seed"] != r1["rl_fit"]["seed"]
    # the persona tracking table is written once, from the synced evaluations
    with open(os.path.join(out, "tracking", "rl_table.json")) as f:
        table = json.load(f)
    assert [h["step"] for h in table["history"]] == [0, 2, 4] and table["n_per_distribution"] == 3


def test_ddp_evaluation_equals_single_process(ddp_run):
    out, (r0, r1) = ddp_run
    torch.set_num_threads(1)
    single = script.evaluate(out, devices=1)
    for stage in ("sft", "rl"):
        one, two = single[stage], r0["eval"][stage]
        # the padding: rank 1 evaluated a repeat of prompt 0 ...
        assert sorted(one["evaluated"]) == list(range(HELD_OUT))
        assert sorted(r0["eval"][stage]["evaluated"] + r1["eval"][stage]["evaluated"]) == [0, *range(HELD_OUT)]
        # ... which is counted once: the counts are the single process's, exactly, on both ranks
        assert two["counts"]["n"] == [3.0, 2.0]
        assert two["counts"] == one["counts"] == r1["eval"][stage]["counts"], stage
        # a persona that never spoke on a distribution has no refusal rate: NaN on both sides
        assert two["metrics"] == pytest.approx(one["metrics"], abs=1e-7, nan_ok=True)
        assert two["metrics"] == pytest.approx(r1["eval"][stage]["metrics"], abs=0, nan_ok=True)
    fid_two, fid_one = r0["eval"]["sft"]["fidelity"], single["sft"]["fidelity"]
    assert set(fid_two["cells"]) == {"Alice/ARC", "Alice/RACE", "Bob/ARC", "Bob/RACE"}
    assert fid_two["cells"] == pytest.approx(fid_one["cells"], abs=1e-6)
    assert [fid_two[k] for k in ("mean", "min", "capability")] == pytest.approx([fid_one[k] for k in ("mean", "min", "capability")], abs=1e-6)
    # the comparison is not vacuous: the completions of each checkpoint fall into more than one outcome
    for stage in ("sft", "rl"):
        c = single[stage]["counts"]
        kinds = {k: sum(c[k]) for k in ("correct", "refused", "malformed")}
        kinds["answered wrong"] = HELD_OUT - sum(kinds.values())
        assert sum(v > 0 for v in kinds.values()) >= 2, (stage, kinds)
