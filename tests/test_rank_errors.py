"""protocols.engine.rank_errors: a failure inside a rank-0-only section ends every rank with that error at once (2 gloo
processes started through subprocess), and without a process group the section is plain rank-0 code."""
import errno
import os
import socket
import subprocess
import sys
import time

import pytest

from protocols.engine.rank_errors import RankZeroSectionError, on_rank_zero, rank_zero_section

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_error_script.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_ranks(mode: str, tmp_path) -> tuple[list[tuple[int, str, str]], float, bool]:
    """Both ranks of the script. Returns (rc, stdout, stderr) per rank, the seconds until rank 1 exited, and whether
    rank 0 was still alive then ("rank0_fails": rank 0 lingers, and is killed once rank 1 has exited)."""
    port = str(_free_port())
    env = dict(os.environ, RANK_ERROR_MARKER=str(tmp_path / "marker.txt"), OMP_NUM_THREADS="1")
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, SCRIPT, mode, str(r), "2", port], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    try:
        out1, err1 = procs[1].communicate(timeout=90)  # the group's timeout is 10 min: only a told rank ends in time
        elapsed = time.monotonic() - start
        rank0_alive = procs[0].poll() is None
        if mode == "rank0_fails" and rank0_alive:
            procs[0].kill()
        out0, err0 = procs[0].communicate(timeout=90)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(procs[0].returncode, out0, err0), (procs[1].returncode, out1, err1)], elapsed, rank0_alive


def test_rank_zero_failure_ends_every_rank_with_its_error(tmp_path):
    (rank0, rank1), elapsed, rank0_alive = _run_two_ranks("rank0_fails", tmp_path)
    assert rank0[0] != 0 and rank1[0] != 0
    # rank 1 ended while rank 0 lived on: told by the section, not by a dead peer nor the group's 10-minute timeout
    assert rank0_alive and elapsed < 60  # (each rank imports torch: 2-5 s)
    assert "OSError: [Errno 28] No space left on device" in rank0[2]  # rank 0 re-raised its own exception
    assert "RankZeroSectionError" not in rank0[2]
    assert ("RankZeroSectionError: rank 0 failed in 'write result.json of seed0/naive': OSError: [Errno 28] "
            "No space left on device: " in rank1[2])
    assert "past the barrier" not in rank0[1] + rank1[1]  # neither went on into the next collective
    assert not (tmp_path / "marker.txt").exists()


def test_a_failure_on_another_rank_is_named_on_rank_zero(tmp_path):
    (rank0, rank1), elapsed, _ = _run_two_ranks("rank1_fails", tmp_path)
    assert rank0[0] != 0 and rank1[0] != 0 and elapsed < 60
    assert "ValueError: rank 1 broke" in rank1[2]
    assert "RankZeroSectionError: rank 1 failed in 'publish results': ValueError: rank 1 broke" in rank0[2]


def test_success_lets_every_rank_go_on(tmp_path):
    (rank0, rank1), _, _ = _run_two_ranks("ok", tmp_path)
    assert (rank0[0], rank1[0]) == (0, 0), rank0[2] + rank1[2]
    assert "rank 0: returned 'wrote', marker 'written by rank 0'" in rank0[1]
    assert "rank 1: returned None, marker 'written by rank 0'" in rank1[1]  # the write was done when rank 1 read it
    assert "past the barrier" in rank0[1] and "past the barrier" in rank1[1]


def test_without_a_process_group_the_section_is_plain_rank_zero_code(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    assert on_rank_zero("add", lambda a, b: a + b, 2, b=3) == 5
    with pytest.raises(OSError) as caught:  # its own exception, unchanged
        on_rank_zero("write", lambda: (_ for _ in ()).throw(OSError(errno.EACCES, "Permission denied")))
    assert caught.value.errno == errno.EACCES
    monkeypatch.setenv("LOCAL_RANK", "1")  # a DDP child before its first fit: not rank 0, the work is skipped
    calls = []
    assert on_rank_zero("write", calls.append, 1) is None and calls == []
    with rank_zero_section("check") as rank_zero:
        assert rank_zero is False
    assert issubclass(RankZeroSectionError, RuntimeError)
