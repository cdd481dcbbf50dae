"""Output-length predictions of set quality: the signal a length-aware scheduler (SJF, learning to rank) reads
(ALGORITHMS.md section 9; docs/concepts.md, "Length predictor").

`workload.predictor.kind`:

    none       no prediction (`predicted` is absent; a policy that needs one is refused at reset);
    oracle     the true output length;
    lognormal  true x exp(sigma x z), z ~ N(0, 1) per request (`sigma` >= 0; 0 is the oracle);
    buckets    a classifier into `buckets` k >= 2 equal-probability length classes of the run's outputs, wrong with
               probability `confusion` (then a uniformly drawn other bucket); the prediction is the median true
               length of the predicted bucket.

Drawn from a generator spawned apart from the traffic's, so a predictor changes no arrival or length. The
quality a researcher sweeps against is Kendall's tau between predicted and true lengths (`kendall_tau`,
metrics.json `predictor_kendall_tau`); for the lognormal kind on lognormal lengths with log-sd s it is
(2 / pi) arcsin(s / sqrt(s^2 + sigma^2)).

This is the start-of-request length known at arrival. BR-H's predictors (baselines/predictors.py) answer another
question, the remaining length of a running request at its age, learned from a training split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .validation import check, is_num

__all__ = ["PREDICTOR_KINDS", "PredictorConfig", "kendall_tau", "predict_lengths"]

PREDICTOR_KINDS = ("none", "oracle", "lognormal", "buckets")


@dataclass
class PredictorConfig:
    """`workload.predictor`: how each request's output length is predicted at arrival."""

    kind: str = "none"  # none | oracle | lognormal | buckets
    sigma: float = 0.5  # lognormal: sd of the log-error
    buckets: int = 4  # buckets: number of length classes
    confusion: float = 0.1  # buckets: probability of a wrong class

    def validate(self, key: str = "workload.predictor") -> None:
        check(self.kind in PREDICTOR_KINDS, f"{key}.kind", f"got {self.kind!r}; allowed: {', '.join(PREDICTOR_KINDS)}")
        check(is_num(self.sigma) and math.isfinite(float(self.sigma)) and self.sigma >= 0, f"{key}.sigma",
              f"got {self.sigma!r}; must be a finite number >= 0")
        check(isinstance(self.buckets, int) and not isinstance(self.buckets, bool) and self.buckets >= 2,
              f"{key}.buckets", f"got {self.buckets!r}; must be an integer >= 2")
        check(is_num(self.confusion) and 0 <= self.confusion <= 1, f"{key}.confusion",
              f"got {self.confusion!r}; allowed [0, 1]")


def predict_lengths(cfg: PredictorConfig, output: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """Predicted output length (int64, >= 1) of every request, or None for kind none."""
    kind = cfg.kind
    if kind == "none":
        return None
    out = np.asarray(output, dtype=np.int64)
    if kind == "oracle":
        return out.copy()
    if kind == "lognormal":
        z = rng.standard_normal(out.shape[0])
        return np.maximum(np.rint(out * np.exp(float(cfg.sigma) * z)), 1).astype(np.int64)
    k = int(cfg.buckets)
    edges = np.quantile(out, np.arange(1, k) / k)
    true_b = np.searchsorted(edges, out, side="right")
    wrong = rng.random(out.shape[0]) < float(cfg.confusion)
    shift = rng.integers(1, k, size=out.shape[0])  # another bucket, uniformly: (b + shift) mod k
    pred_b = np.where(wrong, (true_b + shift) % k, true_b)
    med = np.array([np.median(out[true_b == b]) if (true_b == b).any() else np.nan for b in range(k)])
    fill = np.interp(np.arange(k), np.flatnonzero(~np.isnan(med)), med[~np.isnan(med)])  # an empty bucket
    return np.maximum(np.rint(fill[pred_b]), 1).astype(np.int64)


def kendall_tau(predicted: np.ndarray | None, output: np.ndarray) -> float:
    """Kendall's tau-b between predicted and true lengths (NaN without a predictor or with < 2 requests)."""
    if predicted is None or len(output) < 2:
        return math.nan
    from scipy.stats import kendalltau

    tau = kendalltau(predicted, output).statistic
    return float(tau)
