"""The three decision points of a cluster and the engine's own default behaviour at each.

A policy receives a `SimView` (view.py) as its state view (read its attributes, never
assign them) and acts only through the simulator's action methods: `dispatch`, `reject`,
`set_timer`, `admit`, `pause`. The defaults below are what an engine does with no
scheduler in front of it, so a run works end to end before any baseline is chosen;
the literature's heuristics live in `pdgym.baselines`.

A policy callback may call `sim.pause()` to hand control to an outside agent (the
Gymnasium envs do this): the simulator stops after the callback returns, and the
event that asked for a decision (decode admission, batch choice) is replayed when the
run resumes, so the agent's actions take effect before the engine moves on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .view import SimView


class PrefillScheduler:
    """Global prefill scheduler: decides when and to which (instance, DP unit) buffered requests go.

    Arrived requests sit in `sim.buffer` (arrival order) until dispatched or rejected.
    """

    name = "base"

    def reset(self, sim: SimView) -> None:
        """Called once before the run starts."""

    def on_arrival(self, sim: SimView, rid: int) -> None:
        """A request entered the buffer (a new arrival or one bounced back by a failed instance)."""

    def on_end_forward(self, sim: SimView, inst: int, fwd_time: float) -> None:
        """Prefill instance `inst` reported the end of a forward pass of `fwd_time` seconds."""

    def on_timer(self, sim: SimView, tag: object) -> None:
        """A timer this policy set with `sim.set_timer(t, "prefill", tag)` fired."""

    def on_topology_change(self, sim: SimView) -> None:
        """`sim.prefill_healthy` changed (failure detected, instance back, scale event)."""


class DecodeRouter:
    """Decode router: at each step boundary of a decode instance, admits pool requests to its workers."""

    name = "base"

    def reset(self, sim: SimView) -> None:
        """Called once before the run starts."""

    def route(self, sim: SimView, inst: int) -> None:
        """Admit requests from `sim.pool` to workers of decode instance `inst` with `sim.admit`."""

    def on_timer(self, sim: SimView, tag: object) -> None:
        """A timer this policy set with `sim.set_timer(t, "decode", tag)` fired."""


@dataclass
class Batch:
    """One iteration of a colocated unit: prompt pieces to prefill and whether running decodes step.

    `prefill` holds (request id, tokens) pairs; a request not yet running is admitted
    (takes a slot, reserves its prompt KV) when its first piece is scheduled.
    """

    prefill: list[tuple[int, int]] = field(default_factory=list)
    decode: bool = False

    def empty(self) -> bool:
        return not self.prefill and not self.decode


class BatchingPolicy:
    """Batching policy of a colocated instance: picks each iteration's batch per DP unit."""

    name = "base"

    def reset(self, sim: SimView) -> None:
        """Called once before the run starts."""

    def next_batch(self, sim: SimView, inst: int, unit: int) -> Batch | None:
        """Return the next batch of unit `unit` of colocated instance `inst`, or None to idle."""
        return None

    def on_timer(self, sim: SimView, tag: object) -> None:
        """A timer this policy set with `sim.set_timer(t, "batching", tag)` fired."""


# --------------------------------------------------------------------------- engine defaults
class RoundRobinDispatch(PrefillScheduler):
    """Immediate dispatch on arrival, instances in turn; the engine picks the DP unit."""

    name = "round_robin"

    def reset(self, sim: SimView) -> None:
        self._next = 0

    def on_arrival(self, sim: SimView, rid: int) -> None:
        healthy = sim.healthy_prefill()
        if not healthy:
            return  # held in the buffer until an instance is back (on_topology_change)
        inst = healthy[self._next % len(healthy)]
        self._next += 1
        sim.dispatch(rid, inst)

    def on_topology_change(self, sim: SimView) -> None:
        for rid in list(sim.buffer):
            self.on_arrival(sim, rid)


class LeastLoadedAdmission(DecodeRouter):
    """Admit pool requests in arrival order, each to the worker with the least KV that fits it."""

    name = "least_loaded"

    def route(self, sim: SimView, inst: int) -> None:
        d = sim.decode[inst]
        for rid in list(sim.pool):
            load = sim.req.load(rid)
            ok = (d.batch < d.batch_limit) & (d.kv + load <= d.kv_cap)
            if not ok.any():
                if not (d.batch < d.batch_limit).any():
                    return
                continue
            w = int(np.argmin(np.where(ok, d.kv, np.iinfo(np.int64).max)))
            sim.admit(rid, inst, w)


class MixedBatching(BatchingPolicy):
    """Decode-maximal mixed batching: all running decodes step, waiting prompts fill the token budget.

    The engine default of a colocated instance (vLLM v1 / SGLang style chunked prefill).
    """

    name = "mixed"

    def next_batch(self, sim: SimView, inst: int, unit: int) -> Batch | None:
        u = sim.colocated[inst].units[unit]
        n_dec = u.n_decoding
        budget = u.chunk_tokens - n_dec
        pieces = sim.fill_prefill(inst, unit, budget)
        if not pieces and n_dec == 0:
            return None
        return Batch(prefill=pieces, decode=n_dec > 0)
