"""Run a protocol's stages here: one after another in this process (`workers=1`: the W2S protocol, whose fits run
in-process and may span DDP ranks), or up to `workers` at once on threads (the mixture, whose stages are
subprocesses), each stage as soon as the stages it reads are done.

Every decision is the engine's and the same for every protocol and executor (`decide`): a stage whose upstream
results block it takes the protocol's stand-in result; a finished stage of the same identity is reused; a finished
stage of another identity is refused unless forced; a stage reading a forced one follows it; everything else runs,
under its own lock (`<root>/.stages/<key>/.lock`), so a cluster job and a local run never run one stage at once.
"""
from __future__ import annotations

import concurrent.futures as futures
import os
import sys
import time
from contextlib import nullcontext
from typing import Callable, Optional

from protocols.engine import children
from protocols.engine.interrupt import Interrupted, on_signals
from protocols.engine.progress import Progress
from protocols.engine.spec import Hooks, StageSpec, stage_folder
from protocols.engine.run_files import OutDirLock, is_global_zero
from protocols.engine.stage_identity import ForceSpec, refusal


def refuse_changed(specs: list[StageSpec], hooks: Hooks, force: ForceSpec) -> list[str]:
    """Before any work: every finished stage whose configuration or data changed, refused at once naming each
    (changes of upstream runs are known only as stages run: `decide`). Returns the folders of the finished stages
    that `--force` will run again."""
    changed, forced = [], []
    for spec in specs:
        finished = hooks.finished(spec)
        if finished is None:
            continue
        if force.forces(spec.name, spec.seed):
            forced.append(hooks.where(spec))
            continue
        diff = changes_before_work(spec, hooks, finished)
        if diff:
            changed.append((hooks.where(spec), diff))
    if changed:
        raise refusal(changed)
    return forced


def changes_before_work(spec: StageSpec, hooks: Hooks, finished: dict) -> list[str]:
    """How a finished stage differs from what its configuration and data make of it now, its upstream runs left
    out (they are known only as stages run): what `refuse_changed` refuses and `--status` calls "changed"."""
    identity = hooks.identity(spec, {})
    return hooks.changes(spec, finished, {k: v for k, v in identity.items() if k != "upstream"})


def decide(spec: StageSpec, hooks: Hooks, results: dict[str, dict], force: ForceSpec,
           forced_keys: set[str]) -> tuple[str, Optional[dict], dict, bool]:
    """("blocked" | "reuse" | "run", the result when not run, the identity, forced) of a stage whose upstream
    stages are done; a finished stage of another identity is refused (`StageChangedError`)."""
    upstream = {u: results[u] for u in spec.upstream}
    blocked = hooks.blocked(spec, upstream)
    if blocked is not None:
        return "blocked", blocked, {}, False
    identity = hooks.identity(spec, upstream)
    forced = force.forces(spec.name, spec.seed) or any(u in forced_keys for u in spec.upstream)
    finished = hooks.finished(spec)
    if finished is not None and not forced:
        diff = hooks.changes(spec, finished, identity)
        if diff:
            raise refusal([(hooks.where(spec), diff)])
        return "reuse", finished, identity, False
    return "run", None, identity, forced


def stage_lock(hooks: Hooks, spec: StageSpec):
    """The stage's own lock; global rank 0 holds it (under DDP every rank runs the stage, inside rank 0's lock)."""
    return OutDirLock(stage_folder(hooks.root, spec.key), what="stage") if is_global_zero() else nullcontext()


def run_local(specs: list[StageSpec], hooks: Hooks, force: ForceSpec, workers: int = 1,
              progress: Optional[Progress] = None,
              between: Optional[Callable[[StageSpec, StageSpec], None]] = None) -> dict[str, dict]:
    """Every stage, in dependency order; returns key -> result. `between(previous, next)`: called between two
    stages in order (W2S frees a seed's shared stores when the next stage is another seed's); sequential only."""
    progress = progress or Progress(specs, hooks)
    if os.environ.get("LOCAL_RANK", "0") != "0":  # a DDP rank started by rank 0 (or torchrun): dies with it
        children.die_with_parent()
    if workers > 1:
        return _run_parallel(specs, hooks, force, workers, progress)
    results: dict[str, dict] = {}
    forced_keys: set[str] = set()
    current: list[str] = []  # the stage in progress, named by an interruption (`interrupt.on_signals`)
    with on_signals(lambda: current):
        for i, spec in enumerate(specs):
            current[:] = []
            if i and between is not None:
                between(specs[i - 1], spec)
            current[:] = [spec.key]
            with stage_lock(hooks, spec) as lock:
                results[spec.key] = _one(spec, hooks, results, force, forced_keys, progress, lock)
    return results


