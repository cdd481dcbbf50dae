"""Statistics over seeds: the mean with a percentile-bootstrap interval, the paired ratio of two policies on the
same traffic, and the words for a difference (better / worse / no clear difference)."""

from __future__ import annotations

import math

import numpy as np
from pdgym.agents.evaluation.metric_keys import direction

BOOT_REPS = 4000


def interval(values, reps: int = BOOT_REPS) -> dict:
    """Mean, sample std and a 95% percentile-bootstrap interval of the mean over the finite values (NaN
    ones skipped). A bootstrap mean lies between the smallest and the largest value, so the interval of a
    non-negative metric never goes below zero (a Student-t interval over 2-3 seeds did). With fewer than
    about 5 values it is too narrow (any interval is): boards publish >= 5 seeds. Fixed resampling seed."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": 0}
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    if n == 1 or std == 0.0:
        return {"mean": mean, "std": std, "ci_low": mean, "ci_high": mean, "n": n}
    boot = x[np.random.default_rng(0).integers(0, n, size=(reps, n))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"mean": mean, "std": std, "ci_low": float(lo), "ci_high": float(hi), "n": n}


def paired_ratio(x, y, reps: int = BOOT_REPS) -> dict:
    """Paired comparison of a policy (`x`) with a reference (`y`), values aligned by seed (same traffic):
    the ratio of means minus one, mean(x) / mean(y) - 1, with a 95% paired bootstrap interval (the same
    resampled seeds for both). Seeds where either is NaN are dropped. Keys: rel, ci_low, ci_high, n."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    if n == 0 or y.mean() == 0:
        return {"rel": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": n}
    rel = float(x.mean() / y.mean() - 1.0)
    if n == 1:
        return {"rel": rel, "ci_low": math.nan, "ci_high": math.nan, "n": 1}
    idx = np.random.default_rng(0).integers(0, n, size=(reps, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = x[idx].mean(axis=1) / y[idx].mean(axis=1) - 1.0
    lo, hi = np.nanpercentile(boot, [2.5, 97.5])
    return {"rel": rel, "ci_low": float(lo), "ci_high": float(hi), "n": n}


def verdict(metric: str, rel: float, lo: float = math.nan, hi: float = math.nan) -> str:
    """Words for a relative difference on `metric`: 'better' / 'worse' by its direction, and 'no clear
    difference' when the interval [lo, hi] (if given) contains zero."""
    if not math.isfinite(rel):
        return "not comparable"
    if math.isfinite(lo) and math.isfinite(hi) and lo <= 0.0 <= hi:
        return "no clear difference"
    if rel == 0.0:
        return "equal"
    return "better" if direction(metric) * rel > 0 else "worse"


def describe(metric: str, label: str, ref: str, p: dict) -> str:
    """One sentence: 'X is 12.3% worse than Y on m (lower is better; paired 95% CI [+8.0%, +16.1%], 5 seeds)'."""
    arrow = "higher is better" if direction(metric) > 0 else "lower is better"
    v = verdict(metric, p["rel"], p.get("ci_low", math.nan), p.get("ci_high", math.nan))
    if not math.isfinite(p["rel"]):
        return f"{label} vs {ref} on {metric}: not comparable"
    ci = (f"; paired 95% CI [{p['ci_low']:+.1%}, {p['ci_high']:+.1%}]"
          if math.isfinite(p.get("ci_low", math.nan)) else "")
    size = f"{abs(p['rel']):.1%} " if v in ("better", "worse") else ""
    head = f"{label} is {size}{v} than {ref}" if v in ("better", "worse") else f"{label} vs {ref}: {v}"
    return f"{head} on {metric} ({metric} {p['rel']:+.1%}, {arrow}{ci}, {p['n']} seeds)"
