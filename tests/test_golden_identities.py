"""Every stage identity of every shipped protocol, pinned (issue 35): a refactor of the orchestration must leave
each stage's identity as it was, or every finished run on a user's disk would read as changed and be refused.

The digests in tests/fixtures/golden_identities.json were computed before the stage engine was written. An identity
holds absolute paths (the repository, the installed MiniLM package, a temporary question folder); they are replaced
by placeholders first, so the digests are the same on every machine. Upstream stages enter by name (their digests
and run ids are values of a run, not of the configuration).

Regenerate (only for a change that is *meant* to change identities, and say so in the commit):
    SHIFTGEN_WRITE_GOLDEN=1 python -m pytest -m slow tests/test_golden_identities.py
The fast suite checks a sample (`FAST_W2S` and every mixture experiment, first seed); `make test-slow` all.
"""
import glob
import json
import os
import re
import site
import sys

import pytest

from protocols.engine.stage_identity import digest, resolve_cli_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "golden_identities.json")
W2S_CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs/experiment/*.yaml"))
                     + [p for p in glob.glob(os.path.join(ROOT, "configs/experiment/paper/*.yaml"))
                        if not p.endswith("grid.yaml")])


def _placeholders(text: str, extra: dict[str, str]) -> str:
    prefixes = {**extra, ROOT: "<repo>", sys.prefix: "<venv>"}
    for path in site.getsitepackages() + [site.getusersitepackages()]:
        prefixes[path] = "<site-packages>"
    for prefix, name in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(prefix, name)
    return text


# Options added to the code after the pin (issue 36). The engine reads a finished stage whose recorded config lacks
# such a key, and whose current value is the code's declared default, as the same stage (`added_at_default`); the
# pin does the same, and only for these keys: any other key, or one of these set to another value, still changes it.
ADDED_SINCE_PIN = {
    "model.init_args.bsr_coef", "model.init_args.grm_coef", "model.init_args.grm_form", "model.init_args.grm_beta",
    "model.init_args.grm_logp_reduction", "model.init_args.objective.init_args.label_temperature",
    "model.init_args.objective.init_args.label_smoothing",
    "data.init_args.extra_teacher_checkpoints", "data.init_args.label_teacher",  # multi-teacher W2S
}
# Options added after the pin to one kind of model only: the reward model had `lora` at the pin (its pinned
# digests hold `lora: null`), the policies got it later (issue 52 item 4).
ADDED_SINCE_PIN_TO = {"model.init_args.lora": "lightning_modules.policy."}


# Stage identities changed on purpose since the pin (the fixture holds their new digests), and why.
CHANGED_BY_DESIGN = {
    "one fit per trajectory (issue 51 item 5)": (
        "a method that reads another's fit (`trajectory`: naive reads early_stop, anchor@λ anchor_early_stop@λ): its "
        "stages evaluate that fit's final weights, so their identity is the source's configuration, checkpoint "
        "'last', the source stage upstream and `trajectory`; and the stages that evaluate or average such a row's "
        "checkpoints (WiSE-FT `from_method`, a weight-averaging `ensemble` led by it), whose model options are now "
        "the fit's (the source method's, with its --trainer.val_check_interval)"),
}


def changed_by_design(p) -> set[str]:
    """The methods whose stages `CHANGED_BY_DESIGN` names, as the code plans them (`stages.fitted`)."""
    readers = {m.name for m in p.methods if m.trajectory}
    return readers | {m.name for m in p.methods if m.from_method in readers
                      or (m.ensemble or {}).get("by") == "weights" and m.ensemble["of"][0] in readers}


def _without_added_defaults(identity: dict) -> dict:
    from protocols.engine.stage_identity import declared_default

    config = identity.get("config")
    if not isinstance(config, dict):
        return identity
    model = str(config.get("model.class_path", ""))
    added = ADDED_SINCE_PIN | {k for k, prefix in ADDED_SINCE_PIN_TO.items() if model.startswith(prefix)}
    drop = {k for k in added & set(config)
            if json.loads(json.dumps(declared_default(k, config), default=str)) == config[k]}
    return {**identity, "config": {k: v for k, v in config.items() if k not in drop}}


def _normalised_digest(identity: dict, extra: dict[str, str] = {}) -> str:
    identity = _without_added_defaults(identity)
    return digest(json.loads(_placeholders(json.dumps(identity, sort_keys=True, default=str), extra)))


def clean_checkout_view(tmp: str) -> str:
    """A folder that shows the repository as a fresh clone does: a link to each top-level entry git tracks, and
    nothing else. The configs name their files relative to the repository, and a stage's identity hashes the files
    behind its data options, so the pin must not depend on what a machine has written into ignored folders (e.g.
    the advice benchmark's `runs/bench/advice`, present on one machine and absent on another)."""
    import subprocess

    view = os.path.join(tmp, "checkout")
    if os.path.isdir(view):
        return view
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    os.makedirs(view)
    for name in sorted({f.split("/", 1)[0] for f in tracked.decode().split("\0") if f}):
        if os.path.exists(os.path.join(ROOT, name)):
            os.symlink(os.path.join(ROOT, name), os.path.join(view, name))
    return view


def w2s_identities(path: str, tmp: str, first_seed_only: bool = False) -> dict[str, str]:
    """`seed<k>/<stage>` -> digest of the stage's identity (upstream stages by name) for one W2S config, as a fresh
    clone computes it (`clean_checkout_view`)."""
    from protocols.w2s.protocol import parse
    from protocols.w2s.stages import identity_of, plan_stages, stage_key

    view = clean_checkout_view(tmp)
    cwd = os.getcwd()
    os.chdir(view)  # the configs name their files relative to the repository
    try:
        p = parse(["--config", path])
        out = {}
        for stage in plan_stages(p):
            if first_seed_only and stage.seed != p.seeds[0]:
                continue
            stage.config = resolve_cli_config(stage.args + stage.location_args("fit"))
            upstream = {name: {"identity": "<upstream>", "run": "<run>"} for name in stage.upstream}
            out[stage_key(stage)] = _normalised_digest(identity_of(stage, upstream),
                                                       {p.out_dir: "<out_dir>", view: "<repo>"})
        return out
    finally:
        os.chdir(cwd)


def mixture_identities(name: str, tmp: str, seeds=(0, 1, 2)) -> dict[str, str]:
    """`seed_<k>/<stage>` -> digest of each stage's identity for one mixture experiment."""
    from protocols.mixture.protocol import EXPERIMENTS, identity_of, stage_args

    exp = EXPERIMENTS[name]
    question_dirs = None
    if exp.question_fixtures:
        from datamodules.triggers.question_fixtures import write_question_fixtures

        question_dirs = write_question_fixtures(os.path.join(tmp, exp.family, "questions"))
    out = {}
    for seed in seeds:
        for stage in exp.stages:
            args = stage_args(stage, seed, [], question_dirs)
            upstream = "<upstream run>" if stage.start else None
            identity, _ = identity_of(stage, args, upstream, tmp)
            out[f"seed_{seed}/{stage.name}"] = _normalised_digest(identity, {tmp: "<tmp>"})
    return out


# The fast pin's sample (about 0.3 s of parsing per stage): the demo, the 5-seed comparison's grid (every method
# kind: sweeps, from_method, checkpoint choices, the teacher search), a paper config (hub ids), and every mixture
# family.
FAST_W2S = ["configs/experiment/w2s_demo.yaml", "configs/experiment/w2s_baselines.yaml",
            "configs/experiment/paper/qwen_hh_helpful.yaml"]


def all_identities(tmp: str, fast: bool = False) -> dict[str, dict[str, str]]:
    from protocols.mixture.protocol import EXPERIMENTS

    configs = [os.path.join(ROOT, c) for c in FAST_W2S] if fast else W2S_CONFIGS
    out = {f"w2s:{os.path.relpath(p, ROOT)}": w2s_identities(p, tmp, first_seed_only=fast) for p in configs}
    seeds = (0,) if fast else (0, 1, 2)
    out.update({f"mixture:{name}": mixture_identities(name, tmp, seeds) for name in sorted(EXPERIMENTS)})
    return out


def _compare(measured: dict, golden: dict, subset: bool) -> None:
    assert sorted(measured) == sorted(golden) or subset, "protocols added or removed: regenerate on purpose"
    changed = {f"{proto} {key}" for proto in measured for key in measured[proto].keys() | (
        set() if subset else golden[proto].keys()) if golden[proto].get(key) != measured[proto].get(key)}
    assert not changed, f"{len(changed)} stage identities changed, e.g. {sorted(changed)[:5]}"


def test_a_sample_of_shipped_protocols_keeps_its_stage_identities(tmp_path):
    """The fast pin: the first seed of `FAST_W2S` and of every mixture experiment (the other seeds differ by their
    seed only); `make test-slow` checks every stage of every protocol."""
    measured = all_identities(str(tmp_path), fast=True)
    _compare(measured, json.load(open(GOLDEN, encoding="utf-8")), subset=True)
    assert sum(len(v) for v in measured.values()) > 50


@pytest.mark.slow
def test_every_shipped_stage_keeps_its_identity(tmp_path):
    measured = all_identities(str(tmp_path))
    if os.environ.get("SHIFTGEN_WRITE_GOLDEN"):
        with open(GOLDEN, "w", encoding="utf-8") as f:
            json.dump(measured, f, indent=1, sort_keys=True)
            f.write("\n")
        pytest.skip(f"wrote {GOLDEN}")
    golden = json.load(open(GOLDEN, encoding="utf-8"))
    _compare(measured, golden, subset=False)
    assert sum(len(v) for v in golden.values()) > 600  # the pin covers the shipped grid, not a handful of stages


def test_only_the_options_added_since_the_pin_and_only_at_their_default_are_left_out():
    base = {"config": {"model.init_args.class_path": "x", "model.class_path":
                       "lightning_modules.reward.reward_model.RewardModelModule", "model.init_args.anchor_coef": 0.0}}
    at_default = {"config": {**base["config"], "model.init_args.bsr_coef": 0.0, "model.init_args.grm_form": "sft"}}
    assert _normalised_digest(at_default) == _normalised_digest(base)
    assert _normalised_digest({"config": {**at_default["config"], "model.init_args.bsr_coef": 0.001}}) != \
        _normalised_digest(base)
    assert _normalised_digest({"config": {**base["config"], "model.init_args.new_option": 0.0}}) != \
        _normalised_digest(base)
    # `lora` is new to the policies only: left out of a policy's config at its default, kept in a reward model's
    assert _normalised_digest({"config": {**base["config"], "model.init_args.lora": None}}) != _normalised_digest(base)
    policy = {"config": {"model.class_path": "lightning_modules.policy.rl.PolicyRLModule", "model.init_args.lr": 1.0}}
    assert _normalised_digest({"config": {**policy["config"], "model.init_args.lora": None}}) == \
        _normalised_digest(policy)


def test_placeholders_make_the_digest_independent_of_where_the_repository_lies():
    identity = {"data": {"files": {os.path.join(ROOT, "tokenizer/vocab.json"): "12 bytes sha256:ab"}}}
    moved = {"data": {"files": {"/elsewhere/tokenizer/vocab.json": "12 bytes sha256:ab"}}}
    assert _normalised_digest(identity) != digest(identity)
    assert _normalised_digest(identity) == digest(json.loads(re.sub("/elsewhere", "<repo>", json.dumps(moved))))


def test_the_stages_changed_by_design_are_the_readers_and_what_evaluates_them():
    from protocols.w2s.protocol import parse

    demo = parse(["--config", os.path.join(ROOT, "configs/experiment/w2s_demo.yaml")])
    assert changed_by_design(demo) == {"naive", "anchor", "wise_ft"}
    baselines = parse(["--config", os.path.join(ROOT, "configs/experiment/w2s_baselines.yaml")])
    assert changed_by_design(baselines) == {"naive", "anchor", "wise_ft", "anchor_wise_ft"}
