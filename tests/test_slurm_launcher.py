"""`--launcher slurm` against a real single-node SLURM (tests/slurm_cluster.py; `.ci/run` installs it): every stage a
job after its upstream stages' jobs, the table written by a last job and equal to `--launcher local`'s, `--status`,
a cancelled job resubmitted alone, and nothing half-written after a job is killed mid-stage."""
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from protocols import slurm
from protocols.w2s import main as run_protocol
from tests import slurm_cluster
from tests.test_w2s_protocol import _tiny_protocol, _write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.available()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM launcher tests: {why}")
        pytest.skip(why)
    folder = tempfile.mkdtemp(prefix="slurm-")  # under /tmp: munged wants every parent o+x (pytest's are 0700)
    env = slurm_cluster.up(folder)
    old = os.environ.get("SLURM_CONF")
    os.environ.update(env)
    yield folder
    slurm_cluster.down(folder)
    shutil.rmtree(folder, ignore_errors=True)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def _table(out) -> tuple[str, str]:
    rows = json.load(open(os.path.join(out, "results.json")))["rows"]
    return json.dumps(rows, sort_keys=True), open(os.path.join(out, "results.md")).read()


@pytest.fixture(scope="module")
def local_table(tmp_path_factory, word_tokenizer_dir):
    tmp = tmp_path_factory.mktemp("local")
    cfg = _tiny_protocol(tmp, word_tokenizer_dir, str(tmp / "cache"), methods=[
        {"name": "naive", "objective": "naive"}, {"name": "confidence", "objective": "confidence"}])
    run_protocol(["--config", _write(tmp, cfg)])
    return cfg, _table(cfg["out_dir"])


def _states(rows) -> dict[str, str]:
    return {r["stage"]: r["state"] for r in rows}


def test_w2s_under_slurm_writes_the_local_table(cluster, local_table, tmp_path):
    cfg, expected = local_table
    cfg = dict(cfg, out_dir=str(tmp_path / "run"))
    config = _write(tmp_path, cfg)
    rows = run_protocol(["--config", config, "--launcher", "slurm", "--wait"])
    assert _states(rows) == {"seed0/teacher": "done", "seed0/naive": "done", "seed0/confidence": "done",
                             "collect": "done"}
    out = cfg["out_dir"]
    assert _table(out) == expected
    jobs = {r["stage"]: r["job_id"] for r in rows}
    assert len(set(jobs.values())) == 4 and all(os.path.isfile(r["log"]) for r in rows)
    # dependencies: the students waited for the teacher, the table for every stage
    script = open(os.path.join(out, ".stages", "seed0", "naive", "job.sh")).read()
    assert "srun" in script and "--stage seed0/naive" in script
    # the job ran the stage itself: its commands and result are the stage's own
    assert json.load(open(os.path.join(out, "seed0", "naive", "result.json")))["identity"]["upstream"]["teacher"]
    # everything finished: a rerun submits nothing and writes the same table at once
    again = run_protocol(["--config", config, "--launcher", "slurm"])
    assert {r["stage"]: r["job_id"] for r in again} == jobs and _table(out) == expected
    status = run_protocol(["--config", config, "--status"])
    assert _states(status) == _states(rows)


def test_cancelled_job_is_resubmitted_alone_and_leaves_nothing_half_written(cluster, local_table, tmp_path):
    cfg, expected = local_table
    cfg = dict(cfg, out_dir=str(tmp_path / "run"))
    config = _write(tmp_path, cfg)
    rows = run_protocol(["--config", config, "--launcher", "slurm"])
    jobs = {r["stage"]: r["job_id"] for r in rows}
    assert _states(rows)["seed0/teacher"] in ("queued", "running")
    assert _states(rows)["seed0/naive"] == _states(rows)["collect"] == "queued"
    # let the teacher finish, then kill the naive student mid-fit (scancel: SIGTERM, then SIGKILL)
    slurm.wait_for([jobs["seed0/teacher"]])
    log = os.path.join(cfg["out_dir"], "logs", f"seed0-naive-{jobs['seed0/naive']}.out")
    deadline = time.time() + 300
    while not (os.path.isfile(log) and "Epoch" in open(log, errors="replace").read() + _progress(cfg, "naive")):
        assert time.time() < deadline, "the naive job never started training"
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=KILL", jobs["seed0/naive"]], check=True)
    states = slurm.wait_for(list(jobs.values()))
    assert states[jobs["seed0/teacher"]] == "COMPLETED" and states[jobs["seed0/naive"]] in ("CANCELLED", "FAILED")
    status = _states(run_protocol(["--config", config, "--status"]))
    assert status["seed0/teacher"] == "done" and status["seed0/naive"].startswith("failed (")
    assert status["collect"].startswith("failed (")
    naive = os.path.join(cfg["out_dir"], "seed0", "naive")
    assert not os.path.exists(os.path.join(naive, "result.json"))  # never a finished stage
    for ckpt in glob.glob(os.path.join(naive, "**", "*.ckpt"), recursive=True):  # every checkpoint complete
        from lightning_modules.checkpoint_checks import verify_archive

        verify_archive(ckpt, "test")

    # a rerun resubmits only what is not done (the teacher is reused), and the table equals the local one
    rows = run_protocol(["--config", config, "--launcher", "slurm", "--wait"])
    new_jobs = {r["stage"]: r["job_id"] for r in rows}
    assert new_jobs["seed0/teacher"] == jobs["seed0/teacher"]
    assert all(new_jobs[k] != jobs[k] for k in ("seed0/naive", "collect"))
    assert set(_states(rows).values()) == {"done"} and _table(cfg["out_dir"]) == expected


