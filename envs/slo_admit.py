"""PrefillDispatch-v0's admit mode (`mode="admit"`, id pdgym/PrefillAdmit-v0): SLO admission control, one decision
per arrival (issue 33 item 8).

On SLO tiers the decision with room is admission (docs/agents.md, "Where the headroom is": the hindsight row is
the best heuristic behind a better reject set). This mode poses it to an agent: each fresh arrival (not a
bounced or preempted request) is the candidate; action 0 admits it (the `base` dispatcher gets it as if nothing
stood in front: SBS on a P/D cluster, round robin on a colocated one, in the scenario's `queue.order`), action 1
rejects it at once (reason `slo`, a miss). Both are always allowed. The observation holds what an SLO admission
controller reads: the candidate's class (one-hot over the C classes), weight, Conductor's estimated TTFT and the
deadline slack it leaves, its prompt work and predicted output length (with a predictor; `use_prediction`: true
requires one, false leaves it out), the buffer, and
one row per buffered request (the first K in the queue's order) with its class, the time left to its deadline and
its prediction. Conductor's rule (slo_admission.py: reject when the estimate exceeds slack x the SLO) is the
`conductor_rejects` flag, so cloning it is one easy action and learning starts from it.

The reward is the board's metric: each request that finishes within both of its class's SLOs adds its class
weight over the total weight of the episode's requests, so an episode's return is its weighted SLO attainment
(`slo_attainment`, envs/sim/slo.py); a rejection or a miss adds nothing.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from pdgym.baselines.overload_admission import OverloadGate
from pdgym.baselines.registry import make_policy
from pdgym.baselines.slo_admission import ConductorAdmission
from pdgym.envs.base import DecidingCore
from pdgym.envs.features import Feature, Layout, LayoutCore, check_rows, table
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.ordering import seconds_per_prefill_token
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.validation import check, check_choice, check_float

_LOG_OUT = math.log1p(65536)
_LOG256 = math.log1p(256)


class _Ctx:
    """What one observation's features read (`AdmitCore.context`)."""

    __slots__ = ("C", "cls", "est", "flag", "nb", "pred", "r_cls", "r_left", "r_pred", "r_work", "rank", "slo", "w",
                 "wait", "wmax", "work")


