"""Held-out splits: one rule (envs/splits.py) for the rows training replays and the rows evaluation replays."""

from __future__ import annotations

import numpy as np
import pytest
from pdgym.envs.base import TraceWindow
from pdgym.envs.scenario import load_scenario, trace_splits
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.splits import segment, split_rows, trace_rows


def test_the_splits_share_no_row_and_cover_the_trace():
    splits = trace_splits()
    total = trace_rows("azure_conv")
    spans = sorted(split_rows("azure_conv", s, total)[:2] for s in splits.values())
    assert spans[0][0] == 0 and spans[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # adjacent, no gap, no overlap


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_training_windows_and_evaluation_segments_use_the_same_rows(split):
    sc = load_scenario("decode_tier_n16", ["workload.num_requests=150"])
    s = trace_splits()[split]
    lo, hi, n = split_rows(sc.sim.workload.trace, s, 150)
    window = TraceWindow(sc.sim, split, pinned=False, requests_given=True)
    assert window.rows == (lo, hi, n)
    rng = np.random.default_rng(0)
    for _ in range(20):  # every episode's rows lie inside the split
        wl = window.config(sc.sim, rng).workload
        assert lo <= wl.trace_offset and wl.trace_offset + wl.num_requests <= hi
    for i in range(20):  # and so does every evaluation run's
        seg = segment(sc.raw["workload"], s, i)
        assert seg["num_requests"] == n and lo <= seg["trace_offset"] <= hi - n


def test_a_closed_loop_trace_workload_is_windowed_too():
    """A closed loop replays the trace's rows (their lengths) as well: training keeps to its split there too."""
    sc = load_scenario("decode_tier_n16", ["workload.num_requests=150", "workload.arrival=closed"])
    assert TraceWindow(sc.sim, "train", pinned=False, requests_given=True).rows is not None


def test_a_split_without_rows_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^env.trace_split=x: trace_from/trace_to leave no rows"):
        split_rows("azure_conv", {"trace_from": 0.5, "trace_to": 0.5}, 10, key="env.trace_split=x")
