"""Evaluate a fixed random-init tiny reward model on odd-sized splits; run by test_ddp.py as a subprocess
(Lightning's DDP re-executes the script for rank 1, which pytest cannot host twice in one process).

usage: python tests/ddp_eval_script.py TOKENIZER_DIR CACHE_DIR OUT_JSON DEVICES TEACHER_CKPT
The teacher's weak labels and test margins are computed in prepare_data (once, on rank 0) and the student is
scored against the teacher on the same pairs.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402

from tests.helpers import quiet_trainer, tiny_data, tiny_model  # noqa: E402


def main() -> None:
    tok, cache, out, devices, teacher = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    pl.seed_everything(0)
    model = tiny_model(tok)
    dm = tiny_data(tok, cache, eval_batch_size=4, train_subset="student", teacher_checkpoint=teacher)
    strategy = "ddp" if devices > 1 else "auto"
    trainer = quiet_trainer(os.path.dirname(out), devices=devices, strategy=strategy)
    trainer.test(model, dm, verbose=False)
    if trainer.is_global_zero:
        with open(out, "w") as f:
            json.dump(model.test_results, f)


if __name__ == "__main__":
    main()
