"""Issue 49, items 1-2: a signal never looks like success and a killed protocol leaves no live child.

- SIGTERM / SIGINT during a W2S stage (what SLURM sends on preemption or time-out, what `timeout` and Ctrl-C send)
  end the run non-zero with one line naming the stage and saying a rerun resumes; nothing is published; the rerun
  reuses the finished teacher and publishes the table.
- The engine on a protocol made up here (no model: each stage's child is a sleeping Python), in a process of its own:
  SIGKILL of the protocol kills its stage's child at once (the parent-death signal); where that signal is missing,
  the child holds its stage's lock, so `--status` shows it running and a rerun is refused until it ends; a rerun
  afterwards runs the stage once. SIGTERM of a protocol running two stages at once kills both children and names
  both stages.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from protocols.engine.status import lock_holder
from tests.test_w2s_protocol import ROOT, _tiny_protocol, _write

ENV = dict(os.environ, PYTHONPATH=ROOT)

W2S_SIGNALLED = r"""
import os, signal, sys
sys.path.insert(0, {root!r})
import protocols.w2s.fit as fit
from lightning_modules.reward.reward_model import RewardModelModule

state = {{"stage": None, "steps": 0}}
run_stage = fit.run_stage

def tracked(stage, *args, **kwargs):
    state["stage"] = stage.name
    return run_stage(stage, *args, **kwargs)

training_step = RewardModelModule.training_step

def step(self, *args, **kwargs):  # the signal arrives inside Lightning's fit of the student
    if state["stage"] == "naive":
        state["steps"] += 1
        if state["steps"] == 2:
            os.kill(os.getpid(), signal.{signal})
    return training_step(self, *args, **kwargs)

fit.run_stage = tracked
import protocols.w2s.protocol as w2s
w2s.run_stage = tracked
RewardModelModule.training_step = step
from protocols.engine.refusals import run_main
sys.argv = ["w2s", "--config", {config!r}]
run_main(w2s.main)
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_during_a_w2s_stage_exits_non_zero_naming_it_and_the_rerun_resumes(
        tmp_path, word_tokenizer_dir, cache_dir, signame):
    from protocols.w2s.protocol import main as run_protocol

    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir)
    config = _write(tmp_path, cfg)
    script = W2S_SIGNALLED.format(root=ROOT, signal=signame, config=config)
    child = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=600)
    out = cfg["out_dir"]
    # Lightning alone made it exit 0 (SIGTERM); now the shell's code for a death by that signal, 128 + its number
    assert child.returncode == 128 + getattr(signal, signame), child.stderr[-2000:]
    errors = [line for line in child.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: seed0/naive was interrupted by {signame} before it finished; nothing was published. "
                      "Rerun the same command to resume: finished stages are reused, the interrupted ones run "
                      "again"], child.stderr[-3000:]
    assert "Traceback" not in child.stderr
    assert os.path.isfile(os.path.join(out, "seed0", "teacher", "result.json"))  # finished before the signal
    assert not os.path.exists(os.path.join(out, "seed0", "naive", "result.json"))
    assert not os.path.lexists(os.path.join(out, "results.md")) and not os.path.exists(os.path.join(out, "results"))
    assert lock_holder(os.path.join(out, ".stages", "seed0", "naive")) is None
    if signame == "SIGTERM":  # the rerun: the teacher is reused, naive runs, the table is published
        teacher_run = json.load(open(os.path.join(out, "seed0", "teacher", "result.json")))["run"]
        results = run_protocol(["--config", config])
        assert list(results["rows"]) == ["teacher", "naive"]
        assert json.load(open(os.path.join(out, "seed0", "teacher", "result.json")))["run"] == teacher_run
        assert os.path.isfile(os.path.join(out, "results.md"))


