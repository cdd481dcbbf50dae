"""The offered load both prefill envs observe: prompt tokens of the last fresh arrivals over the time they span,
as a fraction of the prefill tier's token capacity.

The window's token total is kept as a running sum of Python ints, exact in any order, so the feature is
bit-identical to re-summing the window at every step (what it did before: 64 generator steps per observation).
"""

from __future__ import annotations

from collections import deque


class ArrivalWindow:
    """(time, prompt tokens) of the last `size` fresh arrivals and their token total."""

    __slots__ = ("_win", "_tokens")

    def __init__(self, size: int = 64):
        self._win: deque[tuple[float, int]] = deque(maxlen=size)
        self._tokens = 0

    def add(self, t: float, tokens: int) -> None:
        win = self._win
        if len(win) == win.maxlen:
            self._tokens -= win[0][1]
        win.append((t, tokens))
        self._tokens += tokens

    def note(self, sim, rid: int) -> bool:
        """Add request `rid`'s arrival if it is fresh (not bounced back or preempted); True if it was."""
        req = sim.req
        fresh = bool(req.buf_t[rid] == req.arrival[rid])
        if fresh:
            self.add(sim.now, int(req.prompt[rid]))
        return fresh

    def load(self, now: float, cap_tok_s: float) -> float:
        """Tokens arrived per second over the window, over `cap_tok_s`; 0 until two arrivals span some time."""
        win = self._win
        if len(win) >= 2 and now > win[0][0]:
            return self._tokens / (now - win[0][0]) / cap_tok_s
        return 0.0
