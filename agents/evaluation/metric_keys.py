"""The metrics every evaluation reports (METRIC_KEYS: the simulator's summary plus evaluation's own) and the
direction of each (higher or lower is better), for ranking, "best" checkpoints and the leaderboard."""

from __future__ import annotations

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import SUMMARY_KEYS
from pdgym.envs.sim.points import POINTS as DECISION_POINTS

POINTS = tuple(DECISION_POINTS)  # prefill, decode, batching (envs/sim/points.py)
EXTRA_KEYS = ("tpot_p50", "tpot_p99", "batch_mean", "pool_mean", "pool_empty_frac")
METRIC_KEYS = tuple(k for k in SUMMARY_KEYS if k != "wall_time_s") + EXTRA_KEYS + ("wall_time_s",)
# Direction of every metric: +1 higher is better, -1 lower is better (ranking and "best" checkpoints).
HIGHER_BETTER = {"throughput_tok_s", "total_tok_s", "rps", "goodput_rps", "goodput_per_gpu", "chunk_util_mean",
                 "finished", "slo_attainment", "prefix_hit_ratio"}


def direction(metric: str) -> int:
    return 1 if metric in HIGHER_BETTER else -1


def check_metric_names(key: str, names) -> list[str]:
    """A list of metric names, each one of METRIC_KEYS (one-line error naming `key` otherwise)."""
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{key}: got {names!r}; must be a non-empty list of metric names")
    for m in names:
        if m not in METRIC_KEYS:
            raise ConfigError(f"{key}: unknown metric {m!r}; allowed: {', '.join(METRIC_KEYS)}")
    return list(names)