# ---- the engine on a protocol made up here: each stage's child sleeps ------------------------------------------
FAKE_PROTOCOL = r"""
import json, os, sys
sys.path.insert(0, {root!r})
from protocols.engine import children, local
from protocols.engine.spec import StageSpec
from protocols.engine.stage_identity import ForceSpec

ROOT_DIR, SLEEP, WORKERS, PDEATHSIG = {folder!r}, float(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if not PDEATHSIG:  # a system without the parent-death signal: only the lock the child holds keeps the stage
    children._die_with = lambda parent: None


class Hooks:
    root, label, collect_after = ROOT_DIR, "fake", "afterany"

    def where(self, spec): return os.path.join(ROOT_DIR, spec.key)
    def result_file(self, spec): return os.path.join(ROOT_DIR, spec.key, "result.json")
    def finished(self, spec):
        try:
            return json.load(open(self.result_file(spec)))
        except OSError:
            return None
    def recorded(self, spec): return self.finished(spec)
    def missing(self, spec): return None
    def blocked(self, spec, upstream): return None
    def identity(self, spec, upstream): return {{"config": spec.name}}
    def changes(self, spec, finished, identity): return []
    def reuse(self, spec, finished, identity): return finished
    def log_of(self, spec): return None
    def table_state(self): return os.path.join(ROOT_DIR, "table.json"), ""

    def run(self, spec, upstream, identity, forced):
        os.makedirs(self.where(spec), exist_ok=True)
        code = ("import os, sys, time; open(sys.argv[1], 'a').write(str(os.getpid()) + '\\n'); "
                "time.sleep(float(sys.argv[2]))")
        rc = children.run([sys.executable, "-c", code, os.path.join(ROOT_DIR, spec.key.replace("/", "_") + ".starts"),
                           str(SLEEP)])
        result = {{"status": "done" if rc == 0 else "failed", "rc": rc, "run": str(os.getpid())}}
        if rc == 0:
            json.dump(result, open(self.result_file(spec), "w"))
        return result


def specs():
    return [StageSpec(f"seed0/{{n}}", 0, n) for n in ("a", "b")[:WORKERS]]


def main(argv):
    results = local.run_local(specs(), Hooks(), ForceSpec(None), workers=WORKERS)
    print("done", sorted(results), flush=True)


if __name__ == "__main__":
    from protocols.engine.refusals import run_main
    run_main(main)
"""


def _fake(tmp_path) -> str:
    path = tmp_path / "fake_protocol.py"
    path.write_text(FAKE_PROTOCOL.format(root=ROOT, folder=str(tmp_path / "run")))
    return str(path)


def _start(script, sleep, workers=1, pdeathsig=True) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, script, str(sleep), str(workers), "1" if pdeathsig else "0"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(condition, seconds=60.0, what="") -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _child_of(tmp_path, key="seed0/a") -> int:
    """The stage's child, as its lock file names it (what --status shows)."""
    lock = tmp_path / "run" / ".stages" / key / ".lock"
    _wait_for(lambda: lock.is_file() and "child" in (lock.read_text() or "{}"), what=f"{key}'s child")
    return json.loads(lock.read_text())["child"]


