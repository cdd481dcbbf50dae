"""DecodeRouting's pick formulation (`action="pick"`): the env names the worker, the agent picks its requests.

BalanceRoute (baselines/balance_route.py) runs one loop per step boundary: the open worker keyed highest by
(free slots, safe margin m_w = L_max - L_w) takes the best-scoring subset of the K oldest pooled requests
(Stage 2), or, while more than `stage1_free` of the slots are free, the single best request of the whole pool
(Stage 1); then the worker is chosen again. In the default formulation (`action="worker"`) the agent places
one offered request on one of N workers, so that loop is spread over many decisions none of which is BR-0's.
Here the env runs the loop's worker choice and the agent makes the choice inside it: for the named worker w
it picks one of K candidates at a time (the K oldest pooled requests when its turn starts, less those it
took; in Stage 1 the K pooled requests that
score best for w), then says DONE (w is chosen again or another worker takes its turn) or END (no more
admissions this step). BR-0's decision is a few easy actions: its subset, one candidate at a time, then DONE;
the candidates carry its score F_w(load) = min(load, m_w) - (N - 1) max(0, load - m_w) as a feature.

`Picker` is the policy core the env and its AgentPolicy share (observation, mask, actions); `br0_action`
is BR-0's own action in this formulation (behaviour cloning: exact, computed from the state, no dry run).
"""

from __future__ import annotations

from itertools import islice

import numpy as np
from pdgym.baselines.balance_route import Score, best_subset
from pdgym.baselines.predictors import make_predictor
from pdgym.baselines.routers import active_arrays
from pdgym.envs.base import DecidingCore
from pdgym.envs.features import Feature, Layout, LayoutCore, check_rows
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import DecodeRouter
from pdgym.envs.sim.validation import check_bool, check_choice, check_float, check_int


def bind_workers(core, n_workers: int) -> None:
    """`env.max_workers` (the observation's worker rows) defaults to the instances' workers and must hold them."""
    if core.max_workers is None:
        core.max_workers = n_workers
    if n_workers > core.max_workers:
        raise ConfigError(f"env.max_workers: got {core.max_workers}; the decode instances have {n_workers} workers")


class Boundaries:
    """The decode step boundaries a core has met, each (instance, step count, time): the one it is on (whose
    candidate order it keeps) and, per instance, the latest one where admissions are over. Both decode cores
    own one; `on_open(sim, inst)` is the core's own set-up of a boundary it opens."""

    def __init__(self, on_open):
        self.on_open = on_open
        self.current: tuple | None = None
        self.closed: set[tuple] = set()

    def enter(self, sim, inst: int) -> bool:
        """The core meets instance `inst` at a step boundary: False when that boundary is closed and the instance
        still has work running; otherwise the core is on it (opened anew when it is new, or reopened when closed
        on an idle instance whose pool changed)."""
        d = sim.decode[inst]
        key = (inst, d.steps, sim.now)
        reopen = key in self.closed
        if reopen and d.batch.any():
            return False
        if reopen or self.current != key:
            self.current = key
            self.on_open(sim, inst)
        return True

    def close(self, sim, inst: int) -> None:
        """Admissions at instance `inst`'s current boundary are over (`enter` keeps it closed while work runs);
        only the instance's latest boundary is remembered."""
        self.closed = {k for k in self.closed if k[0] != inst}
        self.closed.add((inst, sim.decode[inst].steps, sim.now))


class DecodeCore(DecidingCore):
    """What both decode cores (envs/base.py's PolicyCore) share: a decision at each step boundary of an instance
    while `next_decision` finds one, and `apply` carrying out one action (`act`) and setting up the next."""

    def route(self, sim, inst: int) -> None:
        if self.next_decision(sim, inst):
            self.decider.decide(self, sim)

    def bind(self, sim) -> None:
        self.bind_size(max(d.dp for d in sim.decode))

    def apply(self, sim, action) -> bool:
        inst = self.inst
        self.act(sim, action)
        return self.next_decision(sim, inst)


