"""SLO attainment of a finished run, per class and weighted (ALGORITHMS.md section 9; docs/concepts.md, "SLO tiers").

A request attains its class's SLO when it finished with TTFT <= ttft_k and TPOT <= tpot_k (a one-token output
meets any TPOT); a rejected request, early rejections included, misses. With n_k requests of class k, a_k of
them attaining:

- slo_attainment: the weighted attainment sum_k w_k a_k / sum_k w_k n_k (one class: a / n);
- slo_ttft_attainment / slo_tpot_attainment: the same over the TTFT / TPOT condition alone;
- slo_attainment_<class>, slo_ttft_attainment_<class>, slo_tpot_attainment_<class>, ttft_mean_<class>,
  ttft_p99_<class>, tpot_mean_<class>, tpot_p99_<class>: per class, in metrics.json only when a run has more
  than one class (their names depend on the classes);
- preemptions: preemptions summed over requests; early_rejections: requests rejected by admission control
  (reason `slo`);
- predictor_kendall_tau: Kendall's tau-b between predicted and true output lengths (NaN without a predictor).

goodput_rps (metrics.py) counts the attaining requests per second of makespan.
"""

from __future__ import annotations

import math

import numpy as np

from .classes import ClassTable
from .prediction import kendall_tau

SLO_KEYS = ("slo_attainment", "slo_ttft_attainment", "slo_tpot_attainment", "preemptions", "early_rejections",
            "predictor_kendall_tau")
PER_CLASS = ("slo_attainment", "slo_ttft_attainment", "slo_tpot_attainment", "ttft_mean", "ttft_p99", "tpot_mean",
             "tpot_p99")


def attainment(finished: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, cls: np.ndarray,
               table: ClassTable) -> tuple[np.ndarray, np.ndarray]:
    """Per request: (TTFT within its class's SLO, TPOT within it), both False for a request that did not finish."""
    one = table.single  # one class: its thresholds as scalars, not gathered per request (8 MB each at 1M)
    with np.errstate(invalid="ignore"):
        ttft_ok = finished & (ttft <= (table.ttft_s[0] if one else table.ttft_s[cls]))
        tpot_ok = finished & (np.isnan(tpot) | (tpot <= (table.tpot_s[0] if one else table.tpot_s[cls])))
    return ttft_ok, tpot_ok


def _weighted(ok: np.ndarray, cls: np.ndarray, table: ClassTable) -> float:
    if table.single:  # one weight: a stride-0 view of it, summed as the gathered copy is (8 MB less at 1M requests)
        def w(m: int) -> np.ndarray:
            return np.broadcast_to(table.weight[0], (m,))
        total, got = float(w(len(cls)).sum()), float(w(int(ok.sum())).sum())
    else:
        total = float(table.weight[cls].sum())
        got = float(table.weight[cls[ok]].sum())  # the values of weight[cls][ok], one full-length gather at a time
    return got / total if total > 0 else math.nan


def _stat(x: np.ndarray, fn) -> float:
    x = x[~np.isnan(x)]
    return float(fn(x)) if len(x) else math.nan


def slo_metrics(finished: np.ndarray, ttft: np.ndarray, tpot: np.ndarray, cls: np.ndarray, table: ClassTable,
                preemptions: np.ndarray, early: np.ndarray, predicted: np.ndarray | None,
                output: np.ndarray) -> dict:
    """The SLO_KEYS of one run, plus the per-class keys when it has more than one class (module docstring)."""
    ttft_ok, tpot_ok = attainment(finished, ttft, tpot, cls, table)
    both = ttft_ok & tpot_ok
    out = {
        "slo_attainment": _weighted(both, cls, table),
        "slo_ttft_attainment": _weighted(ttft_ok, cls, table),
        "slo_tpot_attainment": _weighted(tpot_ok, cls, table),
        "preemptions": int(preemptions.sum()),
        "early_rejections": int(early.sum()),
        "predictor_kendall_tau": kendall_tau(predicted, output),
    }
    if table.single:
        return out
    for k, name in enumerate(table.names):
        m = cls == k
        n = int(m.sum())
        out[f"slo_attainment_{name}"] = float(both[m].sum()) / n if n else math.nan
        out[f"slo_ttft_attainment_{name}"] = float(ttft_ok[m].sum()) / n if n else math.nan
        out[f"slo_tpot_attainment_{name}"] = float(tpot_ok[m].sum()) / n if n else math.nan
        fin = m & finished
        out[f"ttft_mean_{name}"] = _stat(ttft[fin], np.mean)
        out[f"ttft_p99_{name}"] = _stat(ttft[fin], lambda x: np.percentile(x, 99))
        out[f"tpot_mean_{name}"] = _stat(tpot[fin], np.mean)
        out[f"tpot_p99_{name}"] = _stat(tpot[fin], lambda x: np.percentile(x, 99))
    return out