def _one(spec: StageSpec, hooks: Hooks, results: dict[str, dict], force: ForceSpec, forced_keys: set[str],
         progress: Progress, lock) -> dict:
    action, result, identity, forced = decide(spec, hooks, results, force, forced_keys)
    if action != "run":
        return _settle(spec, hooks, action, result, identity, progress)
    if forced:
        forced_keys.add(spec.key)
    start = time.time()
    withdraw_readers(hooks, spec)
    result = _run_holding(lock, spec, hooks, {u: results[u] for u in spec.upstream}, identity, forced)
    progress.ran(spec, result, time.time() - start)
    return result


def _settle(spec: StageSpec, hooks: Hooks, action: str, result: dict, identity: dict, progress: Progress) -> dict:
    """The result of a stage that does not run: reused (the protocol may refresh its record) or blocked."""
    if action == "reuse":
        result = reuse(hooks, spec, result, identity)
    progress.settled(spec, action, result)
    return result


def _run_parallel(specs: list[StageSpec], hooks: Hooks, force: ForceSpec, workers: int,
                  progress: Progress) -> dict[str, dict]:
    """Decisions (identities, reuse, refusal) in this thread, in declared order as stages become ready; runs on up
    to `workers` threads. The first error stops new stages; running ones finish, then it is raised. A SIGTERM /
    SIGINT kills the running stages' children (`children.kill_all`), waits for their threads and raises
    `StageInterrupted` naming them."""
    results: dict[str, dict] = {}
    running: dict[futures.Future, tuple[StageSpec, OutDirLock, float]] = {}
    interrupted: list[str] = []
    with on_signals(lambda: interrupted):
        try:
            with futures.ThreadPoolExecutor(max_workers=workers) as pool:
                try:
                    error = _schedule(pool, list(specs), running, results, hooks, force, workers, progress)
                except Interrupted:
                    interrupted[:] = [spec.key for spec, _, _ in running.values()]
                    children.kill_all()  # their threads record the stages as failed; the pool waits for them
                    raise
        finally:
            children.allow()
            for _, lock, _ in running.values():  # left by an interruption: their threads have ended
                lock.__exit__(None, None, None)
    if error is not None:
        raise error
    return results


def _schedule(pool: futures.ThreadPoolExecutor, pending: list[StageSpec], running: dict, results: dict[str, dict],
              hooks: Hooks, force: ForceSpec, workers: int, progress: Progress) -> Optional[BaseException]:
    """`_run_parallel`'s loop: start each stage once its upstream stages settled, until every stage settled or the
    first error stopped new ones; returns that error (raised once the running stages finished)."""
    forced_keys: set[str] = set()
    error: Optional[BaseException] = None
    while pending or running:
        ready = [s for s in pending if all(u in results for u in (*s.upstream, *s.after))] if error is None else []
        settled = False  # a stage reused (or blocked) here may make others ready: look again before waiting
        for spec in ready:
            if len(running) >= workers:
                break
            pending.remove(spec)
            lock = stage_lock(hooks, spec)
            lock.__enter__()
            try:
                action, result, identity, forced = decide(spec, hooks, results, force, forced_keys)
            except BaseException as err:  # noqa: BLE001 -- a refusal: stop starting, finish the running
                lock.__exit__(None, None, None)
                if isinstance(err, Interrupted):
                    raise
                error = err
                break
            if action != "run":
                results[spec.key] = _settle(spec, hooks, action, result, identity, progress)
                lock.__exit__(None, None, None)
                settled = True
                continue
            if forced:
                forced_keys.add(spec.key)
            upstream = {u: results[u] for u in spec.upstream}
            try:
                withdraw_readers(hooks, spec)  # here, in declared order: the stage threads only run
            except Exception as err:  # noqa: BLE001 -- as a refusal: stop starting, finish the running
                lock.__exit__(None, None, None)
                error = err
                break
            running[pool.submit(_run_holding, lock, spec, hooks, upstream, identity, forced)] = (spec, lock, time.time())
        if settled and len(running) < workers:
            continue  # a free worker: start what the reused stages unblocked before waiting on a running one
        if not running:
            if error is not None or not pending:
                break
            raise RuntimeError(f"stages {[s.key for s in pending]} wait for stages that never ran")  # a defect
        done, _ = futures.wait(list(running), return_when=futures.FIRST_COMPLETED)
        for future in done:
            spec, lock, start = running.pop(future)
            lock.__exit__(None, None, None)
            try:
                results[spec.key] = future.result()
                progress.ran(spec, results[spec.key], time.time() - start)
            except BaseException as err:  # noqa: BLE001 -- raised once the running stages finished
                error = error or err
    return error


