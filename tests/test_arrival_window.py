"""envs/arrival_window.py: the offered-load feature of both prefill envs, kept with a running token sum, equals a
re-summation of the last `size` arrivals (computed here from the whole list, independently) at every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pdgym.envs.arrival_window import ArrivalWindow


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.floats(0.0, 2.0), min_size=0, max_size=200), size=st.integers(1, 70),
       tokens=st.lists(st.integers(1, 10**6), min_size=200, max_size=200), cap=st.floats(1.0, 1e7))
def test_load_equals_a_resummation_of_the_last_arrivals(gaps, size, tokens, cap):
    win, seen, now = ArrivalWindow(size), [], 0.0
    for gap, tok in zip(gaps, tokens, strict=False):
        now += gap
        win.add(now, tok)
        seen.append((now, tok))
        last = seen[-size:]
        later = now + 0.5
        want = sum(t for _, t in last) / (later - last[0][0]) / cap if len(last) >= 2 else 0.0
        assert win.load(later, cap) == want  # bit-identical: the token sum is an exact integer either way


def test_a_single_arrival_or_no_time_span_is_no_load():
    win = ArrivalWindow(4)
    assert win.load(1.0, 10.0) == 0.0
    win.add(1.0, 100)
    assert win.load(5.0, 10.0) == 0.0
    win.add(1.0, 100)
    assert win.load(1.0, 10.0) == 0.0  # two arrivals at the same instant span no time
    assert win.load(3.0, 10.0) == 200 / 2.0 / 10.0
