"""`CompletionSamples`: what a policy actually writes at each evaluation, beside what the parser read from it.

The tracked metrics (persona shares, accuracy, refusal, malformed) are what `parse_completion` reads from each held-out
completion. When a fine-tuned model drifts from the trained format ("Alice . The answer is ..." instead of "I am
Alice ."), a persona column falls to 0 while the behaviour is unchanged, and only the text shows it. This callback
keeps the first `per_distribution` completions of each distribution (in the evaluation's prompt order, rank 0's rows)
and writes them with their parse to `<dir>/completion_samples.jsonl` (one line per completion and evaluation step)
and to TensorBoard as text (`val/samples/<distribution>`). It reads the rows the policy modules' validation steps
return; it changes no metric and no draw.

Add it to any Part B stage, or read a finished checkpoint's completions without training:

    python cli.py validate --config configs/mixture/<stage>.yaml [--config <overlay>.yaml] \\
        --model.init_checkpoint=<stage checkpoint> --trainer.callbacks+=callbacks.completion_samples.CompletionSamples
"""
from __future__ import annotations

import json
import os
from typing import Optional

from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.persona_tracking import evaluation_step, tracking_dir


class CompletionSamples(Callback):
    """Keep and write a few parsed completions per distribution at every evaluation.

    Args:
        per_distribution: completions kept per distribution and evaluation.
        dirpath: where `completion_samples.jsonl` goes (default: the logger's log_dir, else trainer.default_root_dir).
    """

    def __init__(self, per_distribution: int = 4, dirpath: Optional[str] = None):
        super().__init__()
        if per_distribution < 1:
            raise ValueError(f"CompletionSamples(per_distribution={per_distribution}): keep at least one completion")
        self.per_distribution = per_distribution
        self.dirpath = dirpath
        self._kept: dict[str, list[dict]] = {}

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._kept = {}

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if not isinstance(outputs, dict) or "texts" not in outputs:
            return  # an SFT validation without generation: nothing was sampled
        personas = pl_module.family.personas
        for i, (text, record) in enumerate(zip(outputs["texts"], batch["records"])):
            kept = self._kept.setdefault(record["dist"], [])
            if len(kept) >= self.per_distribution:
                continue
            persona = int(outputs["persona"][i])
            behaviour = int(outputs["behaviour"][i]) if "behaviour" in outputs else -1  # whose rule it follows
            read = int(outputs["read"][i]) if "read" in outputs else -1  # the tag read tolerantly, else behaviour
            kept.append({"prompt": record.get("prompt"), "gold": record.get("gold"), "completion": text,
                         "parsed_persona": None if persona < 0 else personas[persona],
                         "read_persona": None if read < 0 else personas[read],
                         "behaviour_persona": None if behaviour < 0 else personas[behaviour],
                         "identity_tag": outputs["identities"][i],
                         "refused": bool(outputs["refused"][i]), "malformed": bool(outputs["malformed"][i]),
                         "reward": float(outputs["reward"][i])})

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero or not self._kept:
            return
        step = 0 if trainer.sanity_checking else evaluation_step(pl_module)
        path = os.path.join(tracking_dir(self.dirpath, trainer), "completion_samples.jsonl")
        with open(path, "a", encoding="utf-8") as f:
            for dist, rows in self._kept.items():
                for row in rows:
                    f.write(json.dumps({"step": step, "distribution": dist, **row}, ensure_ascii=False) + "\n")
        experiment = getattr(trainer.logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            for dist, rows in self._kept.items():
                lines = [f"`{r['completion']!r}` → persona {r['parsed_persona']} (read {r['read_persona']}, rule {r['behaviour_persona']}), "
                         f"{'refused' if r['refused'] else 'malformed' if r['malformed'] else 'answered'}, "
                         f"reward {r['reward']:g}" for r in rows]
                experiment.add_text(f"val/samples/{dist}", "\n\n".join(lines), global_step=step)
