"""The stage engine on a protocol made up here (no model, no Lightning): its decisions, its parallel runner, its
progress lines and its local status; then the W2S protocol's progress lines and `--status` on a tiny run."""
import json
import os
import re
import socket
import threading
import time

import pytest

from protocols.engine import command, local
from protocols.engine.progress import Progress
from protocols.engine.spec import StageSpec, stage_folder
from protocols.engine.status import lock_holder, stage_rows
from protocols.engine.run_files import OutDirLock
from protocols.engine.stage_identity import ForceSpec, StageChangedError, identity_changes


class FakeHooks:
    """Stages `seed<k>/<name>` whose result is {"identity", "run", "status"}; `config[name]` is their identity;
    `fail`: names whose run raises; `skip_after_failure`: a stage whose upstream did not finish is a stand-in."""

    label, collect_after = "fake", "afterok"

    def __init__(self, root, config, fail=(), delay=0.0, skip_after_failure=False):
        self.root, self.config, self.fail, self.delay = str(root), dict(config), set(fail), delay
        self.skip_after_failure = skip_after_failure
        self.disk: dict[str, dict] = {}
        self.ran: list[str] = []
        self.active, self.most_at_once = 0, 0
        self._lock = threading.Lock()

    def where(self, spec):
        return os.path.join(self.root, spec.key)

    def finished(self, spec):
        r = self.disk.get(spec.key)
        return r if r and r["status"] == "done" else None

    def recorded(self, spec):
        return self.disk.get(spec.key)

    def missing(self, spec):
        return None

    def blocked(self, spec, upstream):
        if self.skip_after_failure and any(r.get("status") != "done" for r in upstream.values()):
            return {"status": "skipped", "error": "its upstream did not finish"}
        return None

    def identity(self, spec, upstream):
        return {"config": self.config[spec.name], "upstream": {u: r["run"] for u, r in upstream.items()}}

    def changes(self, spec, finished, identity):
        return identity_changes(finished, identity)

    def reuse(self, spec, finished, identity):
        return finished

    def run(self, spec, upstream, identity, forced):
        with self._lock:
            self.active += 1
            self.most_at_once = max(self.most_at_once, self.active)
            self.ran.append(spec.key)
        try:
            time.sleep(self.delay)
            if spec.name in self.fail:
                raise RuntimeError(f"{spec.key} failed")
            result = {"identity": identity, "run": f"{spec.key}#{len(self.ran)}", "status": "done"}
            self.disk[spec.key] = result
            return result
        finally:
            with self._lock:
                self.active -= 1

    def log_of(self, spec):
        return None

    def table_state(self):
        return os.path.join(self.root, "table.json"), ""


def chain(seeds=(0,), names=("teacher", "student", "eval")):
    """Per seed: teacher -> student -> eval."""
    specs = []
    for seed in seeds:
        for i, name in enumerate(names):
            up = (f"seed{seed}/{names[i - 1]}",) if i else ()
            specs.append(StageSpec(f"seed{seed}/{name}", seed, name, up))
    return specs


CONFIG = {"teacher": {"lr": 1}, "student": {"lr": 2}, "eval": {"k": 3}}


def test_a_second_run_reuses_every_stage_and_a_changed_one_is_refused_before_any_work(tmp_path):
    hooks, specs = FakeHooks(tmp_path, CONFIG), chain()
    first = local.run_local(specs, hooks, ForceSpec(None))
    assert hooks.ran == ["seed0/teacher", "seed0/student", "seed0/eval"]
    again = local.run_local(specs, hooks, ForceSpec(None))
    assert again == first and len(hooks.ran) == 3  # nothing ran
    hooks.config["student"] = {"lr": 5}
    with pytest.raises(StageChangedError, match=r"seed0/student: config.lr: 2 → 5"):
        local.refuse_changed(specs, hooks, ForceSpec(None))
    assert len(hooks.ran) == 3


def test_a_forced_stage_reruns_and_the_stages_reading_it_follow(tmp_path):
    hooks, specs = FakeHooks(tmp_path, CONFIG), chain()
    local.run_local(specs, hooks, ForceSpec(None))
    assert local.refuse_changed(specs, hooks, ForceSpec(["student"])) == [os.path.join(str(tmp_path), "seed0/student")]
    local.run_local(specs, hooks, ForceSpec(["student"]))
    assert hooks.ran[3:] == ["seed0/student", "seed0/eval"]  # the teacher is reused, eval follows its upstream


def test_a_stage_whose_upstream_ran_again_unforced_is_refused_as_it_is_reached(tmp_path):
    hooks, specs = FakeHooks(tmp_path, CONFIG), chain()
    local.run_local(specs, hooks, ForceSpec(None))
    del hooks.disk["seed0/teacher"]  # lost: it runs again, with another run id
    with pytest.raises(StageChangedError, match=r"seed0/student: upstream.seed0/teacher: 'seed0/teacher#1' → "):
        local.run_local(specs, hooks, ForceSpec(None))


