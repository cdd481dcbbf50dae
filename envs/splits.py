"""Held-out splits of a trace (conf/splits): which rows of a trace a split owns, and which of them a run replays.

One rule for training (envs/base.TraceWindow, agents/training/env_factory.py) and evaluation
(agents/evaluation): a split owns rows [int(trace_from x N), int(trace_to x N)) of an N-row trace, so adjacent
splits share no row and together cover the trace; a run replays `num_requests` rows of them (fewer when the
split holds fewer). It applies to every workload that reads a trace (`workload.trace` set, whatever its
arrival: closed loop replays the trace's lengths row by row too). Run `index` of an evaluation replays the rows
from lo + (index x n) mod (hi - lo - n + 1); a training episode draws that start uniformly.
"""

from __future__ import annotations

import functools

from pdgym.envs.sim.config import ConfigError


@functools.lru_cache(maxsize=8)
def trace_rows(trace: str) -> int:
    """Rows of a trace (a shipped name or a CSV path)."""
    from pdgym.envs.sim.traces import load_trace

    return len(load_trace(trace))


def split_rows(trace: str, split: dict, num_requests: int, key: str = "splits") -> tuple[int, int, int]:
    """(lo, hi, n): the split owns rows [lo, hi) of `trace`; a run replays n = min(num_requests, hi - lo) of
    them. A split holding no row is a ConfigError naming `key`."""
    total = trace_rows(str(trace))
    lo, hi = int(split["trace_from"] * total), int(split["trace_to"] * total)
    if hi <= lo:
        raise ConfigError(f"{key}: trace_from/trace_to leave no rows of {trace!r} ({total} rows)")
    return lo, hi, min(int(num_requests), hi - lo)


def requests(value) -> int:
    """workload.num_requests as the integer >= 1 it must be (nan, 1.5, 'abc' or a bool: one ConfigError line)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value >= 1 \
        and value != float("inf") and int(value) == value
    if not ok:
        raise ConfigError(f"workload.num_requests: got {value!r}; must be an integer >= 1")
    return int(value)


def segment(workload: dict, split: dict | None, index: int) -> dict:
    """Workload keys that put run `index` of a split on its own rows of the trace (empty if no trace or split)."""
    if not split or not workload.get("trace"):
        return {}
    lo, hi, n = split_rows(str(workload["trace"]), split, requests(workload.get("num_requests")))
    return {"trace_offset": lo + (index * n) % (hi - lo - n + 1), "num_requests": n}


def split_seed(split: dict | None, index: int) -> int:
    """The simulator seed of run `index` of a split (the split's seed_base + index; no split: the index)."""
    return int(split["seed_base"]) + int(index) if split else int(index)


def apply_split(raw: dict, split: dict | None, index: int) -> tuple[dict, int]:
    """(composed config with the split's trace segment for run `index`, simulator seed)."""
    seg = segment(raw["workload"], split, index)
    if seg:
        raw = dict(raw, workload=dict(raw["workload"], **seg))
    return raw, split_seed(split, index)


def segment_overrides(raw: dict, split: dict | None, index: int) -> list[str]:
    """The same segment as Hydra override strings (what the Gymnasium envs take)."""
    return [f"workload.{k}={v}" for k, v in segment(raw["workload"], split, index).items()]