class DecodeObs:
    """What the features of one decode observation read, computed once: the deciding core, the instance and its
    workers' KV. Both decode formulations fill it (`Picker.observe`, decode_routing's router, which adds fields)."""

    __slots__ = ("core", "sim", "d", "n", "B", "ts", "S", "kv", "lmax", "kv_sum", "mask")

    def fill(self, core, sim, mask: np.ndarray) -> DecodeObs:
        self.core, self.sim, self.mask = core, sim, mask
        self.d = d = sim.decode[core.inst]
        self.n, self.B, self.ts = d.dp, d.batch_limit, core.token_scale
        self.S = self.B * self.ts
        self.kv = d.kv.astype(np.float64)
        # max and sum of the integer KV counts on Python ints: exact, so the same floats as NumPy's float64 max and
        # sum (token counts stay far below 2**53), at a fraction of two NumPy calls' cost (they run at every step)
        kv = d.kv.tolist()
        self.lmax, self.kv_sum = float(max(kv)), float(sum(kv))
        return self


def _cand(o: DecodeObs, values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)[: len(o.core.cand)]


GLOBAL = (
    Feature("pool", lambda o: len(o.sim.pool) / (o.n * o.B), 0, 8, "pool size / (N B)"),
    Feature("stage1", lambda o: float(o.core.stage1), 0, 1, "Stage 1 (more than stage1_free of the slots free)"),
    Feature("w_free", lambda o: float(o.B - o.d.batch[o.core.w]) / o.B, 0, 1, "the named worker's free slots / B"),
    Feature("w_margin", lambda o: (o.lmax - o.kv[o.core.w]) / o.S, 0, 8, "its safe margin (L_max - L_w) / S"),
    Feature("l_max", lambda o: o.lmax / o.S, 0, 8, "L_max / S"),
    Feature("l_mean", lambda o: o.kv_sum / o.n / o.S, 0, 8, "mean L_w / S"),  # = kv.mean(), the same bits
    Feature("free_slots", lambda o: float((o.B - o.d.batch).sum()) / (o.n * o.B), 0, 1,
            "free-slot fraction of the instance"),
    Feature("took", lambda o: o.core.took / o.B, 0, 8, "requests the named worker took in this turn / B"),
    Feature("admitted", lambda o: o.core.n_admitted / o.B, 0, 8, "admissions this boundary / B"),
    Feature("workers", lambda o: o.n / o.core.max_workers, 0, 1, "N / max_workers"),
    Feature("done_allowed", lambda o: float(o.mask[o.core.done]), 0, 1, "DONE allowed"),
    Feature("end_allowed", lambda o: float(o.mask[o.core.end]), 0, 1, "END allowed"),
    Feature("w_exp_margin", lambda o: (o.core.exp_kv.max() - o.core.exp_kv[o.core.w]) / o.S, 0, 8,
            "the named worker's expected margin in H steps (max_w E_w - E_w) / S", when="horizon"),
    Feature("w_exp_leave", lambda o: o.core.exp_leave[o.core.w] / o.B, 0, 1,
            "its requests expected to finish within H steps / B", when="horizon"),
    Feature("exp_leave", lambda o: float(o.core.exp_leave.mean()) / o.B, 0, 1,
            "the same, mean over the workers", when="horizon"),
)
ROW = (
    Feature("present", lambda o: [1.0] * len(o.core.cand), 0, 1, "candidate k present (0 on padding rows)"),
    Feature("load", lambda o: o.core.loads / (4 * o.ts), 0, 8, "its load (prompt + tokens produced) / (4 token_scale)"),
    Feature("fits", lambda o: o.mask[: len(o.core.cand)], 0, 1, "the named worker can take it (its mask bit)"),
    Feature("score", lambda o: o.core.scores / (4 * o.ts), -8, 8, "BR-0's score F_w(load) / (4 token_scale)"),
    Feature("best", lambda o: _cand(o, o.core.scores == o.core.scores[o.mask[: len(o.core.cand)]].max())
            if o.mask[: len(o.core.cand)].any() else None, 0, 1, "the best score of the fitting candidates"),
    Feature("margin_after", lambda o: (o.lmax - o.kv[o.core.w] - o.core.loads) / (4 * o.ts), -8, 8,
            "the worker's margin after it (m_w - load) / (4 token_scale)"),
    Feature("done", lambda o: o.sim.req.done[o.core.cand] / o.ts, 0, 8, "tokens it produced / token_scale"),
    Feature("age", lambda o: o.sim.now - o.sim.req.arrival[o.core.cand], 0, 8, "time since its arrival (s)"),
    Feature("exp_margin_after", lambda o: (o.core.exp_kv.max() - o.core.exp_kv[o.core.w] - o.core.loads)
            / (4 * o.ts), -8, 8, "the named worker's expected margin in H steps after it / (4 token_scale)",
            when="horizon"),
)


