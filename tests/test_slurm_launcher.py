"""`--launcher slurm` against a real single-node SLURM (tests/slurm_cluster.py; `.ci/run` installs it): every stage a
job after its upstream stages' jobs, the table written by a last job and equal to `--launcher local`'s, `--status`,
a cancelled job resubmitted alone, and nothing half-written after a job is killed mid-stage.

The test cluster is a site's, not a textbook's (issue 34): a 30-minute default partition, `EnforcePartLimits`,
SLURM's default `MinJobAge`. Tests that only need jobs queued submit them held (`--slurm.extra --hold`: nothing
runs, nothing costs CPU) and cancel them at the end."""
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from protocols.engine import slurm_jobs as slurm
from protocols.w2s.protocol import main as run_protocol
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


def _slurm(*args) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True, timeout=30).stdout


def _jobs_named(prefix: str) -> dict[str, tuple[str, str]]:
    """{job id: (name, state)} of every job SLURM remembers whose name starts with `prefix` (`w2s:<out_dir name>:`)."""
    out = _slurm("squeue", "-h", "-t", "all", "-o", "%i|%j|%T")
    return {i: (n, st) for i, n, st in (line.split("|") for line in out.splitlines()) if n.startswith(prefix)}


def _cancel(prefix: str) -> None:
    ids = [i for i, (_, st) in _jobs_named(prefix).items() if st in slurm.IN_FLIGHT]
    if ids:
        subprocess.run(["scancel", *ids], check=False)


def _written_by_submission(out_dir) -> list[str]:
    """What a submission writes: logs/, the protocol snapshot, each job's script and record."""
    pats = ["logs", ".stages/protocol-*.json", "**/job.sh", "**/job.json"]
    return sorted(p for pat in pats for p in glob.glob(os.path.join(str(out_dir), pat), recursive=True))