def _progress(cfg, stage) -> str:
    """Any sign that the stage's fit began (its TensorBoard folder): the log may be buffered."""
    return "Epoch" if glob.glob(os.path.join(cfg["out_dir"], "seed0", stage, "fit", "events.*")) else ""


TINY_MIXTURE = ["two_policies", "--stages", "two_policies_rl_A", "--seeds", "0", "1",
                "--sft-set=--trainer.max_steps=6", "--sft-set=--data.num_train=512",
                "--sft-set=--data.num_val_per_distribution=8", "--sft-set=--model.fidelity_prompts_per_distribution=4",
                "--sft-set=--trainer.val_check_interval=3", "--set=--model.min_sft_fidelity=0",
                "--set=--trainer.max_steps=2", "--set=--data.num_val_per_distribution=8",
                "--set=--trainer.val_check_interval=1", "--set=--data.num_train=64", "--report", "tiny"]


def _mixture_tables(out) -> dict:
    """What the report says of each stage and seed, without wall times and paths."""
    report = json.load(open(os.path.join(out, "two_policies", "tiny_results.json")))
    return {name: {"summary": stage.get("summary"),
                   "records": {s: {k: r.get(k) for k in ("status", "sft", "error")}
                               for s, r in stage["records"].items()}}
            for name, stage in report["stages"].items()}


def test_two_policy_mixture_under_slurm_writes_the_local_tables(cluster, tmp_path, monkeypatch):
    from protocols import mixture

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the jobs' thread count (cpus_per_task 1): the same arithmetic
    assert mixture.main(TINY_MIXTURE + ["--out", str(tmp_path / "local")]) == 0
    expected = _mixture_tables(tmp_path / "local")
    assert expected["sft"]["records"]["0"]["sft"]["fidelity_mean"] > 0  # real numbers to compare

    out = str(tmp_path / "slurm")
    assert mixture.main(TINY_MIXTURE + ["--out", out, "--launcher", "slurm", "--wait"]) == 0
    assert _mixture_tables(out) == expected
    status = {r["stage"]: r for r in mixture_cluster_status(out)}
    assert {k: v["state"] for k, v in status.items()} == {
        "seed_0/sft": "done", "seed_0/two_policies_rl_A": "done", "seed_1/sft": "done",
        "seed_1/two_policies_rl_A": "done", "collect": "done"}
    assert len({v["job_id"] for v in status.values()}) == 5
    # everything finished: a rerun submits nothing and writes the same report at once
    assert mixture.main(TINY_MIXTURE + ["--out", out, "--launcher", "slurm"]) == 0
    assert {r["stage"]: r["job_id"] for r in mixture_cluster_status(out)} == {k: v["job_id"] for k, v in status.items()}
    assert _mixture_tables(out) == expected


def mixture_cluster_status(out) -> list[dict]:
    from protocols import mixture, mixture_cluster

    exp = mixture.EXPERIMENTS["two_policies"]
    return mixture_cluster.status(exp, mixture._selected(exp, ["two_policies_rl_A"]), [0, 1], out, "tiny")


def test_a_stage_spanning_two_tasks_runs_lightning_ddp_from_slurm_and_equals_local_ddp(cluster, tmp_path,
                                                                                       word_tokenizer_dir):
    """`--slurm.ntasks_per_node 2`: each stage job runs 2 processes under srun, which Lightning joins into one DDP
    group from SLURM's environment (no launcher of ours); the table equals a local 2-process DDP run's, and both
    keep the exact metrics the DDP tests assert."""
    import sys

    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"), extra_args=ddp)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "SLURM_CONF")}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "ddp_protocol_script.py"), str(tmp_path),
                           "--config", _write(tmp_path, cfg)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = _table(cfg["out_dir"])

    on_slurm = dict(cfg, out_dir=str(tmp_path / "slurm"))
    for key in ("teacher_args", "student_args"):  # the launcher gives the trainer its processes
        on_slurm[key] = [a for a in cfg[key] if a not in ddp] + ["--trainer.accelerator=cpu"]
    rows = run_protocol(["--config", _write(tmp_path, on_slurm, "slurm.yaml"), "--launcher", "slurm", "--wait",
                         "--slurm.ntasks_per_node=2"])
    assert set(_states(rows).values()) == {"done"}
    assert _table(on_slurm["out_dir"]) == expected
    log = open(rows[0]["log"]).read()
    assert "GLOBAL_RANK: 1" in log or "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in log
