"""Capacity rules for the elastic P/D decision point (envs/sim/capacity.py; ALGORITHMS.md section 10): what
production autoscalers do, each with the knobs a tuner searches (GRID, searched on the training days only).

- static: the best fixed P:D split, found by search (DistServe-style); reached from the initial fleet, then held.
- threshold: a utilisation / queue autoscaler with hysteresis: scale a pool up above `hi`, down below `lo`, at most
  one change per `cooldown` intervals per pool.
- heteroscale: one signal sizes both pools (HeteroScale, arXiv 2508.19559): decode instances = output-token demand
  / `tps_per_decode`, prefill = `ratio` x decode (rounded up).
- lend: TokenScale / Arrow-like (arXiv 2512.03416, 2505.11916): the threshold autoscaler, plus decode instances lent
  to prefill (a flip, seconds) when the prefill queue bursts while decode has room, returned when it calms.

A rule is `act(run) -> action` (an index of ACTIONS) on a CapacityRun, after `reset(run)`; CAPACITY_RULES names
them. Every rule only reads what a reactive controller measures (CapacityRun.signals: the last interval).
"""

from __future__ import annotations

import math

from pdgym.envs.sim.capacity import DOWN_D, DOWN_P, FLIP_DP, FLIP_PD, NOOP, UP_D, UP_P, CapacityRun


def toward(run: CapacityRun, tp: int, td: int, allow_up: bool = True) -> int:
    """One action moving the fleet (serving + on its way) toward `tp` prefill and `td` decode instances: a flip
    where one role is over and the other under (seconds, not a cold start), else a scale-down, else a scale-up."""
    m = run.mask()
    cp = run.count("P") + run.pending("P")
    cd = run.count("D") + run.pending("D")
    if cp < tp and cd > td and m[FLIP_DP]:
        return FLIP_DP
    if cd < td and cp > tp and m[FLIP_PD]:
        return FLIP_PD
    if cp > tp and m[DOWN_P]:
        return DOWN_P
    if cd > td and m[DOWN_D]:
        return DOWN_D
    if allow_up and cp < tp and m[UP_P]:
        return UP_P
    if allow_up and cd < td and m[UP_D]:
        return UP_D
    return NOOP


class CapacityRule:
    """A rule with named knobs (GRID: the values a tuner tries)."""

    name = "base"
    GRID: dict[str, list] = {}

    def __init__(self, **params):
        self.params = params

    def reset(self, run: CapacityRun) -> None:
        """Called once before the episode's first action."""

    def act(self, run: CapacityRun) -> int:
        raise NotImplementedError


class StaticSplit(CapacityRule):
    name = "static"
    GRID = {"p": list(range(1, 12)), "d": list(range(1, 9))}

    def __init__(self, p: int = 4, d: int = 3):
        super().__init__(p=p, d=d)

    def act(self, run):
        return toward(run, self.params["p"], self.params["d"])


class ThresholdAutoscaler(CapacityRule):
    """Prefill pool on its utilisation (offered prompt work / serving capacity, last interval) or its queue wait;
    decode pool on its slot occupancy or a queue for slots; hysteresis band [lo, hi] and a cooldown."""

    name = "threshold"
    GRID = {"hi": [0.5, 0.6, 0.7, 0.8, 0.9, 0.95], "lo": [0.3, 0.4, 0.5], "cooldown": [1, 2, 4]}

    def __init__(self, hi: float = 0.8, lo: float = 0.4, cooldown: int = 4):
        super().__init__(hi=hi, lo=lo, cooldown=cooldown)

    def reset(self, run):
        self.last = {"P": -math.inf, "D": -math.inf}

    def wants(self, run, s) -> tuple[int, int]:
        """The pool changes the signals ask for: +1 / 0 / -1 per role."""
        hi, lo = self.params["hi"], self.params["lo"]
        wp = 1 if (s["prefill_util"] > hi or s["prefill_wait_s"] > 0.5 * run.rates.ttft_s) else (
            -1 if s["prefill_util"] * s["serve_p"] / max(s["serve_p"] - 1, 1) < lo and s["pending_p"] == 0 else 0)
        occ = s["decode_occupancy"] + s["decode_queue"]
        wd = 1 if occ > hi else (-1 if occ * s["serve_d"] / max(s["serve_d"] - 1, 1) < lo
                                 and s["pending_d"] == 0 else 0)
        return wp, wd

    def act(self, run):
        s = run.signals()
        wp, wd = self.wants(run, s)
        m, k, cd = run.mask(), run.interval, self.params["cooldown"]
        for role, w, up, down in (("P", wp, UP_P, DOWN_P), ("D", wd, UP_D, DOWN_D)):
            if k - self.last[role] < cd or w == 0:
                continue
            if w > 0 and s[f"pending_{role.lower()}"] == 0 and m[up]:
                self.last[role] = k
                return up
            if w < 0 and m[down]:
                self.last[role] = k
                return down
        return NOOP


class HeteroScale(CapacityRule):
    """Decode instances from the decode pool's measured token rate (its one signal), prefill at a fixed ratio."""

    name = "heteroscale"
    GRID = {"tps_per_decode": [6000, 8000, 10000, 12000, 14000], "ratio": [1.5, 2.0, 3.0, 4.0],
            "headroom": [1.0, 1.2, 1.5]}

    def __init__(self, tps_per_decode: float = 8000.0, ratio: float = 1.5, headroom: float = 1.2):
        super().__init__(tps_per_decode=tps_per_decode, ratio=ratio, headroom=headroom)

    def act(self, run):
        s = run.signals()
        if run.interval == 0:
            return NOOP
        d = max(1, math.ceil(s["decode_tps"] * self.params["headroom"] / self.params["tps_per_decode"]))
        p = max(1, math.ceil(self.params["ratio"] * d))
        return toward(run, p, d)


class LendOnBurst(ThresholdAutoscaler):
    """The threshold autoscaler, plus: a prefill burst (queue wait above `burst_wait` x the TTFT SLO) while decode
    slots are below `lend_occ` flips a decode instance to prefill at once; lent ones return when the prefill
    utilisation falls below `lo`."""

    name = "lend"
    GRID = {"hi": [0.8, 0.9, 0.95], "lo": [0.3, 0.4, 0.5], "cooldown": [2, 4], "burst_wait": [0.1, 0.25],
            "lend_occ": [0.5, 0.7]}

    def __init__(self, hi: float = 0.8, lo: float = 0.4, cooldown: int = 4, burst_wait: float = 0.25,
                 lend_occ: float = 0.6):
        CapacityRule.__init__(self, hi=hi, lo=lo, cooldown=cooldown, burst_wait=burst_wait, lend_occ=lend_occ)

    def reset(self, run):
        super().reset(run)
        self.lent = 0

    def act(self, run):
        s = run.signals()
        m = run.mask()
        p = self.params
        burst = s["prefill_wait_s"] > p["burst_wait"] * run.rates.ttft_s or s["prefill_util"] > 1.0
        if burst and s["decode_occupancy"] + s["decode_queue"] < p["lend_occ"] and m[FLIP_DP]:
            self.lent += 1
            return FLIP_DP
        if self.lent and s["prefill_util"] < p["lo"] and s["prefill_wait_s"] < 0.1 and m[FLIP_PD]:
            self.lent -= 1
            return FLIP_PD
        return super().act(run)


CAPACITY_RULES: dict[str, type[CapacityRule]] = {c.name: c for c in (StaticSplit, ThresholdAutoscaler, HeteroScale,
                                                                      LendOnBurst)}