def test_parallel_runs_respect_the_chain_and_the_worker_count(tmp_path):
    hooks, specs = FakeHooks(tmp_path, CONFIG, delay=0.2), chain(seeds=(0, 1, 2))
    results = local.run_local(specs, hooks, ForceSpec(None), workers=2)
    assert set(results) == {s.key for s in specs} and hooks.most_at_once == 2
    for seed in (0, 1, 2):
        order = [k for k in hooks.ran if k.startswith(f"seed{seed}/")]
        assert order == [f"seed{seed}/teacher", f"seed{seed}/student", f"seed{seed}/eval"]


@pytest.mark.parametrize("ordered", [False, True])
def test_after_orders_siblings_without_reading_them(tmp_path, ordered):
    """Two stages that both read the teacher run at once on 2 workers, unless the second is `after` the first (the
    mixture's stages of one seed: one folder, shared checkpoint paths); `after` adds nothing to the identity."""
    config = {"teacher": {"lr": 1}, "full": {"lr": 2}, "persona": {"lr": 3}}
    specs = [StageSpec("seed0/teacher", 0, "teacher"),
             StageSpec("seed0/full", 0, "full", ("seed0/teacher",)),
             StageSpec("seed0/persona", 0, "persona", ("seed0/teacher",), after=("seed0/full",) if ordered else ())]
    hooks = FakeHooks(tmp_path, config, delay=0.3)
    results = local.run_local(specs, hooks, ForceSpec(None), workers=2)
    assert hooks.most_at_once == (1 if ordered else 2)
    assert hooks.ran == ["seed0/teacher", "seed0/full", "seed0/persona"]
    assert results["seed0/persona"]["identity"]["upstream"] == {"seed0/teacher": results["seed0/teacher"]["run"]}


@pytest.mark.parametrize("seed1_teacher_runs", [False, True])
def test_a_parallel_rerun_goes_on_past_a_round_of_reused_stages(tmp_path, seed1_teacher_runs):
    """Stages unblocked by a reused one start at once: when nothing else runs (the runner used to stop with "wait for
    stages that never ran"), and beside a running stage when a worker is free (it used to wait for that one)."""
    hooks, specs = FakeHooks(tmp_path, CONFIG), chain(seeds=(0, 1))
    for seed in (0, 1):
        hooks.disk[f"seed{seed}/teacher"] = {"identity": {"config": CONFIG["teacher"], "upstream": {}},
                                             "run": f"seed{seed}/teacher#0", "status": "done"}
    if seed1_teacher_runs:  # seed 0's student, unblocked by a reuse, runs beside it at once
        del hooks.disk["seed1/teacher"]
    hooks.delay, spans, run = 0.3, {}, hooks.run

    def timed(spec, *args):
        start = time.monotonic()
        try:
            return run(spec, *args)
        finally:
            spans[spec.key] = (start, time.monotonic())

    hooks.run = timed
    results = local.run_local(specs, hooks, ForceSpec(None), workers=2)
    assert sorted(hooks.ran) == sorted(["seed0/eval", "seed0/student", "seed1/eval", "seed1/student"]
                                       + (["seed1/teacher"] if seed1_teacher_runs else []))
    if seed1_teacher_runs:  # seed 0's student did not wait for seed 1's teacher
        assert spans["seed0/student"][0] < spans["seed1/teacher"][1]
    assert results["seed0/student"]["identity"]["upstream"] == {"seed0/teacher": "seed0/teacher#0"}


def test_a_failure_in_parallel_stops_new_stages_and_is_raised_after_the_running_finish(tmp_path):
    hooks, specs = FakeHooks(tmp_path, CONFIG, fail={"student"}, delay=0.1), chain(seeds=(0, 1))
    with pytest.raises(RuntimeError, match=r"seed\d/student failed"):
        local.run_local(specs, hooks, ForceSpec(None), workers=2)
    assert not any(k.endswith("/eval") for k in hooks.ran)
    assert hooks.active == 0  # nothing left running behind the raise


def test_a_blocked_stage_takes_the_protocols_stand_in(tmp_path):
    class Recording(FakeHooks):
        def run(self, spec, upstream, identity, forced):
            if spec.name == "student":
                self.disk[spec.key] = {"status": "failed", "error": "gate", "run": "x"}
                return self.disk[spec.key]
            return super().run(spec, upstream, identity, forced)

    hooks = Recording(tmp_path, CONFIG, skip_after_failure=True)
    results = local.run_local(chain(), hooks, ForceSpec(None))
    assert results["seed0/student"]["status"] == "failed"
    assert results["seed0/eval"] == {"status": "skipped", "error": "its upstream did not finish"}