def one_hot(codes: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros((len(codes), k))
    out[np.arange(len(codes)), codes] = 1.0
    return out


# The observation, declared once: [GLOBAL | one ROW per buffered request, the first K in the queue's order]. slo is
# the candidate's TTFT SLO, est Conductor's estimated TTFT of the candidate (its work, the least-loaded instance's
# and the buffer's spread over the units, at the cost model's seconds per prompt token), work in those seconds.
GLOBAL = (
    # with one class (C = 1) a width-C feature is a one-entry one (envs/features.Layout): its value, not a block
    Feature("cls", lambda c: np.eye(c.C)[c.cls] if c.C > 1 else 1.0, 0, 1, "candidate's class, one-hot", width="C"),
    Feature("weight", lambda c: c.w / c.wmax, 0, 1, "candidate's class weight / the largest weight"),
    Feature("est", lambda c: c.est / c.slo, 0, 20, "Conductor's estimated TTFT / the candidate's TTFT SLO",
            saturates=True),
    Feature("slack", lambda c: 1.0 - c.est / c.slo, -20, 1, "deadline slack: (SLO - estimate) / SLO", saturates=True),
    Feature("conductor_rejects", lambda c: c.flag, 0, 1, "1 when Conductor's rule rejects (estimate > slack x SLO)"),
    Feature("work", lambda c: c.work / c.slo, 0, 20, "candidate's prompt work (s) / its TTFT SLO", saturates=True),
    Feature("pred", lambda c: math.log1p(c.pred) / _LOG_OUT, 0, 2, "log1p(predicted output) / log1p(65536)",
            when="has_pred"),
    Feature("buffered", lambda c: math.log1p(c.nb) / _LOG256, 0, 5, "log1p(requests buffered) / log1p(256)"),
    # overload: true (issue 42): what value-density admission reads
    Feature("density_rank", lambda c: c.rank, 0, 1, "share of the last 256 arrivals with less weight per prompt token",
            when="overload"),
    Feature("wait", lambda c: c.wait / c.slo, 0, 20, "wait ahead (Conductor's estimate less its own work) / its TTFT "
            "SLO", saturates=True, when="overload"),
)
ROW = (
    Feature("present", lambda c: np.ones(len(c.r_cls)), 0, 1, "row present"),
    Feature("cls", lambda c: one_hot(c.r_cls, c.C) if c.C > 1 else np.ones(len(c.r_cls)), 0, 1, "its class, one-hot",
            width="C"),
    Feature("left", lambda c: c.r_left, -20, 1, "time left to its TTFT deadline / its class's TTFT SLO",
            saturates=True),
    Feature("work", lambda c: c.r_work, 0, 20, "its prompt work (s) / its class's TTFT SLO", saturates=True),
    Feature("pred", lambda c: np.log1p(c.r_pred) / _LOG_OUT, 0, 2, "log1p(its predicted output) / log1p(65536)",
            when="has_pred"),
)


class AdmitCore(LayoutCore, DecidingCore, PrefillScheduler):
    """The admit formulation's policy core (envs/base.py's PolicyCore): observation, mask, action and decision-epoch
    code, shared by the env and its AgentPolicy.

    Action 0 admits the candidate (to `base`), 1 rejects it. Observation (`layout`):

    {features}
    """

    def __init__(self, mode: str = "admit", base=None, obs_requests: int = 8, slack: float = 1.0,
                 use_prediction: bool | None = None, overload: bool = False):
        check_choice(mode, "env.mode", ("admit",))
        check(isinstance(overload, bool), "env.overload", f"got {overload!r}; must be true or false (true: the "
              "value-density features density_rank and wait)")
        self.overload = overload
        check_float(slack, "env.slack", lo_open=True)
        check(use_prediction is None or isinstance(use_prediction, bool), "env.use_prediction",
              f"got {use_prediction!r}; must be true, false or null (null: when the workload has a predictor)")
        self.mode = mode
        self.use_prediction = use_prediction
        self.K = check_rows(obs_requests, "env.obs_requests")
        self.base_spec = base  # None: sbs on a P/D cluster, round_robin on a colocated one
        self.rule = ConductorAdmission("least_tokens", slack)  # its estimate only (never reset: no base run)
        self.n_actions = 2
        self.C, self.has_pred = 0, False
        self.cand: int | None = None

    def bind(self, sim) -> None:
        self.fit(sim)

    def fit(self, sim) -> None:
        """Size the observation for a run's classes and predictor (the probe's at env init, each run's at reset)."""
        tbl = sim.classes
        C, has_pred = tbl.k, sim.req.predicted is not None
        if self.use_prediction and not has_pred:
            raise ConfigError("env.use_prediction: the observation reads the predicted output length and the workload "
                              "has no predictor; set workload.predictor.kind (oracle, lognormal, buckets)")
        has_pred = has_pred if self.use_prediction is None else self.use_prediction
        if (C, has_pred) != (self.C, self.has_pred) or not hasattr(self, "layout"):
            self.C, self.has_pred = C, has_pred
            self.layout = Layout(GLOBAL, ROW, self, {"C": C}, self.K)
            self.global_dim, self.slot_dim, self.obs_size = self.layout.global_dim, self.layout.slot_dim, self.layout.size

    def set_dims(self, n: int, dp: int) -> None:  # the prefill env's sizing hook: admit mode sizes by fit()
        pass

    def action_meanings(self) -> list[str]:
        return ["admit the candidate", "reject the candidate"]

    def describe(self, sim, a: int) -> str:
        rid = self.cand
        if rid is None:
            return "no candidate"
        tbl = sim.classes
        return f"{('admit', 'reject')[int(a)]} req {rid} ({tbl.names[int(sim.req.cls[rid])]})"

    def default_action(self, sim=None, mask=None) -> int:
        return 0

    def mask(self, sim) -> np.ndarray:
        return np.ones(2, dtype=bool)

    # -------------------------------------------------------------- life cycle and epochs
    def reset(self, sim) -> None:
        self.fit(sim)
        spec = self.base_spec if self.base_spec is not None else ("sbs" if sim.disaggregated else "round_robin")
        self.base = make_policy("prefill", spec)
        self.base.reset(sim)
        self.rule.s_tok = self.s_tok = seconds_per_prefill_token(sim)
        self.cand = None
        self.recent: deque[float] = deque(maxlen=256)  # the last arrivals' weight per prompt token (density_rank)
        self.teacher_ready = None  # the OverloadGate teacher prepared for this run (teacher_action)

    def decide(self, sim) -> None:
        self.decider.decide(self, sim)

    def on_arrival(self, sim, rid: int) -> None:
        if sim.req.done[rid] == 0 and not sim.req.preemptions[rid]:  # a fresh arrival: the decision
            self.cand = rid
            if self.overload:
                tbl = sim.classes
                self.recent.append(float(tbl.weight[sim.req.cls[rid]]) / max(float(sim.req.work[rid]), 1.0))
            self.decide(sim)
        else:
            self.base.on_arrival(sim, rid)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self.base.on_end_forward(sim, inst, fwd_time)

    def on_timer(self, sim, tag) -> None:
        self.base.on_timer(sim, tag)

    def on_topology_change(self, sim) -> None:
        self.base.on_topology_change(sim)

    def poll(self, sim) -> None:  # the prefill env's hook after an action that continues the epoch (never here)
        pass

    # -------------------------------------------------------------- what the agent sees
    def context(self, sim) -> _Ctx:
        c = _Ctx()
        req, t = sim.req, sim.classes
        c.C, c.wmax = t.k, float(t.weight.max()) or 1.0
        rid = self.cand
        ids = np.fromiter((r for r in sim.buffer if r != rid), dtype=np.int64, count=-1)[: self.K]
        c.nb = len(sim.buffer)
        if rid is None:
            c.cls, c.w, c.slo, c.est, c.flag, c.work, c.pred = 0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0
        else:
            k = int(req.cls[rid])
            c.cls, c.w, c.slo = k, float(t.weight[k]), float(t.ttft_s[k])
            c.est = self.rule.estimate(sim, rid)
            c.flag = float(c.est > self.rule.slack * c.slo)
            c.work = float(req.work[rid]) * self.s_tok
            c.pred = float(req.predicted[rid]) if self.has_pred else 0.0
        if self.overload:
            d = c.w / max(float(req.work[rid]), 1.0) if rid is not None else 0.0
            c.rank = float(np.mean(np.fromiter(self.recent, float) < d)) if self.recent else 0.0
            c.wait = max(c.est - c.work - sim.cfg.cluster.net_latency_s, 0.0) if rid is not None else 0.0
        rc = req.cls[ids].astype(np.int64)
        slo = t.ttft_s[rc]
        c.r_cls = rc
        c.r_left = (req.arrival[ids] + slo - sim.now) / slo
        c.r_work = req.work[ids] * self.s_tok / slo
        c.r_pred = req.predicted[ids].astype(np.float64) if self.has_pred else np.zeros(len(ids))
        return c

    def observe(self, sim, mask=None) -> np.ndarray:
        c = self.context(sim)
        return self.layout.build(c, len(c.r_cls))

    # -------------------------------------------------------------- actions
    def apply(self, sim, a: int) -> bool:
        """Admit (0) or reject (1) the candidate; the epoch ends (False)."""
        rid, self.cand = self.cand, None
        if rid is not None:
            if int(a) == 1:
                sim.reject(rid, "slo")
            else:
                self.base.on_arrival(sim, rid)
        return False

    def teacher_action(self, sim, teacher: PrefillScheduler) -> int:
        """Conductor's decision for a conductor teacher (its estimate against its slack x the SLO); an overload rule's
        own (baselines/overload_admission.py: its state prepared for the run, its `base` left alone; its drop of
        buffered requests is no arrival decision and is not cloned); admit for any other prefill baseline (none of
        them rejects at arrival)."""
        rid = self.cand
        if rid is not None and isinstance(teacher, OverloadGate):
            if self.teacher_ready is not teacher:
                teacher.prepare(sim)
                self.teacher_ready = teacher
            return int(teacher.rejects(sim, rid))
        if rid is None or not isinstance(teacher, ConductorAdmission):
            return 0
        tbl = sim.classes
        slo = float(tbl.ttft_s[sim.req.cls[rid]])
        return int(self.rule.estimate(sim, rid) > teacher.slack * slo)


AdmitCore.__doc__ = AdmitCore.__doc__.format(features=table(GLOBAL, ROW, "request r"))


class AttainmentMeter:
    """The reward of admit mode: weighted SLO attainment earned since the last call (the engine's finished
    requests in completion order; each attaining one adds its class weight / the episode's total weight)."""

    def __init__(self, sim):
        self.sim, self.seen = sim, 0
        tbl = sim.classes
        self.total = float(tbl.weight[sim.req.cls].sum()) or 1.0

    def step(self) -> float:
        sim = self.sim
        new = np.asarray(sim.completed[self.seen:], dtype=np.int64)
        self.seen += len(new)
        if not len(new):
            return 0.0
        req, t = sim.req, sim.classes
        k = req.cls[new]
        first, out = req.first_token[new], req.output[new]
        ttft_ok = first - req.arrival[new] <= t.ttft_s[k]
        tpot = np.divide(req.finish[new] - first, out - 1, out=np.zeros(len(new)), where=out > 1)
        ok = ttft_ok & ((out <= 1) | (tpot <= t.tpot_s[k]))
        return float(t.weight[k][ok].sum()) / self.total