def _status(tmp_path, workers=1) -> dict[str, str]:
    """`--status` rows of the made-up protocol, from this process (the engine's `stage_rows`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_protocol", str(tmp_path / "fake_protocol.py"))
    module = importlib.util.module_from_spec(spec)
    argv, sys.argv = sys.argv, ["fake", "1", str(workers), "1"]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    from protocols.engine.status import stage_rows

    return {r["stage"]: r["state"] for r in stage_rows(module.specs(), module.Hooks())}


def _starts(tmp_path, key="seed0_a") -> list[str]:
    path = tmp_path / "run" / f"{key}.starts"
    return path.read_text().split() if path.exists() else []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_sigkill_of_the_protocol_kills_its_stage_child_and_the_rerun_runs_the_stage_once(tmp_path):
    script = _fake(tmp_path)
    parent = _start(script, sleep=120)
    child = _child_of(tmp_path)
    _wait_for(lambda: _starts(tmp_path) == [str(child)], what="the child to start its work")
    assert _alive(child)
    assert _status(tmp_path)["seed0/a"] == f"running (PID {parent.pid} on {os.uname().nodename}, its fit PID {child})"
    parent.kill()
    parent.wait()
    _wait_for(lambda: not _alive(child), seconds=10, what="the child to die with its parent")
    assert lock_holder(str(tmp_path / "run" / ".stages" / "seed0" / "a")) is None
    assert _status(tmp_path)["seed0/a"] == "not started"

    rerun = _start(script, sleep=0.2)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-2000:]
    assert "done ['seed0/a']" in out and len(_starts(tmp_path)) == 2  # the killed child's start, then one more
    assert json.load(open(tmp_path / "run" / "seed0" / "a" / "result.json"))["status"] == "done"


def test_a_child_that_outlives_its_protocol_holds_its_stage(tmp_path):
    """Without the parent-death signal (another OS): the orphaned child still holds the stage's lock, so `--status`
    shows it running and a rerun is refused, naming it, instead of starting a second fit beside it."""
    script = _fake(tmp_path)
    parent = _start(script, sleep=120, pdeathsig=False)
    child = _child_of(tmp_path)
    _wait_for(lambda: _starts(tmp_path) == [str(child)], what="the child to start its work")
    parent.kill()
    parent.wait()
    try:
        time.sleep(0.5)
        assert _alive(child)
        assert _status(tmp_path)["seed0/a"].endswith(f"its fit PID {child})")
        rerun = _start(script, sleep=0.2)
        _, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 2 and "is in use by another stage" in err and f"PID {parent.pid}" in err, err
        assert _starts(tmp_path) == [str(child)]  # no second fit started
    finally:
        os.kill(child, signal.SIGKILL)
    _wait_for(lambda: not _alive(child), seconds=10, what="the child to end")
    rerun = _start(script, sleep=0.2)
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err[-2000:]
    assert len(_starts(tmp_path)) == 2


def test_sigterm_of_a_protocol_running_two_stages_kills_both_children_and_names_both(tmp_path):
    script = _fake(tmp_path)
    parent = _start(script, sleep=120, workers=2)
    children = [_child_of(tmp_path, "seed0/a"), _child_of(tmp_path, "seed0/b")]
    parent.send_signal(signal.SIGTERM)
    out, err = parent.communicate(timeout=60)
    assert parent.returncode == 143, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [(
        "error: seed0/a, seed0/b were interrupted by SIGTERM before they finished; nothing "
                                   "was published. Rerun the same command to resume: finished stages are reused, the "
                                   "interrupted ones run again")], err
    assert "done" not in out
    _wait_for(lambda: not any(_alive(c) for c in children), seconds=10, what="the children to be killed")
    assert not os.path.exists(tmp_path / "run" / "seed0" / "a" / "result.json")
    assert lock_holder(str(tmp_path / "run" / ".stages" / "seed0" / "a")) is None


# ---- the real mixture: SIGKILL mid-stage, then the rerun --------------------------------------------------------
TINY_SFT = ["--sft-set=--trainer.max_steps=2", "--sft-set=--trainer.val_check_interval=1",
            "--sft-set=--data.num_train=128", "--sft-set=--data.batch_size=16",
            "--sft-set=--data.num_val_per_distribution=4", "--sft-set=--model.fidelity_prompts_per_distribution=2"]


@pytest.mark.slow  # two real `cli.py fit` children (about 2 min on busy cores): make test-slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_sigkilled_mixture_leaves_no_live_child_and_the_rerun_completes_the_stage_once(tmp_path):
    out = str(tmp_path / "mix")
    command = [sys.executable, "-m", "protocols.mixture", "two_policies", "--seeds", "0", "--out", out,
               "--stages", "sft", *TINY_SFT]
    parent = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = os.path.join(out, "two_policies", ".stages", "seed_0", "sft", ".lock")
    _wait_for(lambda: os.path.isfile(lock) and "child" in (open(lock).read() or "{}"), seconds=300,
              what="the SFT child")
    child = json.loads(open(lock).read())["child"]
    assert _alive(child)
    parent.kill()
    parent.wait()
    _wait_for(lambda: not _alive(child), seconds=10, what="the SFT child to die with the protocol")
    record = os.path.join(out, "two_policies", "seed_0", "stages", "sft.json")
    assert not os.path.exists(record)  # killed before it finished: nothing recorded as done

    rerun = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "[1/1] seed_0/sft — ran" in rerun.stdout
    assert json.load(open(record))["status"] == "done"
    log = open(os.path.join(out, "two_policies", "seed_0", "stages", "sft.log")).read()
    assert log.count("$ ") == 1 and "Trainer.fit` stopped: `max_steps=2` reached" in log  # one fit, whole


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_ddp_rank_asks_to_die_with_the_rank_that_started_it():
    """A W2S rank that Lightning started (LOCAL_RANK >= 1) runs `run_local` too; it asks for SIGKILL on its parent's
    death, read back with prctl(PR_GET_PDEATHSIG)."""
    code = ("import ctypes, os, sys; sys.path.insert(0, %r)\n"
            "from protocols.engine import children\n"
            "before = ctypes.c_int(); libc = ctypes.CDLL(None)\n"
            "libc.prctl(2, ctypes.byref(before), 0, 0, 0)\n"
            "assert children.die_with_parent()\n"
            "after = ctypes.c_int(); libc.prctl(2, ctypes.byref(after), 0, 0, 0)\n"
            "print(before.value, after.value)" % ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", str(int(signal.SIGKILL))]
