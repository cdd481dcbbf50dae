"""Overload admission rules (issue 42; ALGORITHMS.md section 10): what production and recent work do when the offered
load exceeds the cluster's capacity, each in front of any prefill dispatcher (`base`) and each tunable
(tools: `pdgym-tune`, conf/policy/prefill/*_tuned.yaml).

- `conductor_predictive`: Mooncake's prediction-based early rejection. Conductor (slo_admission.py) checks the
  TTFT the prefill queue ahead gives; this rule also predicts the decode load *when the request would run*
  (now + its estimated TTFT): the requests still in the prefill pipeline (they will be decoding by then) plus the
  decoding ones whose predicted remaining output outlasts the wait, one more for the candidate, spread over the
  decode workers; the step time the cost model gives that batch is the TPOT the candidate would see. It rejects
  when the TTFT estimate exceeds `slack` x the class's TTFT SLO or that step time exceeds `tpot_slack` x its TPOT
  SLO (without a predictor a decoding request is expected to produce as much again as it has, a new one the mean
  of those). Rejecting on the load now oscillates (rejections empty the queue, admissions refill it); the load at the
  request's start does not.
- `value_density`: serve the most weight per unit of work. A request's density is its class weight over its
  predicted work (prompt tokens + `beta` x predicted output tokens; without a predictor the mean output of the
  requests finished so far); once the wait ahead of it (Conductor's
  estimate less its own prefill) exceeds `backlog_s`, an arrival whose density is below the `quantile` of the
  recent arrivals' densities is rejected; Conductor's TTFT rule (`slack`) applies throughout.

Both take `drop_late` (Andes, arXiv 2404.16283: give up requests whose deadline is already lost): before each
decision the buffered requests that can no longer meet their TTFT SLO (now + their own prefill time past the
deadline) are rejected (reason `slo`), a miss either way but no longer a cost to the requests behind them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from pdgym.envs.sim.ordering import seconds_per_prefill_token
from pdgym.envs.sim.requests import BUFFERED, DECODE, DISPATCHED, POOL, PREFILL, TRANSFER, WAITING
from pdgym.envs.sim.validation import check, check_float

from .registry import register
from .slo_admission import ArrivalGate, ConductorAdmission

_PIPELINE = np.array([BUFFERED, DISPATCHED, PREFILL, TRANSFER, POOL, WAITING])  # admitted, not yet decoding


class OverloadGate(ConductorAdmission):
    """Conductor's estimate and TTFT rule, plus the Andes-style drop of buffered requests already late."""

    def __init__(self, base: str | dict[str, Any] = "auto", slack: float = 1.0, drop_late: bool = False):
        super().__init__(base, slack)
        check(isinstance(drop_late, bool), "policy.prefill.drop_late", f"got {drop_late!r}; must be true or false")
        self.drop_late = drop_late

    def prepare(self, sim) -> None:
        """The rule's own state for a run, without its `base` (an env's teacher decides through it alone)."""
        self.s_tok = seconds_per_prefill_token(sim)

    def reset(self, sim) -> None:
        self.prepare(sim)
        ArrivalGate.reset(self, sim)  # `base` (auto resolved for this cluster), reset

    def drop_lost(self, sim) -> None:
        """Reject the buffered requests that miss their TTFT SLO even if their prefill started now."""
        if not self.drop_late or not sim.buffer:
            return
        req, ttft = sim.req, sim.classes.ttft_s
        ids = np.fromiter(sim.buffer, dtype=np.int64, count=len(sim.buffer))
        late = sim.now + req.work[ids] * self.s_tok > req.arrival[ids] + ttft[req.cls[ids]]
        for rid in ids[late & (req.done[ids] == 0)]:
            sim.reject(int(rid), "slo")

    def on_arrival(self, sim, rid: int) -> None:
        self.drop_lost(sim)
        if rid in sim.buffer:  # not itself lost already
            super().on_arrival(sim, rid)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self.drop_lost(sim)
        super().on_end_forward(sim, inst, fwd_time)

    def on_timer(self, sim, tag: object) -> None:
        self.drop_lost(sim)
        super().on_timer(sim, tag)


