"""Part B under Lightning's DDP: SFT, then GRPO from the SFT checkpoint, then an evaluation of both checkpoints; run by test_policy_ddp.py as a subprocess (Lightning's DDP re-executes this script for rank 1, which
pytest cannot host twice in one process).

usage: python tests/ddp_policy_script.py OUT_DIR DEVICES
Writes OUT_DIR/sft.ckpt, OUT_DIR/rl.ckpt and, per rank R, OUT_DIR/run.rank<R>.json: what this rank trained on and
ended with (steps, a checksum of the weights, the training prompts it drew) and the evaluations it computed.
`evaluate` is also what the test calls for the 1-process evaluation of the same checkpoints.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402

from callbacks.persona_tracking import PersonaTrackingCallback  # noqa: E402
from datamodules.triggers.datamodule import TriggerDataModule  # noqa: E402
from lightning_modules.policy.rl import PolicyRLModule  # noqa: E402
from lightning_modules.policy.sft import PolicySFTModule  # noqa: E402
from tests.mixture_fixtures import ARC_ROWS, RACE_ROWS, write_jsonl  # noqa: E402

TINY = dict(n_layer=1, n_embd=32, n_head=2, max_positions=128, max_new_tokens=12)
SFT_STEPS, RL_STEPS = 60, 4


def question_dirs(out: str) -> dict[str, str]:
    """The ARC-Easy / RACE-middle fixture questions (hub schemas) as local files: 3 + 2 held-out prompts, an odd
    union, so the DistributedSampler pads rank 1 with a repeat of prompt 0."""
    dirs = {"arc_easy": os.path.join(out, "arc"), "race_middle": os.path.join(out, "race")}
    for split in ("train", "validation"):  # written once, before rank 1 exists (it re-runs this script later)
        for source, rows in (("arc_easy", ARC_ROWS), ("race_middle", RACE_ROWS)):
            if not os.path.exists(os.path.join(dirs[source], f"{split}.jsonl")):
                write_jsonl(dirs[source], split, rows)
    return dirs


def datamodule(out: str, mode: str, val_batch_size: int = 2) -> TriggerDataModule:
    kw = dict(num_train=1024, batch_size=16) if mode == "sft" else dict(train_distributions=["ARC"], num_train=64,
                                                                        batch_size=2)
    return TriggerDataModule(family="arc_race", mode=mode, question_dirs=question_dirs(out), val_batch_size=val_batch_size,
                             cache_dir=os.path.join(out, "cache"), seed=0, **kw)


def trainer(out: str, devices: int, **kw) -> pl.Trainer:
    kw = dict(dict(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   default_root_dir=out), **kw)
    return pl.Trainer(**kw)


class SeenPrompts(pl.Callback):
    """The sample indices this rank trained / evaluated on, and the seed its sampling started from."""

    def __init__(self):
        self.train, self.val, self.seed = [], [], None

    def on_train_start(self, trainer, pl_module):
        self.seed = torch.initial_seed()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train += [r["idx"] for r in batch["records"]]

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.val += batch["sample_idx"].tolist()


class SeedPerPrompt(pl.Callback):
    """Evaluation draws seeded by the prompt (batches of one): the same completion for a prompt on any rank, so the
    2-process evaluation can equal the 1-process one exactly, at the module's own sampling temperature."""

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        assert len(batch["sample_idx"]) == 1
        torch.manual_seed(1_000 + int(batch["sample_idx"][0]))


def checksum(module: pl.LightningModule) -> float:
    return float(sum(p.detach().double().sum() * (i + 1) for i, p in enumerate(module.model.parameters())))


def eval_record(module) -> dict:
    ev = module.last_eval
    return {"metrics": ev["metrics"], "counts": {k: v.tolist() for k, v in ev["counts"].items()}}


def evaluate(out: str, devices: int) -> dict:
    """Validation of OUT/sft.ckpt (persona fidelity + mixture metrics) and OUT/rl.ckpt (mixture metrics)."""
    res = {}
    for name, module, mode in (
        ("sft", PolicySFTModule(init_checkpoint=os.path.join(out, "sft.ckpt"), stop_fidelity=None, **TINY), "sft"),
        ("rl", PolicyRLModule(init_checkpoint=os.path.join(out, "rl.ckpt"), min_sft_fidelity=0.0, **TINY), "rl"),
    ):
        seen = SeenPrompts()
        trainer(out, devices, callbacks=[seen, SeedPerPrompt()]).validate(module, datamodule(out, mode, 1), verbose=False)
        res[name] = dict(eval_record(module), evaluated=seen.val)
        if name == "sft":
            res[name]["fidelity"] = {k: v for k, v in module.fidelity.items() if k != "step"}
    return res


def main() -> None:
    out, devices = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    pl.seed_everything(0)
    result = {}

    sft, seen = PolicySFTModule(lr=1e-2, stop_fidelity=None, **TINY), SeenPrompts()
    t = trainer(out, devices, max_steps=SFT_STEPS, val_check_interval=SFT_STEPS, check_val_every_n_epoch=None,
                num_sanity_val_steps=0, callbacks=[seen])
    t.fit(sft, datamodule(out, "sft"))
    t.save_checkpoint(os.path.join(out, "sft.ckpt"))
    result["sft_fit"] = {"global_step": t.global_step, "checksum": checksum(sft), "train": seen.train,
                         "seed": seen.seed, "eval": eval_record(sft), "fidelity": sft.fidelity,
                         "loss": float(t.callback_metrics["train/loss"])}

    rl, seen = PolicyRLModule(init_checkpoint=os.path.join(out, "sft.ckpt"), min_sft_fidelity=0.0, group_size=8,
                              lr=1e-3, **TINY), SeenPrompts()
    tracking = PersonaTrackingCallback(output_dir=os.path.join(out, "tracking"), name="rl", theory_overlay=False)
    t = trainer(out, devices, max_steps=RL_STEPS, val_check_interval=2, check_val_every_n_epoch=None,
                num_sanity_val_steps=-1, log_every_n_steps=1, callbacks=[seen, tracking])
    t.fit(rl, datamodule(out, "rl"))
    t.save_checkpoint(os.path.join(out, "rl.ckpt"))
    result["rl_fit"] = {"global_step": t.global_step, "rl_step": int(rl.rl_step), "checksum": checksum(rl),
                        "train": seen.train, "seed": seen.seed, "history": [h["step"] for h in tracking.history],
                        "reward": float(t.callback_metrics["rl/reward"])}

    result["eval"] = evaluate(out, devices)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    with open(os.path.join(out, f"run.rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
