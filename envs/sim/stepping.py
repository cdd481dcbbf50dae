"""Decode stepping, shared by decode instances and colocated units (one definition of each rule).

Both run decode in steps: every decoding request gains one token per step. A request's
finish step is known when it starts decoding (steps now + tokens left), so finishing is
O(1): it waits in a bucket keyed by that step (lazy deletion: a preempted request's stale
entry is skipped). Per-token times are not stored; each step's end time and its gap to the
previous step are, so a request's longest inter-token gap is settled per decode segment.
"""

from __future__ import annotations

import numpy as np

from . import requests as R
from .requests import RequestTable


class GrowingArray:
    """An append-only float64 vector (step end times) with amortised O(1) appends."""

    __slots__ = ("data", "n")

    def __init__(self, capacity: int = 1024):
        self.data = np.empty(capacity)
        self.n = 0

    def append(self, x: float) -> None:
        if self.n == len(self.data):
            self.data = np.concatenate([self.data, np.empty(len(self.data))])
        self.data[self.n] = x
        self.n += 1


class Stepper:
    """Step clock, finish buckets and preemption of one decode engine (decode instance or colocated unit)."""

    def __init__(self) -> None:
        self.steps = 0  # completed steps
        self.step_t = GrowingArray()  # step_t.data[s - 1] = end time of step s
        self.last_t = 0.0  # step_t's last entry, a Python float
        self.gap = GrowingArray()  # gap.data[s - 1] = end of step s minus end of step s - 1
        self.buckets: dict[int, list[int]] = {}  # finish step -> requests (lazy deletion on preempt)

    def tick(self, now: float) -> int:
        """A step ended at `now`; returns its number."""
        self.steps += 1
        s = self.steps
        self.gap.append(now - self.last_t if s > 1 else 0.0)
        self.step_t.append(now)
        self.last_t = now
        return s

    def start_decoding(self, req: RequestTable, rid: int, now: float) -> None:
        """`rid` decodes from the next step on; it is due in the bucket of its finish step."""
        fs = req.admit_decode(rid, now, self.steps)
        self.buckets.setdefault(fs, []).append(rid)

    def due(self, req: RequestTable, s: int) -> list[int]:
        """Requests whose last token came with step `s` (stale bucket entries dropped)."""
        bucket = self.buckets.pop(s, None)
        if not bucket:
            return []
        return [rid for rid in bucket if req.finish_step[rid] == s and req.state[rid] == R.DECODE]

    def complete(self, req: RequestTable, rid: int) -> None:
        """Account a due request's last decode segment; it now holds its whole output."""
        self.segment_itl(req, rid, int(req.admit_step[rid]), self.steps)
        req.done[rid] = req.output[rid]

    def preempt_youngest(self, req: RequestTable, running) -> int:
        """Stop the latest-admitted request of `running` (ties: highest id); returns it, its `done` settled."""
        return self.preempt(req, max(running, key=lambda r: (req.admit_step[r], r)))

    def preempt(self, req: RequestTable, rid: int) -> int:
        """Stop running request `rid`; returns it, its `done` settled."""
        s0 = int(req.admit_step[rid])
        self.segment_itl(req, rid, s0, self.steps)
        req.preempt(rid, self.steps)
        return rid

    def segment_itl(self, req: RequestTable, rid: int, s0: int, s1: int) -> None:
        """Account the tokens of steps s0+1..s1 of `rid` in its longest inter-token gap."""
        if s1 <= s0:
            return
        g = self.step_t.data[s0] - req.last_tok[rid]
        if s1 - s0 > 1:
            g = max(g, float(self.gap.data[s0 + 1:s1].max()))
        req.itl_max[rid] = max(req.itl_max[rid], g)
        req.last_tok[rid] = self.step_t.data[s1 - 1]