def test_progress_lines_count_the_stages_and_estimate_from_those_that_ran(tmp_path, capsys):
    hooks, specs = FakeHooks(tmp_path, CONFIG, delay=0.05), chain(seeds=(0, 1))
    local.run_local(specs[:3], hooks, ForceSpec(None))  # seed 0 finished before: reused in the run below
    capsys.readouterr()
    local.run_local(specs, hooks, ForceSpec(None), progress=Progress(specs, hooks))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" — ")[0] for line in lines] == [f"[{i}/6] {s.key}" for i, s in enumerate(specs, 1)]
    assert re.fullmatch(r"\[1/6\] seed0/teacher — reused; 0:00 elapsed, 3 stage\(s\) to run", lines[0])
    assert re.fullmatch(r"\[4/6\] seed1/teacher — ran 0 s; 0:00 elapsed, ~0 s left \(2 stage\(s\) to run\)", lines[3])
    assert re.fullmatch(r"\[6/6\] seed1/eval — ran 0 s; 0:00 elapsed", lines[5])


def test_local_status_shows_done_running_from_the_stage_lock_and_not_started(tmp_path):
    hooks, specs = FakeHooks(tmp_path, CONFIG), chain()
    local.run_local(specs[:1], hooks, ForceSpec(None))
    with OutDirLock(stage_folder(hooks.root, "seed0/student"), what="stage"):
        assert lock_holder(stage_folder(hooks.root, "seed0/student"))["pid"] == os.getpid()
        rows = {r["stage"]: r["state"] for r in stage_rows(specs, hooks)}
    assert rows["seed0/teacher"] == "done"
    assert rows["seed0/student"] == f"running (PID {os.getpid()} on {os.uname().nodename})"
    assert rows["seed0/eval"] == "not started" and rows["collect"] == "not started"
    assert lock_holder(stage_folder(hooks.root, "seed0/student")) is None  # released: nobody holds it


# ---- the W2S protocol on the engine ---------------------------------------------------------------------------
def test_a_w2s_run_prints_one_line_per_stage_and_keeps_lightnings_output_in_each_stage_log(tmp_path,
                                                                                          word_tokenizer_dir, capfd):
    from protocols.w2s.protocol import main as run_protocol
    from tests.test_w2s_protocol import _tiny_protocol, _write

    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"))
    config = _write(tmp_path, cfg)
    run_protocol(["--config", config])
    out = capfd.readouterr().out
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert [p.split(" — ")[0] for p in progress] == ["[1/2] seed0/teacher", "[2/2] seed0/naive"]
    assert re.fullmatch(r"\[1/2\] seed0/teacher — ran \d+ s; 0:\d\d elapsed, ~\d+ s left \(1 stage\(s\) to run\)",
                        progress[0])
    assert "Trainable params" not in out  # Lightning's model summary went to the stage's log
    assert "Trainable params" in open(os.path.join(cfg["out_dir"], "seed0", "teacher", "stage.log")).read()
    run_protocol(["--config", config, "--status"])
    status = capfd.readouterr().out
    assert "| seed0/naive | done |" in status and "| collect | done |" in status
    os.remove(os.path.join(cfg["out_dir"], "seed0", "naive", "result.json"))
    run_protocol(["--config", config, "--status"])
    status = capfd.readouterr().out
    assert "| seed0/naive | not started |" in status
    assert "| collect | stale (seed0/naive is gone (no seed0/naive/result.json)) |" in status


class FolderStage:
    """A stage as `command.Run`'s defaults read it: a folder and the result file written when it finished."""

    def __init__(self, folder):
        self.dir, self.result_path = str(folder), os.path.join(str(folder), "result.json")


class FileHooks(command.Run):
    """Hooks that give only what differs (`specs`, `identity`, `run`): every other hook is `command.Run`'s default."""

    label, collect_after, root = "files", "afterok", ""

    def __init__(self, root):
        self.root, self.ran = str(root), []

    def identity(self, spec, upstream):
        return {"config": {"name": spec.name}}

    def run(self, spec, upstream, identity, forced):
        self.ran.append(spec.key)
        result = {"identity": identity, "run": spec.key}
        os.makedirs(spec.stage.dir, exist_ok=True)
        with open(spec.stage.result_path, "w") as f:
            json.dump(result, f)
        return result

    def table_state(self):
        return os.path.join(self.root, "table.json"), ""


def test_the_run_defaults_find_a_finished_stage_and_the_engine_sweeps_its_folder_before_reusing_it(tmp_path):
    from tests.test_data_checks import dead_pid

    hooks = FileHooks(tmp_path)
    specs = [StageSpec("seed0/fit", 0, "fit", (), FolderStage(tmp_path / "seed0" / "fit"))]
    first = local.run_local(specs, hooks, ForceSpec(None))
    assert hooks.ran == ["seed0/fit"] and hooks.finished(specs[0]) == first["seed0/fit"]
    assert hooks.log_of(specs[0]) == str(tmp_path / "seed0" / "fit" / "stage.log")
    orphan = tmp_path / "seed0" / "fit" / f"result.json.tmp-{socket.gethostname()}-{dead_pid()}"
    orphan.write_text("{")  # a writer killed mid-write beside the finished result
    again = local.run_local(specs, hooks, ForceSpec(None))
    assert again == first and hooks.ran == ["seed0/fit"]  # reused, not rerun
    assert not orphan.exists()
    assert hooks.changes(specs[0], first["seed0/fit"], {"config": {"name": "other"}}) == ["config.name: 'fit' → 'other'"]
