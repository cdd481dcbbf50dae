"""The PrefillDispatch env's reward meter: request-seconds spent waiting for a first token, kept incrementally."""

from __future__ import annotations

import math

import numpy as np
from pdgym.envs.sim import requests as R


class WaitMeter:
    """Integral over time of the number of arrived requests still waiting for their first token.

    Requests arrive in id order, so a window [lo, hi) holds every request that may still be
    waiting; the closed ones below it are folded into running sums.
    """

    def __init__(self, sim):
        self.sim = sim
        self.lo = self.hi = 0
        self.closed = 0.0  # waiting time of the requests below lo
        self.n_first = 0  # requests below lo that got a first token ...
        self.ttft_sum = 0.0  # ... and their TTFTs
        self.n_rejected = 0  # requests below lo rejected before their first token

    def total(self) -> tuple[float, int, int]:
        """(waiting time so far, first tokens so far, rejections before a first token so far)."""
        sim = self.sim
        req, now, n = sim.req, sim.now, sim.req.n
        arrival, first, state = req.arrival, req.first_token, req.state
        while self.hi < n and arrival[self.hi] <= now:
            self.hi += 1
        while self.lo < self.hi and (not math.isnan(first[self.lo]) or state[self.lo] == R.REJECTED):
            i = self.lo
            if math.isnan(first[i]):
                self.closed += req.finish[i] - arrival[i]
                self.n_rejected += 1
            else:
                w = first[i] - arrival[i]
                self.closed += w
                self.ttft_sum += w
                self.n_first += 1
            self.lo += 1
        sl = slice(self.lo, self.hi)
        f = first[sl]
        rej = state[sl] == R.REJECTED
        end = np.where(np.isnan(f), np.where(rej, req.finish[sl], now), f)
        got = ~np.isnan(f)
        return (self.closed + float((end - arrival[sl]).sum()), self.n_first + int(got.sum()),
                self.n_rejected + int((rej & ~got).sum()))
