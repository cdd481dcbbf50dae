"""PrefillDispatch-v0's route mode (`mode="route"`): immediate cache-aware routing, one decision per arrival.

The cache-aware routers of production (baselines/cache_routing.py: Mooncake's Conductor = `cache_ttft`,
Dynamo's KV router) send every arrival at once to an (instance, DP unit) pair, reading each unit's
prefix-block cache. This mode poses that decision to an agent: the action is the pair (N D actions,
i D + d, masked to the healthy instances), and the observation has one row per unit holding what such a
router reads - the candidate's cached-prefix hit on the unit (HBM and host tier), the unit's backlog,
its instance's pass in progress and recent pass time, the cache's occupancy - and, as more row
features, Conductor's own estimate built from them, its gap to the best unit's and a flag on the unit it
picks, so that a shared per-unit scorer (the pointer extractor, agents/learned/extractors.py) makes
cache_ttft's choice one easy action (without the flag, cloning reached 0.80 held-out accuracy: near-ties
of the estimate need sharp logits) and learning starts from it and decides where to deviate. The reward
is the env's (minus the TTFT waiting time accrued between decisions).

The recent pass time is Conductor's (`UnitDispatch.t_pass`: an average of the instance's EndForward
times, weight 1/8), kept by a `UnitDispatch` that sees the same events, so the estimate here is exactly
the one cache_ttft minimises.
"""

from __future__ import annotations

import math

import numpy as np
from pdgym.baselines.cache_routing import UnitDispatch
from pdgym.envs.arrival_window import ArrivalWindow
from pdgym.envs.base import DecidingCore
from pdgym.envs.features import Feature, Layout, LayoutCore, table
from pdgym.envs.shadow import shadow_teacher
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.validation import check_choice

_LOG256 = math.log1p(256)
BIG = 16.0  # bound of the token features, in chunks (a 128K prompt is 16 chunks of 8K)


class _Ctx:
    """What one observation's features read (`RouteCore.context`): (N, D) arrays flattened to N D unit rows."""

    __slots__ = ("back", "chunk", "core", "est", "fill", "healthy", "hit", "host", "left", "n_act", "nb", "t_pass",
                 "tf", "work")


def _rate(c: _Ctx) -> float:
    return c.core._arrivals.load(c.core._now, c.core._cap_tok_s)


def _gap(c: _Ctx) -> np.ndarray:
    ok = c.healthy > 0
    best = c.est[ok].min() if ok.any() else 0.0
    return np.where(ok, c.est - best, BIG * c.tf) / c.tf


def _pick(c: _Ctx) -> np.ndarray:
    """1 on Conductor's choice: the healthy unit of smallest est, ties to the larger hit, then the lower index (its
    rotating tie-break among instances aside)."""
    v = np.zeros_like(c.est)
    if c.n_act:
        v[np.lexsort((-c.hit, np.where(c.healthy > 0, c.est, np.inf)))[0]] = 1.0
    return v


# The observation, declared once: [GLOBAL | one ROW per (instance i, unit d), row i D + d]. T_full is the cost
# model's time of a full-chunk pass, chunk the per-unit token budget; est is Conductor's estimated TTFT on the
# unit: pass left + (backlog + prompt - hit) / chunk x recent pass time + host-tier hit x transfer time per token.
GLOBAL = (
    Feature("buffered", lambda c: math.log1p(c.nb) / _LOG256, 0, 5, "log1p(requests waiting to be routed) / log1p(256)"),
    Feature("candidate_prompt", lambda c: c.work / c.chunk, 0, BIG, "candidate prompt / chunk"),
    Feature("arrival_rate", _rate, 0, 5, "arrival token rate / cluster token capacity (N D chunk / T_full)",
            saturates=True),
    Feature("cluster_backlog", lambda c: c.back[c.healthy > 0].sum() / (max(c.n_act, 1) * c.chunk), 0, BIG,
            "backlog tokens of the healthy units / (their count x chunk)"),
    Feature("healthy_share", lambda c: c.healthy.mean(), 0, 1, "share of instances healthy"),
)
ROW = (
    Feature("present", lambda c: np.ones_like(c.healthy), 0, 1, "unit present"),
    Feature("healthy", lambda c: c.healthy, 0, 1, "its instance is healthy"),
    Feature("hit", lambda c: c.hit / c.chunk, 0, BIG, "candidate's cached-prefix hit tokens on the unit / chunk"),
    Feature("host_hit", lambda c: c.host / c.chunk, 0, BIG, "... of which in the host tier / chunk"),
    Feature("uncached", lambda c: (c.work - c.hit) / c.chunk, 0, BIG, "candidate's uncached tokens there / chunk"),
    Feature("backlog", lambda c: c.back / c.chunk, 0, BIG, "unit backlog (queued + on the wire) / chunk"),
    Feature("pass_left", lambda c: c.left / c.tf, 0, 5, "time left of the instance's pass in progress / T_full"),
    Feature("t_pass", lambda c: c.t_pass / c.tf, 0, 5, "instance's recent pass time / T_full"),
    Feature("fill", lambda c: c.fill, 0, 1, "unit's HBM prefix-cache occupancy (share of capacity)"),
    Feature("est", lambda c: c.est / c.tf, 0, 4 * BIG, "est / T_full"),
    Feature("est_gap", _gap, 0, BIG, "(est - the smallest est of a healthy unit) / T_full (unhealthy: the max)"),
    Feature("pick", _pick, 0, 1, "1 on the unit of smallest est (ties: larger hit, lower index): cache_ttft's choice"),
)


