"""The metrics every evaluation reports (METRIC_KEYS: the simulator's summary plus evaluation's own) and the
direction of each (higher or lower is better), for ranking, "best" checkpoints and the leaderboard."""

from __future__ import annotations

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import SUMMARY_KEYS
from pdgym.envs.sim.points import POINTS as DECISION_POINTS
from pdgym.envs.sim.slo import PER_CLASS

POINTS = tuple(DECISION_POINTS)  # prefill, decode, batching (envs/sim/points.py)
EXTRA_KEYS = ("tpot_p50", "tpot_p99", "batch_mean", "pool_mean", "pool_empty_frac")
METRIC_KEYS = tuple(k for k in SUMMARY_KEYS if k != "wall_time_s") + EXTRA_KEYS + ("wall_time_s",)
# Direction of every metric: +1 higher is better, -1 lower is better (ranking and "best" checkpoints).
HIGHER_BETTER = {"throughput_tok_s", "total_tok_s", "rps", "goodput_rps", "goodput_per_gpu", "chunk_util_mean",
                 "finished", "slo_attainment", "slo_ttft_attainment", "slo_tpot_attainment", "prefix_hit_ratio",
                 "predictor_kendall_tau"}
# A run with several SLO classes adds per-class keys, `<key>_<class>` for each key of PER_CLASS (envs/sim/slo.py:
# slo_attainment_chat, ttft_p99_batch, ...): metrics too, named by the scenario's classes, each in its key's direction.
CLASS_METRIC_FORM = ", ".join(f"{k}_<class>" for k in PER_CLASS)


def class_metric(metric: str) -> str | None:
    """The PER_CLASS key of a per-class metric name (`slo_attainment_chat` -> slo_attainment), else None."""
    if not isinstance(metric, str) or metric in METRIC_KEYS:
        return None
    return next((k for k in PER_CLASS if metric.startswith(k + "_") and len(metric) > len(k) + 1), None)


def is_metric(metric: str) -> bool:
    """One of METRIC_KEYS or a per-class metric name."""
    return metric in METRIC_KEYS or class_metric(metric) is not None


def metric_columns(columns) -> list[str]:
    """The metric columns among `columns` (a runs table's), per-class ones included."""
    return [c for c in columns if is_metric(c)]


def direction(metric: str) -> int:
    return 1 if (class_metric(metric) or metric) in HIGHER_BETTER else -1


def check_metric_names(key: str, names) -> list[str]:
    """A list of metric names, each one of METRIC_KEYS or a per-class name (one-line error naming `key` otherwise)."""
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{key}: got {names!r}; must be a non-empty list of metric names")
    for m in names:
        if not is_metric(m):
            raise ConfigError(f"{key}: unknown metric {m!r}; allowed: {', '.join(METRIC_KEYS)}, or per SLO class "
                              f"{CLASS_METRIC_FORM}")
    return list(names)