class Picker(LayoutCore, DecodeCore, DecodeRouter):
    """The pick formulation's observation / action code, shared by the env and its AgentPolicy.

    Actions: k < K admits candidate k to the named worker w; K (DONE) ends w's turn (allowed once it took a
    request: every turn admits, so a boundary always ends); K + 1 (END) closes admissions until the next step
    (allowed while the instance runs a request; never with `work_conserving`: BR-0 never ends a boundary while
    a candidate fits, and a clone that may holds requests back, so the agent chooses which requests, not whether).
    A turn also ends when w is full, nothing fits it, or after one request in Stage 1 (BR-0's Stage 1 takes one
    request per turn). A worker that nothing fits is closed for the boundary; the boundary ends when no worker is
    open or the pool is empty.
    """

    def __init__(self, action: str = "pick", window: int = 12, stage1_free: float = 0.25,
                 max_workers: int | None = None, token_scale: float = 1024.0, work_conserving: bool = False,
                 horizon_features: str | None = None, horizon: int = 48, train_trace: str | None = "workload"):
        check_choice(action, "env.action", ("pick",))
        self.work_conserving = check_bool(work_conserving, "env.work_conserving")
        # BR-H's survival forecast (P(finish within H steps | age), from the training split's output lengths), as
        # expectations: BR-H's own projection trusts it only where P >= 0.7, on 0.017% of decode_tier_ht_n16's steps
        # (docs/fidelity.md), so it would add little beyond today's loads
        self.H = check_int(horizon, "env.horizon", 1)
        if horizon_features is not None:  # no oracle: these are what a router that does not know the future knows
            check_choice(horizon_features, "env.horizon_features", ("survival", "memo"))
        self.forecaster = None if horizon_features is None else make_predictor(horizon_features, train_trace, None,
                                                                              20000, 3)
        self.horizon = self.forecaster is not None  # the horizon features exist
        self.window = check_rows(window, "env.window")
        self.stage1_free = check_float(stage1_free, "env.stage1_free", 0, 1)
        self.max_workers = check_rows(max_workers, "env.max_workers", allow_none=True)
        self.token_scale = check_float(token_scale, "env.token_scale", lo_open=True)
        self.skip = False  # the worker formulation's SKIP does not exist here

    # -------------------------------------------------------------- spaces
    def bind_size(self, n_workers: int) -> None:
        bind_workers(self, n_workers)
        self.layout = Layout(GLOBAL, ROW, self, {}, self.window)
        self.done, self.end = self.window, self.window + 1
        self.n_actions = self.window + 2



    def action_meanings(self) -> list[str]:
        return [f"candidate {k}" for k in range(self.window)] + ["DONE", "END"]

    def describe(self, sim, a: int) -> str:
        """The valid action `a` in words (pdgym-enjoy's decision lines)."""
        where = f" of decode {self.inst}" if len(sim.decode) > 1 else ""
        if a == self.end:
            return f"END (no more admissions to decode {self.inst} until its next step)"
        if a == self.done:
            return f"DONE (worker {self.w}{where} took {self.took}; its turn ends)"
        return f"route req {int(self.cand[a])} ({int(self.loads[a])} tok, candidate {a}) -> worker {self.w}{where}"

    def default_action(self, sim, mask: np.ndarray) -> int:
        """DONE when allowed, else END when allowed, else the best-scoring candidate that fits."""
        if mask[self.done]:
            return self.done
        if mask[self.end]:
            return self.end
        fit = mask[: len(self.cand)]
        return int(np.argmax(np.where(fit, self.scores, -np.inf)))

    # -------------------------------------------------------------- life cycle
    def reset(self, sim):
        if not sim.decode:  # a colocated cluster (md1_single_slot): no decode instance to route to
            raise ConfigError("policy: a decode-routing agent needs decode instances; this scenario's cluster is "
                              "colocated (give a disaggregated scenario)")
        self.bind_size(max(d.dp for d in sim.decode))
        self.bounds = Boundaries(self.open_boundary)
        self.head: int | None = None  # the first candidate while a decision is pending (None: none)
        self.inst = 0
        self.n_admitted = 0
        self.w = -1
        self.cand = np.zeros(0, dtype=np.int64)
        if self.forecaster is not None:
            self.forecaster.bind(sim, self.H)

    def open_boundary(self, sim, inst: int) -> None:
        d = sim.decode[inst]
        self.n_admitted = 0
        self.shut = np.zeros(d.dp, dtype=bool)  # workers closed for this boundary (nothing fits them)
        self.w = -1  # no turn in progress

    def _candidates(self, sim, inst: int) -> None:
        """The named worker's candidates: the K oldest pooled requests at its turn's start (Stage 2) or the K that score best
        for it (Stage 1); their loads and BR-0 scores F_w(load) against today's margins."""
        d = sim.decode[inst]
        kv = d.kv
        m = float(kv.max() - kv[self.w])
        score = Score(np.array([m]), np.ones(1), 1.0, float(d.dp - 1))
        if self.stage1:
            rids = np.fromiter(sim.pool, dtype=np.int64, count=len(sim.pool))
            loads = sim.req.prompt[rids] + sim.req.done[rids]
            f = score.many(loads.astype(np.float64))
            f = np.where(loads <= d.kv_cap[self.w] - kv[self.w], f, -np.inf)
            top = np.argsort(-f, kind="stable")[: self.window]
            rids, loads = rids[top], loads[top]
        elif self.took == 0:  # a turn's window is fixed at its start, as BR-0 chooses its subset from one window
            rids = self._turn = np.fromiter(islice(sim.pool, self.window), dtype=np.int64)
            loads = sim.req.prompt[rids] + sim.req.done[rids]
        else:
            pool = sim.pool
            rids = np.array([r for r in self._turn.tolist() if r in pool], dtype=np.int64)
            loads = sim.req.prompt[rids] + sim.req.done[rids]
        self.cand, self.loads = rids, loads
        if self.forecaster is not None and (self.stage1 or self.took == 0):  # once per turn, updated by apply
            self._forecast(sim, inst)
        self.scores = score.many(loads.astype(np.float64)) if len(rids) else np.zeros(0)
        self.fit = loads <= d.kv_cap[self.w] - kv[self.w]

    def next_decision(self, sim, inst: int) -> bool:
        """Name the worker whose turn it is and its candidates; False when this boundary has no decision left
        (boundaries as in the worker formulation: (instance, step count, time), reopened for an idle instance)."""
        if not self.bounds.enter(sim, inst):
            return False
        self.inst = inst
        d = sim.decode[inst]
        while sim.pool:
            if self.w >= 0 and d.batch[self.w] < d.batch_limit and not (self.stage1 and self.took):
                self._candidates(sim, inst)
                if self.fit.any():
                    self.head = int(self.cand[0])
                    return True
                if not self.took:
                    self.shut[self.w] = True
            self.w = -1
            free = (d.batch_limit - d.batch).astype(np.int64)
            open_ = (free > 0) & ~self.shut
            if not open_.any():
                break
            margin = d.kv.max() - d.kv
            self.w = int(np.argmax(np.where(open_, free * 1e12 + margin, -np.inf)))
            self.stage1 = int(free.sum()) > self.stage1_free * d.dp * d.batch_limit
            self.took = 0
        self.close(sim, inst)
        return False

    def close(self, sim, inst: int) -> None:
        self.bounds.close(sim, inst)
        self.head = None
        self.w = -1

    def mask(self, sim) -> np.ndarray:
        m = np.zeros(self.n_actions, dtype=bool)
        m[: len(self.cand)] = self.fit
        m[self.done] = self.took > 0
        m[self.end] = not self.work_conserving and bool(sim.decode[self.inst].batch.any())
        return m

    def act(self, sim, action: int) -> None:
        a = int(action)
        if a == self.end:
            self.close(sim, self.inst)
            return
        if a == self.done:
            self.w = -1
            self.head = None
            return
        if not (0 <= a < len(self.cand)) or not self.fit[a] or not sim.admit(int(self.cand[a]), self.inst, self.w):
            raise ValueError(f"DecodeRouting(action=pick): action {a} is masked (no such candidate or it does not fit)")
        self.took += 1
        self.n_admitted += 1
        self.head = None
        if self.forecaster is not None:  # the admitted request joins w's forecast
            rid = self.cand[a : a + 1]
            p, _ = self.forecaster.window(sim, rid, sim.req.done[rid])
            self.exp_kv[self.w] += (1.0 - p[0]) * (self.loads[a] + self.H)
            self.exp_leave[self.w] += p[0]

    def _forecast(self, sim, inst: int) -> None:
        """Per worker, its expected KV in H steps (a request finishes within them with P from the survival
        forecast at its age, else it grows by H tokens) and its expected departures within them."""
        d = sim.decode[inst]
        rids, workers, age = active_arrays(sim, inst)
        p, _ = self.forecaster.window(sim, rids, age)
        load = (sim.req.prompt[rids] + age).astype(np.float64)
        self.exp_kv = np.bincount(workers, weights=(1.0 - p) * (load + self.H), minlength=d.dp)
        self.exp_leave = np.bincount(workers, weights=p, minlength=d.dp)

    # -------------------------------------------------------------- observation
    def observe(self, sim, mask: np.ndarray) -> np.ndarray:
        return self.layout.build(DecodeObs().fill(self, sim, mask), len(self.cand))


