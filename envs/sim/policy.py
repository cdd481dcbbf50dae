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

from bisect import insort
from dataclasses import dataclass, field
from heapq import heapify, heappop, heapreplace
from itertools import islice

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
        # Same decisions as: for each pooled request in order, the first worker of least KV among those
        # with a free slot and room for its load (np.argmin over np.where(ok, kv, inf)); the round ends
        # when no worker has a free slot. Kept in plain Python, O(what it admits or passes over):
        # `order` holds (kv, worker) of the workers with a free slot, as a heap (one KV capacity: its top
        # fits or no worker does) or sorted (else: its first entry with room), so the pick is the
        # least-KV feasible worker with the lowest index on ties (argmin's first minimum);
        # the pool is read lazily (`pool_in_order`), not copied; and since KV and batches only grow
        # within a round, a request at least as large as one that fit nowhere is passed over at once.
        d = sim.decode[inst]
        limit = d.batch_limit
        batch = d.batch.tolist()
        kv = d.kv.tolist()
        order = [(k, w) for w, (k, b) in enumerate(zip(kv, batch)) if b < limit]
        if not order:
            return
        cap = d.kv_cap.tolist()
        load_of = sim.req.load
        too_big = None  # least load that fit no worker this round
        if cap.count(cap[0]) == len(cap):
            # One capacity: the least-KV worker with a slot (the heap's top) fits, or none does.
            c = cap[0]
            heapify(order)
            for rid in pool_in_order(sim):
                load = load_of(rid)
                if too_big is not None and load >= too_big:
                    continue
                k, w = order[0]
                if k + load > c:
                    too_big = load
                    continue
                sim.admit(rid, inst, w)
                batch[w] += 1
                if batch[w] < limit:
                    heapreplace(order, (k + load, w))
                else:
                    heappop(order)
                    if not order:
                        return
            return
        order.sort()
        for rid in pool_in_order(sim):
            load = load_of(rid)
            if too_big is not None and load >= too_big:
                continue
            for i, (k, w) in enumerate(order):  # noqa: B007 (i is used after the loop)
                if k + load <= cap[w]:
                    break
            else:
                too_big = load
                continue
            sim.admit(rid, inst, w)
            del order[i]
            batch[w] += 1
            if batch[w] < limit:
                insort(order, (k + load, w))
            elif not order:
                return


def pool_in_order(sim: SimView, chunk: int = 16):
    """Pool request ids in arrival (pool) order, read a few at a time: the caller may admit (remove)
    each id it is given, and a caller that stops early has read only about what it used. Reading
    resumes after the ids given so far that are still pooled, so the cost is O(ids read), not a copy of
    the pool (the engine's least-KV router and the baselines' routers share it)."""
    start = 0
    while True:
        ids = list(islice(sim.pool, start, start + chunk))
        if not ids:
            return
        yield from ids
        pool = sim.pool
        start += sum(1 for rid in ids if rid in pool)
        chunk *= 2


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