@register("prefill", "conductor_predictive")
class PredictiveConductor(OverloadGate):
    """Reject what would miss its TTFT on the prefill queue ahead, or its TPOT on the decode load predicted for
    when it would start (module docstring)."""

    def __init__(self, base: str | dict[str, Any] = "auto", slack: float = 1.0, tpot_slack: float = 1.0,
                 drop_late: bool = False):
        super().__init__(base, slack, drop_late)
        self.tpot_slack = check_float(tpot_slack, "policy.prefill.tpot_slack", 0.0, lo_open=True)

    def workers(self, sim) -> list[tuple[Any, int]]:
        """(cost model, DP units) of each instance whose units decode: decode instances, else colocated ones."""
        if sim.disaggregated:
            return [(sim.decode[i].cost, sim.decode[i].dp) for i in range(len(sim.decode))]
        return [(c.cost, c.dp) for c in sim.colocated]

    def step_time(self, sim, batch: float, kv: float) -> float:
        """The slowest decode instance's step with `batch` requests and `kv` KV tokens on each of its units."""
        out = 0.0
        for cost, dp in self.workers(sim):
            z = np.zeros(dp)
            out = max(out, float(cost.pass_time(z, z, np.full(dp, batch), np.full(dp, kv))))
        return out

    def rejects(self, sim, rid: int) -> bool:
        est = self.estimate(sim, rid)
        if est > self.slack * float(sim.classes.ttft_s[sim.req.cls[rid]]):
            return True
        req = sim.req
        units = sum(dp for _, dp in self.workers(sim))
        dec = req.state == DECODE
        n_now = max(int(dec.sum()), 1)
        step_now = self.step_time(sim, n_now / units, float((req.prompt[dec] + req.done[dec]).sum()) / units)
        pipe = np.isin(req.state, _PIPELINE)
        pipe[rid] = True
        if req.predicted is not None:
            left, out = np.maximum(req.predicted[dec] - req.done[dec], 1), req.predicted[pipe]
        else:  # no predictor: as much output still to come as came so far (the age rule), the mean for new ones
            left, out = np.maximum(req.done[dec], 1), float(req.done[dec].mean()) if dec.any() else 1.0
        alive = left * step_now > est  # still decoding when the candidate starts
        batch = (int(alive.sum()) + int(pipe.sum())) / units
        kv = (float((req.prompt[dec][alive] + req.done[dec][alive]).sum())
              + float((req.prompt[pipe] + out / 2).sum())) / units
        return self.step_time(sim, batch, kv) > self.tpot_slack * float(sim.classes.tpot_s[req.cls[rid]])


@register("prefill", "value_density")
class ValueDensityAdmission(OverloadGate):
    """Under a backlog, reject the arrivals of lowest weight per unit of predicted work (module docstring)."""

    def __init__(self, base: str | dict[str, Any] = "auto", slack: float = 1.0, backlog_s: float = 0.2,
                 quantile: float = 0.3, beta: float = 0.0, window: int = 256, drop_late: bool = False):
        super().__init__(base, slack, drop_late)
        self.backlog_s = check_float(backlog_s, "policy.prefill.backlog_s", 0.0)
        self.quantile = check_float(quantile, "policy.prefill.quantile", 0.0, 1.0)
        self.beta = check_float(beta, "policy.prefill.beta", 0.0)
        check(isinstance(window, int) and not isinstance(window, bool) and window >= 1, "policy.prefill.window",
              f"got {window!r}; must be an integer >= 1 (recent arrivals whose densities set the cut)")
        self.window = window

    def prepare(self, sim) -> None:
        self.recent: deque[float] = deque(maxlen=self.window)
        self.n_done, self.out_done = 0, 0.0  # finished requests seen and their output tokens (no predictor)
        super().prepare(sim)

    def expected_output(self, sim, rid: int) -> float:
        """The predicted output length; without a predictor the mean output of the requests finished so far."""
        req = sim.req
        if req.predicted is not None:
            return float(req.predicted[rid])
        new = np.asarray(sim.completed[self.n_done:], dtype=np.int64)
        self.n_done += len(new)
        self.out_done += float(req.done[new].sum())
        return self.out_done / self.n_done if self.n_done else 0.0

    def density(self, sim, rid: int) -> float:
        req = sim.req
        work = float(req.work[rid]) + (self.beta * self.expected_output(sim, rid) if self.beta else 0.0)
        return float(sim.classes.weight[req.cls[rid]]) / max(work, 1.0)

    def rejects(self, sim, rid: int) -> bool:
        d = self.density(sim, rid)
        self.recent.append(d)
        est = self.estimate(sim, rid)
        if est > self.slack * float(sim.classes.ttft_s[sim.req.cls[rid]]):
            return True
        wait = est - float(sim.req.work[rid]) * self.s_tok - sim.cfg.cluster.net_latency_s
        return wait > self.backlog_s and d < float(np.quantile(np.fromiter(self.recent, float), self.quantile))
