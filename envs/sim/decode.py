"""Decode instances of a disaggregated cluster: D workers stepping in lock step.

Assignment is sticky: a request stays on its worker until it finishes or is preempted.
Each worker has a batch limit and a KV capacity; a request's load is prompt + tokens
produced so far and grows by one per step. Admission happens at step boundaries only,
through the decode router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import requests as R
from .events import PAUSED, EventKind, PassKind
from .stepping import Stepper

if TYPE_CHECKING:  # pragma: no cover
    from .host import Host

DECODE_END, DECODE_START = int(EventKind.DECODE_END), int(EventKind.DECODE_START)
DECODE_PASS = int(PassKind.DECODE)


class DecodeInstance(Stepper):
    """One decode instance; its methods are the engine's transitions for it."""

    HANDLERS = {EventKind.DECODE_END: "end_step", EventKind.DECODE_START: "start_step"}  # event kind -> method

    def __init__(self, sim: Host, idx: int, dp: int, batch_limit: int, kv_cap: int, cost,
                 asleep: set[int] | None = None):
        super().__init__()
        self.sim = sim
        self.idx = idx
        self.dp = dp
        self.cost = cost
        self.batch_limit = batch_limit
        self.kv_cap = np.full(dp, kv_cap, dtype=np.int64)
        self.batch = np.zeros(dp, dtype=np.int64)
        self.kv = np.zeros(dp, dtype=np.int64)  # sum over active requests of prompt + done
        self.n_batch = 0  # = batch.sum(), kept by this instance's own transitions (a step reads it twice)
        self.slots = dp * batch_limit
        self.active = [set() for _ in range(dp)]
        self.busy = False
        self.start_queued = False  # a DECODE_START event is on the heap
        # The indices of the instances of this tier that are neither stepping nor queued to start (shared by the tier,
        # kept by wake / start_step / end_step): a KV transfer wakes those, not the whole tier (issue 36's scale).
        self.asleep = {idx} if asleep is None else asleep
        self.asleep.add(idx)
        self.step_start = 0.0
        self.step_end = 0.0
        self.zeros = np.zeros(dp)

    @property
    def n_running(self) -> int:
        """Requests decoding on this instance."""
        return int(self.batch.sum())

    def free_slots(self) -> np.ndarray:
        """Free batch slots per worker."""
        return self.batch_limit - self.batch

    def fits(self, load: int) -> np.ndarray:
        """The admission rule, per worker: a free slot and room for `load` KV tokens. `admit` applies it to one
        worker (the same comparisons on scalars); routers and the envs' masks ask it through the view."""
        return (self.batch < self.batch_limit) & (self.kv + load <= self.kv_cap)

    # ------------------------------------------------------------------ transitions
    def wake(self) -> None:
        """Queue a step start now unless the instance is stepping or one is queued."""
        if not self.busy and not self.start_queued:
            self.start_queued = True
            self.asleep.discard(self.idx)
            self.sim.push(self.sim.now, DECODE_START, self)

    def admit(self, rid: int, worker: int) -> bool:
        """Pool request `rid` joins `worker` if `fits` allows it there (else nothing changes)."""
        req = self.sim.req
        load = req.load(rid)
        if not (self.batch[worker] < self.batch_limit and self.kv[worker] + load <= self.kv_cap[worker]):  # fits()
            return False
        self.batch[worker] += 1
        self.n_batch += 1
        self.kv[worker] += load
        self.active[worker].add(rid)
        req.decode_inst[rid] = self.idx
        req.worker[rid] = worker
        self.start_decoding(req, rid, self.sim.now)
        return True

    def start_step(self) -> None:
        """DECODE_START: the router admits from the pool, KV overflow is relieved, then a step runs."""
        self.start_queued = False
        if self.busy:
            return
        sim = self.sim
        if not sim.pool and self.n_batch == 0:  # nothing to admit and nothing running (so no KV): what follows is a no-op
            self.rest()
            return
        order = sim.queue_order
        if order is not None and order.preempts and sim.pool:
            self._yield_to_rank(order.key)
        if sim.pool and self.n_batch < self.slots:
            compiled = self.cost.route_kernel  # engine=numba: the default least-KV round compiled, same admissions
            if (compiled is None or not compiled(self)) and sim.ask("decode", self.wake, "route", self.idx) is PAUSED:
                return  # an agent decides the admissions: this start is replayed when the run resumes
        kv, kernel = self.kv, self.cost.decode_kernel  # engine=numba: this start's NumPy compiled, same values
        if kernel is None:
            over = kv + self.batch > self.kv_cap
            over_any = over.any()
        else:
            over_any, dur, kv_max, kv_min = kernel(self.batch, kv, self.kv_cap)
        if over_any:
            for w in np.flatnonzero(kv + self.batch > self.kv_cap).tolist():
                self._relieve(w)
        nb = self.n_batch
        if nb == 0:
            if over_any and sim.pool:
                # every running request was just rejected: admit from the pool again, or it would wait forever
                self.wake()
            self.rest()
            return
        if kernel is None:
            dur = self.cost.pass_time(self.zeros, self.zeros, self.batch, kv)
            kv_max, kv_min = int(kv.max()), int(kv.min())
        elif over_any:  # the batches changed since the kernel ran
            _, dur, kv_max, kv_min = kernel(self.batch, kv, self.kv_cap)
        now = sim.now
        self.busy = True
        self.step_start = now
        self.step_end = now + dur
        sim.record_pass(DECODE_PASS, self, dur, nb, nb, kv_max, kv_min,
                        nb / (self.dp * self.batch_limit), self.zeros, self.batch, kv)
        sim.push(now + dur, DECODE_END, self)

    def _relieve(self, w: int) -> None:
        """KV of worker w would overflow this step: preempt its youngest requests (or reject)."""
        sim = self.sim
        req = sim.req
        while self.kv[w] + self.batch[w] > self.kv_cap[w]:
            rid = self.preempt_youngest(req, self.active[w])
            self.active[w].discard(rid)
            self.batch[w] -= 1
            self.n_batch -= 1
            self.kv[w] -= req.prompt[rid] + req.done[rid]
            if self.batch[w] == 0 or sim.cfg.cluster.kv_policy == "reject":
                sim.reject_request(rid, R.reason_code("kv_exhausted"))
            else:
                req.requeue(rid)
                sim.buffer_request(rid)

    def _yield_to_rank(self, key) -> None:
        """vLLM priority scheduling: when the first pooled request fits no worker (slot and KV) and a running request
        ranks below it (a larger `key`), the lowest-ranked running request is preempted (recomputed through
        prefill), freeing its worker for the router's admissions of this step. One preemption per step."""
        sim = self.sim
        req = sim.req
        head = next(iter(sim.pool))
        load = req.load(head)
        if ((self.batch < self.batch_limit) & (self.kv + load <= self.kv_cap)).any():
            return
        running = [r for a in self.active for r in a]
        if not running:
            return
        victim = max(running, key=key)
        if key(victim) <= key(head):
            return
        w = int(req.worker[victim])
        self.preempt(req, victim)
        self.active[w].discard(victim)
        self.batch[w] -= 1
        self.n_batch -= 1
        self.kv[w] -= req.prompt[victim] + req.done[victim]
        req.requeue(victim)
        sim.buffer_request(victim)

    def end_step(self) -> None:
        """DECODE_END: every running request gained a token; due ones finish; the next step starts."""
        sim = self.sim
        self.busy = False
        s = self.tick(sim.now)
        nb = self.n_batch
        sim.tokens_out += nb
        self.kv += self.batch
        req = sim.req
        if self.cost.finish_kernel is not None and not sim.observers:  # engine=numba: the loop below compiled
            for rid, w in self.cost.finish_kernel(self, s):
                self.active[w].discard(rid)
                sim.finish_request(rid)
        else:
            for rid in self.due(req, s):
                if req.decode_inst[rid] != self.idx:
                    continue
                w = int(req.worker[rid])
                self.complete(req, rid)
                self.batch[w] -= 1
                self.n_batch -= 1
                self.kv[w] -= req.prompt[rid] + req.output[rid]
                self.active[w].discard(rid)
                sim.finish_request(rid)
        sim.pass_ended(DECODE_PASS, self.idx)
        if nb or sim.pool:
            self.start_step()
        else:
            self.rest()

    def rest(self) -> None:
        """Neither stepping nor queued to start: the next KV transfer (or a router's timer) wakes it."""
        if not self.busy and not self.start_queued:
            self.asleep.add(self.idx)