def _shim(folder, name: str, body: str) -> None:
    """An executable `name` in `folder` (put first on PATH): a site's sbatch that refuses some jobs, a squeue that
    logs its calls. `$REAL` in `body` is the real binary."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(str(folder), name)
    with open(path, "w") as f:
        f.write("#!/bin/bash\n" + body.replace("$REAL", shutil.which(name)) + "\n")
    os.chmod(path, 0o755)


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


@pytest.fixture(scope="module")
def w2s_run(cluster, local_table, tmp_path_factory):
    """The tiny W2S protocol run under SLURM with the plain command (no --slurm.* flags: the default partition's own
    time limit) and waited for: (config path, config, status rows)."""
    cfg, _ = local_table
    tmp = tmp_path_factory.mktemp("w2s_slurm")
    cfg = dict(cfg, out_dir=str(tmp / "finished"))
    config = _write(tmp, cfg)
    return config, cfg, run_protocol(["--config", config, "--launcher", "slurm", "--wait"])


def test_w2s_under_slurm_writes_the_local_table(w2s_run, local_table):
    _, expected = local_table
    config, cfg, rows = w2s_run
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
    # no --slurm.time: each job got the default partition's limit (its MaxTime, 30 min), not a 4 h it refuses
    limits = _slurm("squeue", "-h", "-t", "all", "-o", "%l %P", "-j", ",".join(jobs.values())).split("\n")[:-1]
    assert limits == ["30:00 debug"] * 4


def test_a_time_limit_over_the_partition_max_is_refused_before_anything_is_submitted(cluster, local_table, tmp_path):
    """Issue 34 (1): the plain command fits a 30-min default partition (tested above and with the mixture here); a
    limit over MaxTime is refused naming the partition and its MaxTime, before anything is written or queued; a
    partition that allows it takes it."""
    from protocols.mixture import protocol as mixture

    cfg = dict(local_table[0], out_dir=str(tmp_path / "overlong"))
    config = _write(tmp_path, cfg)
    before = _jobs_named("")
    for flag in ("time", "collect_time"):
        with pytest.raises(RuntimeError) as err:
            run_protocol(["--config", config, "--launcher", "slurm", f"--slurm.{flag}=01:00:00"])
        assert f"--slurm.{flag} 01:00:00 is over the MaxTime of partition debug (00:30:00)" in str(err.value)
        assert "--slurm.partition (this cluster: debug 00:30:00, long 24:00:00)" in str(err.value)  # the way out
    assert _jobs_named("") == before and not os.path.exists(cfg["out_dir"])
    try:
        rows = run_protocol(["--config", config, "--launcher", "slurm", "--slurm.partition=long",
                             "--slurm.time=01:00:00", '--slurm.extra=["--hold"]'])
        ids = ",".join(r["job_id"] for r in rows if r["stage"] != "collect")
        assert _slurm("squeue", "-h", "-o", "%l %P", "-j", ids).split("\n")[:-1] == ["1:00:00 long"] * 3
        out = str(tmp_path / "mix-overlong")
        assert mixture.main(TINY_MIXTURE + ["--out", out, "--launcher", "slurm", "--slurm.extra=--hold"]) == 0
        held = _jobs_named("mixture:mix-overlong:two_policies:")
        assert len(held) == 5 and {st for _, st in held.values()} == {"PENDING"}
        assert set(_slurm("squeue", "-h", "-o", "%l", "-j", ",".join(held)).split()) == {"30:00"}
    finally:
        _cancel("w2s:overlong:")
        _cancel("mixture:mix-overlong:")


def test_a_submission_refused_partway_cancels_what_it_queued_and_leaves_no_files(cluster, local_table, tmp_path,
                                                                                 monkeypatch):
    """Issue 34 (2): a site refuses the last job (here a shim sbatch refusing the collecting job, as a QOS job limit
    would): the stage jobs this call queued are cancelled and it says so; its files go. Without sbatch on PATH, or
    with no controller to answer, nothing is written either."""
    cfg = dict(local_table[0], out_dir=str(tmp_path / "partway"))
    config = _write(tmp_path, cfg)
    shims = tmp_path / "bin"
    _shim(shims, "sbatch", 'for a in "$@"; do case "$a" in --job-name=*:collect) echo "sbatch: error: Batch job '
                           'submission failed: Job violates accounting/QOS policy" >&2; exit 1;; esac; done\n'
                           'exec $REAL "$@"')
    with monkeypatch.context() as m:
        m.setenv("PATH", f"{shims}:{os.environ['PATH']}")
        with pytest.raises(RuntimeError) as err:
            run_protocol(["--config", config, "--launcher", "slurm", '--slurm.extra=["--hold"]'])
    jobs = _jobs_named("w2s:partway:")
    assert sorted(n for n, _ in jobs.values()) == ["w2s:partway:seed0/confidence", "w2s:partway:seed0/naive",
                                                   "w2s:partway:seed0/teacher"]  # no collecting job
    assert {st for _, st in jobs.values()} == {"CANCELLED"}
    assert "violates accounting/QOS policy" in str(err.value)
    assert f"Cancelled the 3 job(s) this submission had queued (scancel {' '.join(sorted(jobs, key=int))})" \
        in str(err.value)
    assert _written_by_submission(cfg["out_dir"]) == []

    # sbatch missing where squeue / scontrol are: the first job's script was written, then taken back
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("squeue", "scontrol", "scancel"):
        os.symlink(shutil.which(name), tools / name)
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tools))
        with pytest.raises(RuntimeError, match="`sbatch` is not on PATH.*\n.*Nothing was submitted"):
            run_protocol(["--config", config, "--launcher", "slurm"])
    assert _written_by_submission(cfg["out_dir"]) == []

    # no controller answers: refused at once, before anything is written
    with monkeypatch.context() as m:
        m.setenv("SLURM_CONF", slurm_cluster.unreachable_conf(cluster))
        start = time.time()
        with pytest.raises(RuntimeError, match="SLURM could not be reached, nothing was submitted"):
            run_protocol(["--config", config, "--launcher", "slurm"])
        assert time.time() - start < slurm.QUERY_TIMEOUT_S + 10
    assert _written_by_submission(cfg["out_dir"]) == []


def _with_job_ids(out_dir, ids: dict[str, str], times: dict[str, float] | None) -> None:
    """Point the job records at other jobs; `times`: the records' times to keep (SLURM forgetting a job changes no
    file), None: written now."""
    for key, job_id in ids.items():
        path = os.path.join(out_dir, ".stages", key, "job.json")
        record = dict(json.load(open(path)), job_id=job_id)
        with open(path, "w") as f:
            json.dump(record, f)
        if times is not None:
            os.utime(path, (times[key], times[key]))


def test_a_finished_run_reads_done_after_slurm_forgets_its_jobs(w2s_run):
    """Issue 34 (3): once SLURM forgets the jobs (MinJobAge after their end) the finished stages and table still
    read as done. Forgetting is simulated honestly: the records are pointed at job ids SLURM never had, which SLURM
    answers exactly as it answers for a forgotten job (no state), and the records' times are kept. A collecting job
    still queued after the table was published reads queued (a newer table is coming); a collecting job submitted
    after the table, which ended without publishing, reads failed."""
    config, cfg, rows = w2s_run
    out, recorded = cfg["out_dir"], {r["stage"]: r["job_id"] for r in rows}
    never = {key: str(900000 + i) for i, key in enumerate(recorded)}
    times = {key: os.stat(os.path.join(out, ".stages", key, "job.json")).st_mtime for key in recorded}
    try:
        _with_job_ids(out, never, times)
        assert set(_states(run_protocol(["--config", config, "--status"])).values()) == {"done"}
        held = _slurm("sbatch", "--parsable", "--hold", "--job-name=w2s:finished:collect", "--wrap=true").strip()
        _with_job_ids(out, {"collect": held}, times)
        assert _states(run_protocol(["--config", config, "--status"]))["collect"] == "queued"
        subprocess.run(["scancel", held], check=True)
        _with_job_ids(out, {"collect": never["collect"]}, None)  # a newer job that published nothing
        state = _states(run_protocol(["--config", config, "--status"]))["collect"]
        assert state == f"failed (job {never['collect']} ended without a result; SLURM no longer remembers how)"
    finally:
        _with_job_ids(out, recorded, times)


def test_status_asks_slurm_once_and_says_plainly_when_it_cannot_be_reached(cluster, w2s_run, local_table, tmp_path,
                                                                          monkeypatch, capsys):
    """Issue 34 (4, 6): `--status` asks SLURM once for every job (it was a squeue, then an scontrol, per job, each
    retrying for a minute), answers within seconds when no controller listens, and says so instead of calling the
    jobs failed; what finished on disk stays done. A log is shown only when it exists (a job that never ran has
    none)."""
    config, cfg, _ = w2s_run
    calls = tmp_path / "calls.log"
    shims = tmp_path / "bin"
    for name in ("squeue", "scontrol", "sacct"):
        _shim(shims, name, f'echo "{name} $*" >> {calls}\nexec $REAL "$@"' if shutil.which(name) else "exit 1")
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    assert set(_states(run_protocol(["--config", config, "--status"])).values()) == {"done"}
    asked = calls.read_text().splitlines()
    assert len(asked) == 1 and asked[0].startswith("squeue -h -t all -o %i %T -j ")
    assert len(asked[0].split(" -j ")[1].split(",")) == 4  # every job of the run in that one call

    # a protocol whose teacher job was submitted (its log not written yet) and nothing finished
    waiting = dict(local_table[0], out_dir=str(tmp_path / "waiting"))
    waiting_config = _write(tmp_path, waiting, "waiting.yaml")
    os.makedirs(os.path.join(waiting["out_dir"], ".stages", "seed0", "teacher"))
    with open(os.path.join(waiting["out_dir"], ".stages", "seed0", "teacher", "job.json"), "w") as f:
        json.dump({"job_id": "1", "log": os.path.join(waiting["out_dir"], "logs", "seed0-teacher-1.out"),
                   "submitted": time.time()}, f)
    capsys.readouterr()
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.unreachable_conf(cluster))
    for path, finished in ((waiting_config, False), (config, True)):
        start = time.time()
        rows = run_protocol(["--config", path, "--status"])
        assert time.time() - start < slurm.QUERY_TIMEOUT_S + 5
        printed = capsys.readouterr().out
        if finished:  # on disk: done, whatever SLURM could say
            assert set(_states(rows).values()) == {"done"} and "SLURM unreachable" not in printed
            continue
        assert _states(rows) == {"seed0/teacher": "unknown (SLURM unreachable)", "seed0/naive": "not started",
                                 "seed0/confidence": "not started", "collect": "not started"}
        assert rows[0]["job_id"] == "1" and rows[0]["log"] is None  # submitted, never ran: no log to show
        assert "SLURM unreachable: the state of 1 job(s) is unknown (" in printed
        assert "Unable to contact slurm controller" in printed or "had no answer in" in printed


def test_resubmitting_while_jobs_wait_leaves_one_collecting_job(cluster, local_table, tmp_path):
    """Issue 34 (5): a second submission while jobs wait replaces the queued collecting job (scancel, then one after
    every job in flight and the new ones), so one collecting job stays, the recorded one; a stage added meanwhile
    is submitted alone and the new collecting job waits for it too. The mixture protocol shares the rule."""
    from protocols.mixture import protocol as mixture

    cfg = dict(local_table[0], out_dir=str(tmp_path / "resubmit"), methods=[{"name": "naive", "objective": "naive"}])
    hold = ["--launcher", "slurm", '--slurm.extra=["--hold"]']
    try:
        first = {r["stage"]: r["job_id"] for r in run_protocol(["--config", _write(tmp_path, cfg)] + hold)}
        again = {r["stage"]: r["job_id"] for r in run_protocol(["--config", _write(tmp_path, cfg)] + hold)}
        assert {k: v for k, v in again.items() if k != "collect"} == {k: v for k, v in first.items() if k != "collect"}
        jobs = _jobs_named("w2s:resubmit:")
        assert jobs[first["collect"]][1] == "CANCELLED" and jobs[again["collect"]][1] == "PENDING"
        cfg["methods"].append({"name": "confidence", "objective": "confidence"})  # a method added while jobs wait
        third = {r["stage"]: r["job_id"] for r in run_protocol(["--config", _write(tmp_path, cfg)] + hold)}
        assert third["seed0/teacher"] == first["seed0/teacher"] and third["seed0/naive"] == first["seed0/naive"]
        jobs = _jobs_named("w2s:resubmit:")
        in_flight = sorted(n for n, st in jobs.values() if st in slurm.IN_FLIGHT)
        assert in_flight == ["w2s:resubmit:collect", "w2s:resubmit:seed0/confidence", "w2s:resubmit:seed0/naive",
                             "w2s:resubmit:seed0/teacher"]
        dependency = _slurm("scontrol", "show", "job", third["collect"]).split("Dependency=")[1].split()[0]
        assert all(f"{third[k]}(unfulfilled)" in dependency for k in third if k != "collect")

        out = str(tmp_path / "mix-resubmit")
        for _ in range(2):
            assert mixture.main(TINY_MIXTURE + ["--out", out, "--launcher", "slurm", "--slurm.extra=--hold"]) == 0
        jobs = _jobs_named("mixture:mix-resubmit:")
        assert sorted(st for n, st in jobs.values() if n.endswith(":collect")) == ["CANCELLED", "PENDING"]
        assert len(jobs) == 4 + 2  # each seed's two stages once, two collecting jobs
    finally:
        _cancel("w2s:resubmit:")
        _cancel("mixture:mix-resubmit:")


def test_status_names_a_stage_a_rerun_would_refuse_as_changed(w2s_run):
    """Issue 34 (6): the status functions take the protocol's identity check as a hook (`changed`); a finished stage
    it reports reads "changed", not done."""
    from protocols.w2s import protocol as w2s
    from protocols.w2s.protocol import parse

    config, _, _ = w2s_run
    seen = []

    def changed(stage, result):
        seen.append((stage.name, result["identity"]["upstream"] != {}))
        return ["model.lr: 0.001 → 0.002"] if stage.name == "naive" else []

    states = _states(w2s.status(parse(["--config", config]), changed=changed))
    assert states["seed0/naive"] == ("changed (a rerun refuses it: model.lr: 0.001 → 0.002; --force seed0/naive "
                                     "reruns it)")
    assert states["seed0/teacher"] == states["seed0/confidence"] == "done"
    assert states["collect"] == "stale (seed0/naive changed since)"  # issue 49 (10): a table read a changed stage
    assert seen == [("teacher", False), ("naive", True), ("confidence", True)]


@pytest.mark.slow  # about 50 s of real jobs (make test-slow); the fast suite keeps the plain run and the refusals
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


@pytest.fixture(scope="module")
def mixture_runs(cluster, tmp_path_factory):
    """The tiny two-policy mixture over 2 seeds, locally and under SLURM (waited for): (local out, SLURM out)."""
    from protocols.mixture import protocol as mixture

    tmp = tmp_path_factory.mktemp("mixture")
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the jobs' thread count (cpus_per_task 1): the same arithmetic
    try:
        assert mixture.main(TINY_MIXTURE + ["--out", str(tmp / "local")]) == 0
        assert mixture.main(TINY_MIXTURE + ["--out", str(tmp / "slurm"), "--launcher", "slurm", "--wait"]) == 0
    finally:
        os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.update(OMP_NUM_THREADS=old)
    collected = json.load(open(tmp / "slurm" / "two_policies" / "tiny_results.json"))  # a rerun rewrites it locally
    return str(tmp / "local"), str(tmp / "slurm"), collected


@pytest.mark.slow  # the mixture's SLURM run (about 50 s): make test-slow; the W2S one stays fast
def test_two_policy_mixture_under_slurm_writes_the_local_tables(mixture_runs):
    from protocols.mixture import protocol as mixture

    local, out, _ = mixture_runs
    expected = _mixture_tables(local)
    assert expected["sft"]["records"]["0"]["sft"]["fidelity_mean"] > 0  # real numbers to compare
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


@pytest.mark.slow  # the mixture's SLURM run (about 50 s): make test-slow; the W2S one stays fast
def test_the_collected_mixture_report_names_the_submitting_command_and_the_run_time(mixture_runs, monkeypatch):
    """Issue 34 (6): the report the collecting job writes shows the submitting command (not `--collect`) and the
    time from submission to the table (not its own 0.0 min), and every report sums its stages' run times."""
    from protocols.mixture import protocol as mixture
    from protocols.mixture.stages import collected_run

    _, out, report = mixture_runs
    job = json.load(open(os.path.join(out, "two_policies", ".stages", "collect", "job.json")))
    assert "two_policies" in job["command"] and "--launcher slurm" in job["command"]
    assert "--collect" not in job["command"]
    exp = mixture.EXPERIMENTS["two_policies"]
    assert collected_run(os.path.join(out, exp.family)) is None  # not the collecting job: its own call's command
    monkeypatch.setenv("SLURM_JOB_ID", job["job_id"])
    command, wall = collected_run(os.path.join(out, exp.family))
    assert command == job["command"] and wall >= time.time() - job["submitted"] - 1
    runs = [r["wall_s"] for stage in report["stages"].values() for r in stage["records"].values()]
    assert len(runs) == 4 and report["stage_runs_s"] == pytest.approx(sum(runs), abs=0.1) and min(runs) > 0
    # the collecting job's report (mixture.py's --collect path calls collected_run)
    assert report["command"] == job["command"] and report["wall_s"] >= max(runs)


