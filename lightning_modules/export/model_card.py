"""The exported reward model's card (README.md): where it came from and how well it did.

Provenance comes from the checkpoint (the model's and the datamodule's hyperparameters), the run's `config.yaml`
(objective, seed: the objective is not a hyperparameter of the checkpoint) and a results JSON: `--results`, or the
W2S protocol's `result.json` of the stage whose checkpoint this is (found beside the checkpoint or one folder up).
Whatever is not found is written as "not recorded" / "not measured", never guessed.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import yaml

NOT_MEASURED = "not measured"
NOT_RECORDED = "not recorded"


def _near(ckpt_path: str, names: list[str]) -> list[str]:
    """Candidate files near a checkpoint: beside it, one and two folders up, and in a `fit/` folder beside it
    (the protocol writes `<stage>/final.ckpt` and `<stage>/fit/config.yaml`)."""
    here = os.path.dirname(os.path.abspath(ckpt_path))
    folders = [here, os.path.dirname(here), os.path.dirname(os.path.dirname(here)), os.path.join(here, "fit")]
    return [os.path.join(d, n) for d in folders for n in names]


def run_config(ckpt_path: str) -> tuple[Optional[dict], Optional[str]]:
    for path in _near(ckpt_path, ["config.yaml"]):
        if os.path.isfile(path):
            with open(path) as f:
                return yaml.safe_load(f), path
    return None, None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def find_results(ckpt_path: str, results_path: Optional[str]) -> tuple[Optional[dict], Optional[str]]:
    """Per-split results {split: {"acc", "pairs"}, "transfer"?: {...}} and where they came from."""
    if results_path is not None:
        if not os.path.isfile(results_path):
            raise ValueError(f"--results {results_path!r} does not exist")
        with open(results_path) as f:
            data = json.load(f)
        data = data.get("test", data)  # a protocol stage's result.json, or a test run's test_results.json
        if not any(isinstance(v, dict) and "acc" in v for v in data.values()):
            raise ValueError(f"--results {results_path!r} has no per-split accuracies ({{split: {{'acc': ...}}}})")
        return data, results_path
    for path in _near(ckpt_path, ["result.json"]):
        if os.path.isfile(path):
            with open(path) as f:
                data = json.load(f)
            if _same_file(data.get("checkpoint", ""), ckpt_path):  # the stage that tested this very checkpoint
                return data["test"], path
    return None, None


def gather_provenance(ckpt: dict, ckpt_path: str, results_path: Optional[str]) -> dict[str, Any]:
    from lightning_modules.reward.regularisers.shorthands import as_shorthands

    hp = as_shorthands(ckpt.get("hyper_parameters", {}))  # an Anchor plug-in's λ as `anchor_coef`, as the card reads it
    data = ckpt.get("datamodule_hyper_parameters") or {}
    config, config_path = run_config(ckpt_path)
    model_cfg = ((config or {}).get("model") or {}).get("init_args") or {}
    objective = model_cfg.get("objective")
    if isinstance(objective, dict):
        args = objective.get("init_args") or {}
        objective = objective.get("class_path", "?").rsplit(".", 1)[-1] + (f" {json.dumps(args)}" if args else "")
    results, results_origin = find_results(ckpt_path, results_path)
    labels = "gold" if data.get("train_labels") == "gold" or not data.get("teacher_checkpoint") else "teacher's soft labels"
    return {
        "checkpoint": os.path.abspath(ckpt_path),
        "backbone": hp.get("backbone", NOT_RECORDED),
        "source": data.get("source", NOT_RECORDED),
        "train_subset": data.get("train_subset", NOT_RECORDED),
        "labels": labels if data else NOT_RECORDED,
        "ood_targets": data.get("ood_targets", []),
        "teacher": data.get("teacher_checkpoint") or data.get("weak_labels") or "none (trained on gold labels)",
        "objective": objective or NOT_RECORDED,
        "anchor_coef": hp.get("anchor_coef", NOT_RECORDED),
        "anchor_layers": hp.get("anchor_layers", NOT_RECORDED),
        "seed": (config or {}).get("seed_everything", data.get("seed", NOT_RECORDED)),
        "data_seed": data.get("seed", NOT_RECORDED),
        "max_length": data.get("max_length", NOT_RECORDED),
        "config": config_path or NOT_RECORDED,
        "results": results,
        "results_origin": results_origin,
    }


def accuracy_table(prov: dict) -> str:
    results = prov["results"]
    if not results:
        return f"Accuracies: {NOT_MEASURED} (give `--results <test_results.json or result.json>` to record them)."
    lines = ["| split | role | pairs | pairwise accuracy (%) |", "|---|---|---|---|"]
    for name, r in results.items():
        if isinstance(r, dict) and "acc" in r:
            role = "ID" if name == prov["source"] else "OOD"
            lines.append(f"| {name} | {role} | {r.get('pairs', '?')} | {100 * r['acc']:.2f} |")
    transfer = results.get("transfer")
    if transfer:
        lines.append(f"\nAgainst its teacher on the same pairs: WRG {transfer['wrg']:+.2f} pp, mean AOG "
                     f"{transfer['aog_mean']:+.2f} pp, NTS {transfer['nts']:+.2f} pp.")
    lines.append(f"\nMeasured by this codebase's `cli.py test` (`{prov['results_origin']}`).")
    return "\n".join(lines)


def _trained_part(train_subset: str) -> str:
    """What part of the source's train split trained the model: a W2S half, or all of it (plain `fit`)."""
    return "the whole train split" if train_subset == "all" else f"{train_subset} half"


def provenance_table(prov: dict) -> str:
    rows = [
        ("source data (ID)", f"`{prov['source']}`, {_trained_part(prov['train_subset'])}, {prov['labels']}"),
        ("OOD targets", ", ".join(f"`{t}`" for t in prov["ood_targets"]) or "none"),
        ("objective", prov["objective"]),
        ("ANCHOR λ (anchor_coef)", f"{prov['anchor_coef']} on depth fractions {prov['anchor_layers']}"),
        ("teacher", prov["teacher"]),
        ("seed", f"{prov['seed']} (data seed {prov['data_seed']})"),
        ("backbone", f"`{prov['backbone']}`"),
        ("max tokens per sequence in training", prov["max_length"]),
        ("checkpoint", f"`{prov['checkpoint']}`"),
        ("run config", f"`{prov['config']}`"),
    ]
    return "\n".join(["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows])


def render_card(title: str, front_matter: dict, summary: str, usage: str, prov: dict, check: str) -> str:
    front = yaml.safe_dump(front_matter, sort_keys=False).strip()
    return (f"---\n{front}\n---\n\n# {title}\n\n{summary}\n\n## Use\n\n{usage}\n\n## Provenance\n\n"
            f"{provenance_table(prov)}\n\n## Measured accuracies\n\n{accuracy_table(prov)}\n\n"
            f"## Export check\n\n{check}\n")
