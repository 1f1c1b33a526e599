"""One gloo rank of tests/test_rank_errors.py: `python rank_error_script.py MODE RANK WORLD PORT`.

MODE "ok": rank 0 writes a marker inside the section, every rank then reads it (it exists: the section ended after
the write). "rank0_fails": rank 0 raises ENOSPC inside the section, prints it and stays alive (as a peer whose death
NCCL does not notice; over gloo a peer that exits is seen at once, with "Connection closed by peer" and not its
error). "rank1_fails": rank 1 raises inside a section's body. After the section every rank enters a barrier, as the
next stage's fit would: a rank that was not told of the failure would wait there until the process group's timeout
(set long, so a test that waits fails on time).
"""
import errno
import os
import sys
import time
import traceback
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch.distributed as dist  # noqa: E402

from protocols.engine.rank_errors import on_rank_zero, rank_zero_section  # noqa: E402

mode, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
marker = os.environ["RANK_ERROR_MARKER"]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world))
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(minutes=10))


def write_marker(path: str) -> str:
    if mode == "rank0_fails":
        raise OSError(errno.ENOSPC, "No space left on device", path)
    with open(path, "w") as f:
        f.write("written by rank 0")
    return "wrote"


if mode == "rank1_fails":
    with rank_zero_section("publish results") as rank_zero:
        if not rank_zero:
            raise ValueError("rank 1 broke")
else:
    try:
        out = on_rank_zero("write result.json of seed0/naive", write_marker, marker)
    except OSError:
        traceback.print_exc()
        sys.stderr.flush()
        time.sleep(300)  # alive until the test kills it
        raise
    with open(marker) as f:
        print(f"rank {rank}: returned {out!r}, marker {f.read()!r}", flush=True)
dist.barrier()  # the next stage's first collective
print(f"rank {rank}: past the barrier", flush=True)
dist.destroy_process_group()
