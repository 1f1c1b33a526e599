"""Statistics over seeds that every protocol's tables use: mean and sample std, the 95% Student-t interval of a mean,
and percent formatting."""
from __future__ import annotations

import math
import statistics
from typing import Optional


def mean_std(values: list[float]) -> tuple[float, Optional[float], int]:
    """Mean, sample std (None below two values: one seed has no spread to report) and count, NaNs left out."""
    vals = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return float("nan"), None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


# Two-sided 95% Student-t critical values by degrees of freedom (n seeds − 1); the normal 1.96 beyond 30.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042}


def ci95(mean: float, std: Optional[float], n: int) -> Optional[tuple[float, float]]:
    """The 95% t-interval of a mean over n seeds (None below two seeds)."""
    if std is None or n < 2:
        return None
    df = n - 1
    t = _T975.get(df) or (_T975[max(k for k in _T975 if k <= df)] if df <= 30 else 1.96)
    half = t * std / math.sqrt(n)
    return mean - half, mean + half


def percent(v: Optional[float], unit: str = "") -> str:
    """A percentage to one decimal ("–" when unmeasured)."""
    return "–" if v is None else f"{v:.1f}{unit}"