def mixture_cluster_status(out) -> list[dict]:
    from protocols.mixture import protocol as mixture
    from protocols.engine.status import stage_rows
    from protocols.mixture.stages import MixtureHooks

    exp = mixture.EXPERIMENTS["two_policies"]
    hooks = MixtureHooks("two_policies", exp, mixture._selected(exp, ["two_policies_rl_A"]), [0, 1], out,
                         {"sft": [], "rl": []}, 1, None, "tiny", "")
    return stage_rows(hooks.specs(), hooks)


@pytest.mark.slow  # about 50 s: a local 2-process DDP run and the same under srun (make test-slow)
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


def test_no_time_limit_is_asked_unless_given_and_limits_parse_as_slurm_reads_them():
    """Issue 34 (1), without a cluster: the jobs ask no --time of their own (a fixed 4 h was refused by partitions
    with a shorter MaxTime); a limit given is checked for SLURM's formats at once, naming its flag."""
    inf = float("inf")
    assert [slurm.minutes(t) for t in ("30", "5:30", "00:20:00", "2-3", "1-00:00:00", "UNLIMITED")] == \
        [30, 5.5, 20, 3060, 1440, inf]
    assert slurm.minutes("4h") is None
    opts = slurm.SlurmOptions()
    assert [f for f in opts.sbatch_flags() + opts.sbatch_flags(collect=True) if f.startswith("--time")] == []
    assert slurm.SlurmOptions(time="00:20:00", collect_time="5").sbatch_flags()[0] == "--time=00:20:00"
    assert slurm.SlurmOptions(time="00:20:00", collect_time="5").sbatch_flags(collect=True)[0] == "--time=5"
    with pytest.raises(ValueError, match="--slurm.collect_time '1h' is no SLURM time limit"):
        slurm.SlurmOptions(collect_time="1h")
    assert slurm.dependency_flags({"afterok": ["1", "2"], "afterany": ["3"]}) == [
        "--dependency=afterok:1:2,afterany:3", "--kill-on-invalid-dep=yes"]
    assert slurm.dependency_flags({"afterok": [], "afterany": []}) == []
