"""Run the W2S protocol, then dump the results table this rank computed to TABLE_DIR/table.rank<R>.json; run by
test_w2s_protocol.py as a subprocess (Lightning's DDP re-executes this script for rank 1, which pytest cannot
host twice in one process). The dump is test-only: the protocol itself writes files on rank 0 only.

usage: python tests/ddp_protocol_script.py TABLE_DIR PROTOCOL_ARGS...
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from protocols.engine.run_files import close_process_group  # noqa: E402
from protocols.w2s.protocol import main as run_protocol  # noqa: E402


def main() -> None:
    table_dir, args = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)
    results = run_protocol(args)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    with open(os.path.join(table_dir, f"table.rank{rank}.json"), "w") as f:
        json.dump(results["rows"], f)
    with open(os.path.join(table_dir, f"weak_val.rank{rank}.json"), "w") as f:
        json.dump(results["weak_val_rows"], f)
    close_process_group()  # as `python -m protocols.w2s` does on return (protocols.engine.refusals.run_main)


if __name__ == "__main__":
    main()