class RouteCore(LayoutCore, DecidingCore, PrefillScheduler):
    """The route formulation's policy core (envs/base.py's PolicyCore): observation, mask, action and decision-epoch
    code, shared by the env and its AgentPolicy.

    Action a = i D + d sends the oldest request waiting to be routed (the candidate) to unit d of instance i;
    the mask allows the units of healthy instances. Decision epochs: an arrival (or a request bounced back)
    and an instance-set change while requests wait and an instance is healthy; requests arriving at one
    instant are routed one decision each. Observation (`layout`):

    {features}
    """

    def __init__(self, mode: str = "route"):
        check_choice(mode, "env.mode", ("route",))
        self.mode = mode
        self.n = self.D = 0
        self.conductor = UnitDispatch()  # Conductor's recent pass time and backlog, fed the same events

    # -------------------------------------------------------------- sizes
    def bind(self, sim) -> None:
        self.set_dims(len(sim.prefill), sim.prefill[0].dp)

    def set_dims(self, n: int, dp: int) -> None:
        self.n, self.D = n, dp
        self.layout = Layout(GLOBAL, ROW, self, {"N": n, "D": dp}, n * dp)
        self.global_dim, self.slot_dim, self.obs_size = self.layout.global_dim, self.layout.slot_dim, self.layout.size
        self.n_actions = n * dp



    def action_meanings(self) -> list[str]:
        return [f"candidate to instance {i} unit {d}" for i in range(self.n) for d in range(self.D)]

    def describe(self, sim, a: int) -> str:
        """The action `a` in words (pdgym-enjoy's decision lines)."""
        rid = next(iter(sim.buffer), None)
        inst, d = divmod(int(a), self.D)
        if rid is None:
            return f"prefill {inst} unit {d} (no request waiting)"
        return f"route req {rid} ({int(sim.req.work[rid])} tok) -> prefill {inst} unit {d}"

    # -------------------------------------------------------------- life cycle and epochs
    def reset(self, sim) -> None:
        n, dp = len(sim.prefill), sim.prefill[0].dp
        if (self.n, self.D) != (n, dp):
            self.set_dims(n, dp)
        self.conductor.reset(sim)
        self._sim = sim
        self._now = 0.0
        self._chunk = float(sim.prefill[0].chunk_tokens)
        self._tf = self.conductor.t_full(sim, 0)
        self._cap_tok_s = n * dp * self._chunk / self._tf
        self._arrivals = ArrivalWindow()
        self.teacher = None
        self._proxy = None
        self.intents: dict[int, tuple[int, int | None]] = {}
        self._rr: dict[int, int] = {}  # per instance: requests the teacher left to the engine's round robin

    def decide(self, sim) -> None:
        self.decider.decide(self, sim)

    def _epoch(self, sim) -> None:
        if sim.buffer and sim.prefill_healthy[: self.n].any():
            self.decide(sim)

    def on_arrival(self, sim, rid: int) -> None:
        self._arrivals.note(sim, rid)
        if self.teacher is not None:
            self.teacher.on_arrival(self._proxy, rid)
        self._epoch(sim)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self.conductor.on_end_forward(sim, inst, fwd_time)
        if self.teacher is not None:
            self.teacher.on_end_forward(self._proxy, inst, fwd_time)

    def on_topology_change(self, sim) -> None:
        if self.teacher is not None:
            self.teacher.on_topology_change(self._proxy)
        self._epoch(sim)

    def on_timer(self, sim, tag) -> None:
        if tag[0] == "teacher" and self.teacher is not None:
            self.teacher.on_timer(self._proxy, tag[1])

    # -------------------------------------------------------------- what the agent sees
    def context(self, sim) -> _Ctx:
        c = _Ctx()
        c.core, c.chunk, c.tf = self, self._chunk, self._tf
        self._now = now = sim.now
        buf = sim.buffer
        c.nb = len(buf)
        rid = next(iter(buf), None)
        c.work = float(sim.req.work[rid]) if rid is not None else 0.0
        n, D = self.n, self.D
        healthy = sim.prefill_healthy[:n]
        c.n_act = int(healthy.sum())
        c.healthy = np.repeat(healthy.astype(np.float64), D)
        hit, host, back, fill, est = (np.zeros((n, D)) for _ in range(5))
        left, t_pass = np.zeros(n), np.zeros(n)
        for i in range(n):
            P = sim.prefill[i]
            t_pass[i] = self.conductor.t_pass(sim, i)
            left[i] = max(P.pass_end - now, 0.0) if P.busy else 0.0
            back[i] = self.conductor.backlog(sim, i)
            fill[i] = P.cache_fill() or 0.0
            if rid is not None:
                hit[i], host[i] = P.cache_hits(rid)
            s_tok = P.blocks.host_s_per_token if P.blocks is not None else 0.0
            est[i] = left[i] + (back[i] + c.work - hit[i]) / P.chunk_tokens * t_pass[i] + host[i] * s_tok
        c.hit, c.host, c.back, c.fill, c.est = (a.ravel() for a in (hit, host, back, fill, est))
        c.left, c.t_pass = np.repeat(left, D), np.repeat(t_pass, D)
        return c

    def observe(self, sim, mask=None) -> np.ndarray:
        return self.layout.build(self.context(sim), self.n * self.D)

    def mask(self, sim) -> np.ndarray:
        m = np.repeat(sim.prefill_healthy[: self.n], self.D).astype(bool)
        if not m.any() or not sim.buffer:  # no decision is due; keep one action allowed (Gymnasium's contract)
            m[0] = True
        return m

    def default_action(self, sim=None, mask=None) -> int:
        """The allowed unit with the fewest outstanding tokens (the least-tokens dispatcher's choice)."""
        sim = self._sim if sim is None else sim
        load = np.concatenate([sim.prefill[i].load_tokens() for i in range(self.n)]).astype(np.float64)
        return int(np.argmin(np.where(self.mask(sim) if mask is None else mask, load, np.inf)))

    # -------------------------------------------------------------- actions
    def apply(self, sim, a: int) -> bool:
        """Route the candidate by the valid action `a`; True while others wait at this instant (the epoch goes on)."""
        rid = next(iter(sim.buffer), None)
        if rid is not None:
            inst, d = divmod(int(a), self.D)
            sim.dispatch(rid, inst, d)
        return bool(sim.buffer) and bool(sim.prefill_healthy[: self.n].any())

    def teacher_action(self, sim, teacher: PrefillScheduler) -> int:
        """The action for the unit prefill baseline `teacher` (run in the shadow, DispatchRecorder) chose for the
        candidate: its instance and unit (the engine's unit when it left that to the engine); the default action
        when it chose none or a masked one."""
        shadow_teacher(self, sim, teacher)
        rid = next(iter(sim.buffer), None)
        if rid not in self.intents:
            return self.default_action(sim)
        inst, d = self.intents.pop(rid)
        if d is None:
            d = self._engine_unit(sim, inst)
        a = inst * self.D + d
        return a if self.mask(sim)[a] else self.default_action(sim)

    def _engine_unit(self, sim, inst: int) -> int:
        """The unit the engine gives a request sent without one (cluster.prefill.dp_dispatch)."""
        if sim.cfg.cluster.prefill.dp_dispatch == "round_robin":
            k = self._rr[inst] = self._rr.get(inst, -1) + 1
            return k % self.D
        return int(np.argmin(sim.prefill[inst].load_tokens()))


RouteCore.__doc__ = RouteCore.__doc__.format(features=table(GLOBAL, ROW, "unit u"))