def _run_holding(lock, spec: StageSpec, hooks: Hooks, upstream: dict[str, dict], identity: dict,
                 forced: bool) -> dict:
    """`hooks.run`, its children holding the stage's lock (`children.holding`): in this thread, or on a pool
    thread. The caller has withdrawn the sets that read the stage (`withdraw_readers`)."""
    with children.holding(lock):
        return hooks.run(spec, upstream, identity, forced)


def withdraw_readers(hooks: Hooks, spec: StageSpec) -> list[str]:
    """Before a stage runs (again): every published set that read it is withdrawn at once (`published_set`), so a
    rerun that fails leaves no table reading as the result. The sets of this run's folder that name the stage's key,
    and every set anywhere, of any configuration or protocol, that recorded the stage's result file by its real path
    (a linked seed folder, another configuration sharing the stage, another experiment of the mixture's family).
    Returns the withdrawn sets' folders."""
    from protocols.engine.published_set import withdraw_sets_reading, withdraw_sets_reading_file

    why = "runs again" if hooks.finished(spec) is not None else "is missing and runs"
    result_file = getattr(hooks, "result_file", None)

    def withdraw() -> list[str]:
        withdrawn = withdraw_sets_reading(hooks.root, spec.key, why)
        if result_file is not None:
            withdrawn += withdraw_sets_reading_file(result_file(spec), spec.key, why)
        return withdrawn
    if "torch" not in sys.modules:  # no process group can exist (a protocol whose stages are subprocesses)
        return withdraw() if is_global_zero() else []
    from protocols.engine.rank_errors import on_rank_zero

    return on_rank_zero(f"withdraw the sets that read {hooks.where(spec)}", withdraw) or []


def run_one(specs: list[StageSpec], hooks: Hooks, key: str, force: ForceSpec) -> dict:
    """One stage (a cluster job's work, `--stage KEY`) from its upstream stages' finished results on disk, under its
    own lock; refused while an upstream stage has not finished."""
    by_key = {s.key: s for s in specs}
    if key not in by_key:
        raise ValueError(f"--stage {key!r}: no such stage; the stages are {list(by_key)}")
    spec = by_key[key]
    results = {}
    for up in spec.upstream:
        finished = hooks.finished(by_key[up])
        if finished is None:
            raise RuntimeError(f"stage {key} reads {up}, which has not finished ({hooks.where(by_key[up])})")
        results[up] = finished
    with on_signals(lambda: [key]), stage_lock(hooks, spec) as lock:
        return _one(spec, hooks, results, force, set(), Progress([spec], hooks, quiet=True), lock)


def results_on_disk(specs: list[StageSpec], hooks: Hooks) -> dict[str, dict]:
    """What `--collect` publishes: each stage's finished result, checked as a run checks it (a changed stage is
    refused), or, for a stage that did not finish, what the protocol records of it (`hooks.recorded`, else
    `hooks.missing`: W2S has neither, and the collection is refused naming the stage; the mixture reports the
    failure)."""
    results: dict[str, dict] = {}
    missing = []
    for spec in specs:
        upstream = {u: results[u] for u in spec.upstream if u in results}
        blocked = hooks.blocked(spec, upstream) if len(upstream) == len(spec.upstream) else None
        if blocked is not None:
            results[spec.key] = blocked
            continue
        finished = hooks.finished(spec)
        if finished is not None and len(upstream) == len(spec.upstream):
            identity = hooks.identity(spec, upstream)
            diff = hooks.changes(spec, finished, identity)
            if diff:
                raise refusal([(hooks.where(spec), diff)])
            results[spec.key] = reuse(hooks, spec, finished, identity)
            continue
        recorded = hooks.recorded(spec) or hooks.missing(spec)
        if recorded is None:
            missing.append(spec.key)
        else:
            results[spec.key] = recorded
    if missing:
        raise RuntimeError(f"--collect: {len(missing)} stage(s) have not finished: {missing} (--status shows why)")
    return results


def reuse(hooks: Hooks, spec: StageSpec, finished: dict, identity: dict) -> dict:
    """A finished stage taken as it is: the temp files a dead writer left beside its result go first (this run
    reads that folder), then the protocol may refresh its record (`hooks.reuse`). A protocol without
    `result_file` (it is optional) sweeps nothing."""
    result_file = getattr(hooks, "result_file", None)
    if result_file is not None:
        sweep(os.path.dirname(result_file(spec)))
    return hooks.reuse(spec, finished, identity)


def sweep(folder: str) -> None:
    """Remove temp files of dead writers in a folder a run reads (`datamodules.atomic_files.remove_orphans`)."""
    from datamodules.atomic_files import remove_orphans

    if is_global_zero() and os.path.isdir(folder):
        remove_orphans(folder)
