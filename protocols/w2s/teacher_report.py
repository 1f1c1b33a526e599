"""What the report says of the weak teacher: the recipe its search chose per seed, the chosen teacher's structure
(shortcut probe), and its labels' error structure on the student half; protocols/w2s/report.py places them."""
from __future__ import annotations

from protocols.engine.stats import percent


WEAK_LABEL_METHODS_EXCLUDED = ("teacher", "ceiling")


def teacher_recipe(raw: dict[str, dict[int, dict]]) -> tuple[dict[int, dict], dict[int, dict]]:
    """Per seed, the teacher search's record (`protocols.w2s.teacher_search`) and the chosen teacher's structure read
    with the shortcut probe (`protocols.w2s.shortcut_probe.measure`); empty when the teacher was fitted once."""
    searches, structures = {}, {}
    for seed, stage in sorted((raw.get("teacher") or {}).items()):
        if "teacher_search" in stage:
            searches[seed] = stage["teacher_search"]
        if "teacher_structure" in stage:
            structures[seed] = stage["teacher_structure"]
    return searches, structures


def teacher_recipe_markdown(searches: dict[int, dict]) -> str:
    """What the teacher search chose per seed and why (above the table: a list, so the table stays the first)."""
    from protocols.w2s.teacher_search import search_markdown

    if not searches:
        return ""
    return "\n".join(["The weak teacher's recipe, searched per seed on the validation split "
                      "(`protocols.w2s.teacher_search`; docs/teacher_structure.md):", search_markdown(searches)])


def teacher_structure_markdown(structures: dict[int, dict]) -> str:
    """The chosen teacher's structure per seed and split (below the table)."""
    lines: list[str] = []
    if structures:
        lines += ["The chosen teacher's structure (shortcut probe fitted on the teacher half; test splits "
                  "reported, never searched on): accuracy on the pairs where the probe is wrong, and the share "
                  "of its errors that are there (beside the share of such pairs).", "",
                  "| seed | split | teacher acc | right where the probe is wrong (pairs) | errors there / all errors "
                  "| probe-wrong share of pairs |", "|---|---|---|---|---|---|"]
        for seed, m in sorted(structures.items()):
            for split, st in m["structure"].items():
                lines.append(f"| {seed} | {split} | {percent(st['teacher_acc'])} | "
                             f"{percent(st['probe_wrong']['teacher_acc'])} ({st['probe_wrong']['pairs']}) | "
                             f"{percent(st['shortcut_error_share'])} ({st['shortcut_errors']}/{st['teacher_errors']}) | "
                             f"{percent(st['probe_wrong_share'])} |")
    return "\n".join(lines)


def teacher_label_structure(raw: dict[str, dict[int, dict]]) -> dict[int, dict]:
    """Per seed, the teacher's error structure on the student half (`datamodules.preference.label_diagnostics`),
    as the first weak-label stage of that seed recorded it."""
    out: dict[int, dict] = {}
    for method, per_seed in raw.items():
        if method in WEAK_LABEL_METHODS_EXCLUDED:
            continue
        for seed, stage in per_seed.items():
            if "teacher_labels" in stage and seed not in out:
                out[seed] = stage["teacher_labels"]
    return dict(sorted(out.items()))


def teacher_label_table(structure: dict[int, dict]) -> str:
    if not structure:
        return ""
    cols = [("error_rate", "error rate"), ("errors_with_artifact_on_rejected", "errors with the artifact on rejected"),
            ("error_rate_artifact_on_rejected", "error rate, artifact on rejected"),
            ("error_rate_artifact_on_chosen", "error rate, artifact on chosen"),
            ("agreement_with_artifact", "labels agree with the artifact"),
            ("confidence_when_wrong", "confidence when wrong"), ("confidence_when_right", "confidence when right")]
    cols = [(k, name) for k, name in cols if any(k in d for d in structure.values())]
    lines = ["The teacher's labels on the student half (shares; confidence = max(P, 1 − P)):", "",
             "| seed | " + " | ".join(name for _, name in cols) + " |", "|---|" + "---|" * len(cols)]
    for seed, d in structure.items():
        lines.append(f"| {seed} | " + " | ".join(f"{d[k]:.3f}" if k in d else "–" for k, _ in cols) + " |")
    return "\n".join(lines)
