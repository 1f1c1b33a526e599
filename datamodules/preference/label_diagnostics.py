"""The weak teacher's error structure on the student half: how it is wrong, not only how often (docs/w2s.md).

Naive W2S fails out of distribution when the teacher's errors are *systematic* along a source-domain feature (the
synthetic benchmark's artifact) and mixed with errors a stronger student corrects. These numbers say which kind of
teacher a run had. They use the teacher's own soft labels (before `--data.label_temperature`), so every
temperature of one teacher reports the same structure.
"""
from __future__ import annotations

from typing import Callable, Optional

# (record) -> "chosen" / "rejected" (the response that carries a known surface artifact) or None
ArtifactSide = Callable[[dict], Optional[str]]


def weak_label_diagnostics(records: list[dict], labels: dict[str, tuple[float, bool]],
                           artifact_side: Optional[ArtifactSide] = None) -> dict:
    """Error rate and confidence of the teacher's labels on `records`, split by where the artifact sits.

    labels: record id -> (q = P(a ≻ b), swapped), swapped meaning a = rejected (the weak-label file's format).
    A pair counts as an error unless the teacher gives the gold-chosen response P > 0.5 (as `gold_agreement`).
    Confidence = max(P, 1 − P). With `artifact_side`, also: the share of pairs and of errors with the artifact on
    the rejected response, the error rate on each side, and the labels' agreement with the artifact.
    """
    rows = []
    for r in records:
        q, swapped = labels[r["id"]]
        p_chosen = 1.0 - q if swapped else q
        rows.append((p_chosen > 0.5, max(p_chosen, 1.0 - p_chosen), artifact_side(r) if artifact_side else None,
                     p_chosen))
    if not rows:
        raise ValueError("weak_label_diagnostics: no pairs")
    wrong = [row for row in rows if not row[0]]
    right = [row for row in rows if row[0]]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    out = {
        "pairs": len(rows),
        "error_rate": len(wrong) / len(rows),
        "confidence_when_wrong": mean([c for _, c, _, _ in wrong]),
        "confidence_when_right": mean([c for _, c, _, _ in right]),
    }
    sides = [side for _, _, side, _ in rows]
    if artifact_side is None or all(s is None for s in sides):
        return out
    on_rejected = [row for row in rows if row[2] == "rejected"]
    on_chosen = [row for row in rows if row[2] == "chosen"]
    with_artifact = on_rejected + on_chosen
    out.update({
        "artifact_on_rejected_share": len(on_rejected) / len(rows),
        "errors_with_artifact_on_rejected": mean([float(row[2] == "rejected") for row in wrong]),
        "error_rate_artifact_on_rejected": mean([float(not row[0]) for row in on_rejected]),
        "error_rate_artifact_on_chosen": mean([float(not row[0]) for row in on_chosen]),
        # the labels side with the artifact: P(artifact response) > 0.5
        "agreement_with_artifact": mean([float((p > 0.5) == (side == "chosen")) for _, _, side, p in with_artifact]),
    })
    return out