def br0_action(core: Picker, sim, mask: np.ndarray, plan: list) -> int:
    """BR-0's action in the pick formulation (baselines/balance_route.py, `window` and `stage1_free` as the
    core's): at the start of a turn, the best subset of the candidates for the named worker (Stage 2; Stage 1:
    the single best, the first candidate); then its members one at a time, the best-scoring first, then DONE.
    `plan` holds the turn's remaining subset (request ids) between calls: the caller keeps it per turn."""
    if core.took == 0:
        d = sim.decode[core.inst]
        if core.stage1:
            chosen = [int(np.argmax(np.where(core.fit, core.scores, -np.inf)))]
        else:
            m = float(d.kv.max() - d.kv[core.w])
            score = Score(np.array([m]), np.ones(1), 1.0, float(d.dp - 1))
            sizes = [int(x) for x in core.loads]
            room = int(d.kv_cap[core.w] - d.kv[core.w])
            chosen, best = best_subset(sizes, int(d.batch_limit - d.batch[core.w]), room, score)
            if chosen and best <= 0 and len(chosen) > 1:
                chosen, _ = best_subset(sizes, 1, room, score)
        plan[:] = [int(core.cand[i]) for i in chosen]
    left = [i for i, r in enumerate(core.cand) if int(r) in plan and mask[i]]
    if not left:
        return core.done if mask[core.done] else core.default_action(sim, mask)
    k = max(left, key=lambda i: (core.scores[i], -i))
    plan.remove(int(core.cand[k]))
    return int(k)
