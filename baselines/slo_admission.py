"""Conductor-style early rejection (Mooncake, FAST 2025; ALGORITHMS.md section 9): admission control in front of any
prefill dispatcher.

At arrival the request's TTFT is estimated on every healthy instance as (prefill tokens ahead of it there + its own
remaining prompt work) x the cost model's seconds per prompt token of a full chunk (ordering.seconds_per_prefill_token)
plus the network hop, where the tokens ahead are those of the instance's least-loaded DP unit (disaggregated: wire +
device queue + pass; colocated: waiting and prefilling work spread over the units) plus the scheduler's buffered work
spread over every healthy unit. When even the smallest estimate exceeds the TTFT SLO of the request's class, it is
rejected at once (reason `slo`, counted as a miss and in `early_rejections`); otherwise the wrapped dispatcher
(`base`, any registered prefill policy: SBS, least_tokens, ...) gets it as if nothing stood in front.

`base: auto` (the default of every ArrivalGate) is SBS on a disaggregated cluster and round_robin on a colocated
one (the PrefillAdmit env's base, envs/slo_admit.py, so its agents and this rule admit in front of the same one).
On a P/D cluster the queue discipline (queue.order) sorts the scheduler's buffer, and only a dispatcher that holds
a buffer lets it act: an immediate dispatcher (least_tokens, the default before) sends each arrival to a device
queue at once, in arrival order, so EDF or priority change no TTFT behind it, and its device queues make TTFT
about twice the estimate (measured 2026-12-04 on slo_pd_tiers, 3,000 requests, seeds 0-2: conductor over
least_tokens 0.570, 0.562, 0.560 weighted attainment with EDF or FCFS alike, 13-18 rejections; over SBS with EDF
0.895, 0.877, 0.914). On a colocated cluster SBS has no prefill instances to stagger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdgym.envs.sim.ordering import seconds_per_prefill_token
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.validation import check_float

from .registry import make_policy, register


def dispatcher(spec: str | Mapping[str, Any] | PrefillScheduler, sim) -> PrefillScheduler:
    """The prefill dispatcher `spec` names for `sim`'s cluster: `auto` is SBS on a disaggregated cluster, round_robin
    on a colocated one (module docstring)."""
    if spec == "auto":
        spec = "sbs" if sim.disaggregated else "round_robin"
    return make_policy("prefill", spec)


class ArrivalGate(PrefillScheduler):
    """Admission in front of the prefill dispatcher `base`: a fresh arrival (not a bounced or preempted request)
    that `rejects` names is rejected at once (reason `slo`, a miss); every other request and every other hook
    goes to `base` as if nothing stood in front. Conductor's estimate and the hindsight row's reject set are
    two answers to `rejects`; a gate of your own subclasses this (pdgym.baselines.ArrivalGate) and defines
    `rejects(sim, rid)` (docs/concepts.md, "Add a policy").

    `base`: a prefill policy name, {name: ..., params}, a policy object, or `auto` (module docstring: SBS on a
    disaggregated cluster, round_robin on a colocated one, chosen at reset)."""

    def __init__(self, base: str | Mapping[str, Any] | PrefillScheduler = "auto"):
        self.base_spec = base
        self.base = None if base == "auto" else make_policy("prefill", base)

    def rejects(self, sim, rid: int) -> bool:
        raise NotImplementedError

    def reset(self, sim) -> None:
        if self.base_spec == "auto":  # a fresh dispatcher per run: a policy keeps per-run state
            self.base = dispatcher("auto", sim)
        self.base.reset(sim)

    def on_arrival(self, sim, rid: int) -> None:
        if sim.req.done[rid] == 0 and not sim.req.preemptions[rid] and self.rejects(sim, rid):
            sim.reject(rid, "slo")
            return
        self.base.on_arrival(sim, rid)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self.base.on_end_forward(sim, inst, fwd_time)

    def on_timer(self, sim, tag: object) -> None:
        self.base.on_timer(sim, tag)

    def on_topology_change(self, sim) -> None:
        self.base.on_topology_change(sim)


@register("prefill", "conductor")
class ConductorAdmission(ArrivalGate):
    """Reject at arrival what no instance can serve within its TTFT SLO; dispatch the rest with `base`."""

    def __init__(self, base: str | dict[str, Any] = "auto", slack: float = 1.0):
        super().__init__(base)
        self.slack = check_float(slack, "policy.prefill.slack", 0.0, lo_open=True)  # reject above slack x the SLO

    def reset(self, sim) -> None:
        self.s_tok = seconds_per_prefill_token(sim)
        super().reset(sim)

    def estimate(self, sim, rid: int) -> float:
        """The smallest estimated TTFT of `rid` over the healthy instances (module docstring)."""
        req = sim.req
        healthy = sim.healthy_prefill()
        if not healthy:
            return float("inf")
        own = int(req.work[rid])
        if sim.disaggregated:
            ahead = [int(sim.prefill[i].load_tokens().min()) for i in healthy]
            units = sum(sim.prefill[i].dp for i in healthy)
        else:
            work = req.work
            ahead = []
            for i in healthy:
                us = sim.colocated[i].units
                ahead.append(sum(int(work[r]) for u in us for r in (*u.waiting, *u.prefilling)) // len(us))
            units = sum(len(sim.colocated[i].units) for i in healthy)
        buffered = sum(int(req.work[r]) for r in sim.buffer if r != rid) // max(units, 1)
        return (min(ahead) + buffered + own) * self.s_tok + sim.cfg.cluster.net_latency_s

    def rejects(self, sim, rid: int) -> bool:
        return self.estimate(sim, rid) > self.slack * float(sim.classes.ttft_s[sim.req.cls[rid]])
