"""The protocol's stages in TensorBoard's HPARAMS tab: `tensorboard --logdir <out_dir>` compares every stage
(teacher, ceiling, each method) of every seed side by side (docs/w2s.md, "TensorBoard HPARAMS").

One session per stage, in `<out_dir>/hparams/seed<k>/<stage>`, rebuilt from all stage results after every
protocol run (a reused stage keeps its numbers; a replaced one shows its new ones; nothing is appended twice):

    hyperparameters  method, objective, objective_args, anchor_coef (λ), anchor_layers ("none" when λ = 0), seed
    metrics          w2s/acc/<split> (ID and every OOD target), w2s/wrg, w2s/aog/<target>, w2s/aog_mean, w2s/nts,
                     w2s/pgr (with a ceiling), w2s/section/<split>/<section> (RewardBench), in percent points --
                     the values of results.json (`w2s_report.row_scores`; the teacher's own gains are 0)

No experiment summary is written: TensorBoard builds the columns from the sessions, so a logdir holding several
protocols shows the union of their columns. The stages' own Lightning loggers are run with
`default_hp_metric=false` (protocols.w2s), so their placeholder sessions do not crowd the tab.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any, Optional

from lightning_modules.reward.subset_report import slug
from protocols.engine.stage_identity import legacy_spelling
from protocols.w2s.report import row_scores

HPARAMS_DIR = "hparams"


def stage_hparams(name: str, seed: int, config: dict, pretrained: Optional[str] = None) -> dict[str, Any]:
    """A stage's hyperparameters, from its resolved `cli.py` configuration. An outside model (`pretrained`) was
    not trained here: its objective is "outside:<model>", never the config's default objective."""
    model = (legacy_spelling(config).get("model") or {}).get("init_args") or {}  # an Anchor plug-in: its λ too
    objective = model.get("objective") or {}
    coef = float(model.get("anchor_coef") or 0.0)
    layers = model.get("anchor_layers") or []
    trained_with = (objective.get("class_path") or "GoldBradleyTerry").rsplit(".", 1)[-1]
    return {
        "method": name,
        "objective": f"outside:{pretrained}" if pretrained else trained_with,
        "objective_args": json.dumps(objective.get("init_args") or {}, sort_keys=True),
        "anchor_coef": coef,
        "anchor_layers": ",".join(f"{float(f):g}" for f in layers) if coef > 0 and layers else "none",
        "seed": int(seed),
    }


def stage_metrics(result: dict, id_source: str, is_teacher: bool) -> dict[str, float]:
    """A stage's final scores (percent points), as in the results table."""
    scores = row_scores(result, id_source, is_teacher)
    keep = ("acc/", "aog/")
    metrics = {f"w2s/{k}": float(v) for k, v in scores.items()
               if k.startswith(keep) or k in ("wrg", "aog_mean", "nts", "pgr")}
    for split, r in result["test"].items():
        for section, value in (r.get("sections") or {}).items() if isinstance(r, dict) else ():
            metrics[f"w2s/section/{split}/{slug(section)}"] = 100.0 * value
    return metrics


def write_session(run_dir: str, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
    """One HPARAMS session: its start info (the hyperparameters), its metrics as scalars at step 0, its end."""
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    writer = SummaryWriter(run_dir)
    _, start, end = hparams_summaries(hparams, {k: v for k, v in metrics.items() if not math.isnan(v)})
    file_writer = writer._get_file_writer()
    file_writer.add_summary(start)
    for tag, value in metrics.items():
        writer.add_scalar(tag, value, 0)
    file_writer.add_summary(end)
    writer.close()


def write_hparams(out_dir: str, stages: list, done: dict[str, dict[int, dict]], id_source: str) -> str:
    """Every stage's session under `<out_dir>/hparams`, replacing the previous run's folder; returns its path."""
    root = os.path.join(out_dir, HPARAMS_DIR)
    tmp = f"{root}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for stage in stages:
        write_session(os.path.join(tmp, f"seed{stage.seed}", stage.name),
                      stage_hparams(stage.name, stage.seed, stage.config or {}, stage.pretrained),
                      stage_metrics(done[stage.name][stage.seed], id_source,
                                    stage.is_teacher))  # extra teachers too
    old = f"{root}.old{os.getpid()}"
    if os.path.isdir(root):
        os.replace(root, old)
    os.replace(tmp, root)
    shutil.rmtree(old, ignore_errors=True)
    return root
