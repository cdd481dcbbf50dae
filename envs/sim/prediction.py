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

from .traces import MAX_TRACE_TOKENS
from .validation import check, is_num

__all__ = ["PREDICTOR_KINDS", "PredictorConfig", "kendall_tau", "predict_lengths"]

PREDICTOR_KINDS = ("none", "oracle", "lognormal", "buckets")
# sigma's bound: at sigma = 10 the predictions hold almost no rank signal (Kendall's tau (2/pi) arcsin(s / sqrt(s^2 +
# sigma^2)) = 0.06 for outputs of log-sd s = 1), so nothing is lost to a sweep; beyond it exp(sigma z) leaves float64
# (exp(710) = inf), and before the clip below the cast to int64 wrapped to -2**63 (served first by SJF).
MAX_SIGMA = 10.0
# buckets' bound: equal-probability classes of the run's output lengths; more than this leaves most buckets empty
# for any workload pdgym runs (a bucket per 1,000th of the outputs is already finer than any length classifier),
# and the per-bucket medians cost memory in proportion (1e9 buckets asked for 7.45 GiB).
MAX_BUCKETS = 1000
# a prediction is a request's output length: clipped (in float, before the cast) to what a request may hold
MAX_PREDICTION = MAX_TRACE_TOKENS


@dataclass
class PredictorConfig:
    """`workload.predictor`: how each request's output length is predicted at arrival."""

    kind: str = "none"  # none | oracle | lognormal | buckets
    sigma: float = 0.5  # lognormal: sd of the log-error
    buckets: int = 4  # buckets: number of length classes
    confusion: float = 0.1  # buckets: probability of a wrong class

    def validate(self, key: str = "workload.predictor") -> None:
        check(self.kind in PREDICTOR_KINDS, f"{key}.kind", f"got {self.kind!r}; allowed: {', '.join(PREDICTOR_KINDS)}")
        check(is_num(self.sigma) and math.isfinite(float(self.sigma)) and 0 <= self.sigma <= MAX_SIGMA,
              f"{key}.sigma", f"got {self.sigma!r}; allowed [0, {MAX_SIGMA:g}] (at {MAX_SIGMA:g} Kendall's tau is "
                              "~0.06 already: no rank signal left to sweep)")
        check(isinstance(self.buckets, int) and not isinstance(self.buckets, bool) and 2 <= self.buckets <= MAX_BUCKETS,
              f"{key}.buckets", f"got {self.buckets!r}; must be an integer in [2, {MAX_BUCKETS}] (equal-probability "
                                "classes of the run's output lengths; more leaves most of them empty)")
        check(is_num(self.confusion) and 0 <= self.confusion <= 1, f"{key}.confusion",
              f"got {self.confusion!r}; allowed [0, 1]")


def predict_lengths(cfg: PredictorConfig, output: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """Predicted output length (int64 in [1, MAX_PREDICTION]) of every request, or None for kind none."""
    kind = cfg.kind
    if kind == "none":
        return None
    out = np.asarray(output, dtype=np.int64)
    if kind == "oracle":
        return out.copy()
    if kind == "lognormal":
        z = rng.standard_normal(out.shape[0])
        return _lengths(out * np.exp(float(cfg.sigma) * z))
    k = int(cfg.buckets)
    edges = np.quantile(out, np.arange(1, k) / k)
    true_b = np.searchsorted(edges, out, side="right")
    wrong = rng.random(out.shape[0]) < float(cfg.confusion)
    shift = rng.integers(1, k, size=out.shape[0])  # another bucket, uniformly: (b + shift) mod k
    pred_b = np.where(wrong, (true_b + shift) % k, true_b)
    med = np.array([np.median(out[true_b == b]) if (true_b == b).any() else np.nan for b in range(k)])
    fill = np.interp(np.arange(k), np.flatnonzero(~np.isnan(med)), med[~np.isnan(med)])  # an empty bucket
    return _lengths(fill[pred_b])


def _lengths(x: np.ndarray) -> np.ndarray:
    """Float predictions as lengths: rounded and clipped to [1, MAX_PREDICTION] while still float (inf included),
    so the int64 cast never wraps (an overflowed exp once became -2**63, served first by SJF)."""
    return np.clip(np.rint(x), 1, MAX_PREDICTION).astype(np.int64)


def kendall_tau(predicted: np.ndarray | None, output: np.ndarray) -> float:
    """Kendall's tau-b between predicted and true lengths (NaN without a predictor or with < 2 requests)."""
    if predicted is None or len(output) < 2:
        return math.nan
    from scipy.stats import kendalltau

    tau = kendalltau(predicted, output).statistic
    return float(tau)
