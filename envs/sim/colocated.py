"""Colocated instances: an engine running both phases on `dp` units behind one barrier (DP 1 by default).

Each unit has slots, a KV budget and a token budget per iteration (`chunk_tokens`). The
batching policy returns a `Batch` per unit: prompt pieces and whether the running decodes
step. A request is admitted (takes a slot, reserves its context + 1 KV) when its first
piece is scheduled; when its prompt is done it decodes on the same unit.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from . import requests as R
from .events import PAUSED, EventKind, PassKind
from .policy import Batch
from .policy_errors import ActionError
from .stepping import Stepper

if TYPE_CHECKING:  # pragma: no cover
    from .host import Host

COLOCATED_END, COLOCATED_START = int(EventKind.COLOCATED_END), int(EventKind.COLOCATED_START)
COLOCATED_PASS = int(PassKind.COLOCATED)
WAITING, PREFILL = int(R.WAITING), int(R.PREFILL)
NO_BATCH = Batch()  # a unit the policy left idle (None): never changed


def _integer(x) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


class ColocatedUnit(Stepper):
    """One DP unit of a colocated instance: slots, a KV budget and both phases."""

    def __init__(self, slots: int, kv_cap: int, chunk_tokens: int):
        super().__init__()
        self.slots = slots
        self.kv_cap = kv_cap
        self.chunk_tokens = chunk_tokens  # token budget of one iteration
        self.waiting: deque[int] = deque()  # arrived, not yet admitted (FIFO)
        self.prefilling: list[int] = []  # admitted, prompt not finished (admission order)
        self.decoding: set[int] = set()
        self.n_decoding = 0
        self.kv_used = 0  # reserved KV: context + 1 of prefilling requests, load of decoding ones
        self.decode_kv = 0  # KV read by one decode iteration (sum of decoding loads)

    @property
    def n_running(self) -> int:
        """Admitted requests (prefilling or decoding)."""
        return len(self.prefilling) + self.n_decoding

    def free_slots(self) -> int:
        """Slots not held by a running request."""
        return self.slots - self.n_running

    def fill(self, req: R.RequestTable, budget: int, admit_new: bool, per_request: int | None) -> list[tuple[int, int]]:
        """Prompt pieces: running prefills first, then waiting requests (FIFO) while slots and KV allow."""
        pieces: list[tuple[int, int]] = []
        if not self.prefilling and not (admit_new and self.waiting):  # decodes only: nothing to fill
            return pieces
        cap = per_request or budget
        for rid in self.prefilling:
            if budget <= 0:
                return pieces
            take = min(int(req.work[rid]), budget, cap)
            pieces.append((rid, take))
            budget -= take
        if not admit_new:
            return pieces
        slots = self.slots - len(self.prefilling) - self.n_decoding
        kv_free = self.kv_cap - self.kv_used - self.n_decoding  # this iteration's decode tokens come first
        for rid in self.waiting:
            if budget <= 0 or slots <= 0:
                break
            need = req.load(rid) + 1
            if need > kv_free:
                break  # FIFO: no overtaking
            take = min(int(req.work[rid]), budget, cap)
            pieces.append((rid, take))
            budget -= take
            slots -= 1
            kv_free -= need
        return pieces

    def admit(self, sim: Host, rid: int, decode: bool) -> None:
        """A waiting request's first piece is scheduled: it takes a slot and reserves context + 1 KV."""
        req = sim.req
        need = req.load(rid) + 1
        if self.free_slots() <= 0 or self.kv_used + need + (self.n_decoding if decode else 0) > self.kv_cap:
            raise ActionError(f"request {rid} does not fit its unit's memory (slots {self.free_slots()} free, "
                              f"KV {self.kv_cap - self.kv_used} tokens free, it needs {need})")
        self.waiting.remove(rid)
        self.prefilling.append(rid)
        self.kv_used += need  # its context plus the token its prefill will produce
        req.state[rid] = R.PREFILL
        if math.isnan(req.prefill_start[rid]):
            req.prefill_start[rid] = sim.now
        req.device_wait[rid] += sim.now - req.dev_arrive[rid]  # every wait counts (also after a preemption)

    def relieve(self, sim: Host) -> None:
        """A decode iteration would overflow the unit's KV: preempt the youngest decodes (recompute)."""
        req = sim.req
        while self.n_decoding and self.kv_used + self.n_decoding > self.kv_cap:
            rid = self.preempt_youngest(req, self.decoding)
            self._stop_decoding(req, rid)
            if self.n_running == 0 or sim.cfg.cluster.kv_policy == "reject":
                sim.reject_request(rid, R.reason_code("kv_exhausted"))
            else:
                self._requeue(sim, rid)

    def _requeue(self, sim: Host, rid: int) -> None:
        """A preempted request waits again at the head (its KV is gone: its context is recomputed), or where the
        queue discipline puts it."""
        req = sim.req
        req.requeue(rid)
        req.state[rid] = R.WAITING
        req.dev_arrive[rid] = sim.now
        self.waiting.appendleft(rid)
        if sim.queue_order is not None:
            sim.queue_order.sort_deque(self.waiting)

    def yield_to_rank(self, sim: Host, key) -> None:
        """vLLM priority scheduling: while the first waiting request does not fit (slots or KV) and a decoding one
        ranks below it (a larger `key`), the lowest-ranked decoding request is preempted and requeued."""
        req = sim.req
        while self.waiting and self.n_decoding:
            head = self.waiting[0]
            kv_free = self.kv_cap - self.kv_used - self.n_decoding
            if self.free_slots() > 0 and req.load(head) + 1 <= kv_free:
                return
            victim = max(self.decoding, key=key)
            if key(victim) <= key(head):
                return
            self.preempt(req, victim)
            self._stop_decoding(req, victim)
            self._requeue(sim, victim)

    def _stop_decoding(self, req: R.RequestTable, rid: int) -> None:
        load = req.load(rid)
        self.decoding.discard(rid)
        self.n_decoding -= 1
        self.kv_used -= load
        self.decode_kv -= load

    def end_iteration(self, sim: Host, pieces: list[int], dec: bool) -> None:
        """The unit's part of an iteration ended: decodes gained a token, finished prompts start decoding."""
        req = sim.req
        if dec:
            n = self.n_decoding
            s = self.tick(sim.now)
            self.kv_used += n
            self.decode_kv += n
            sim.tokens_out += n
            for rid in self.due(req, s):
                if rid not in self.decoding:
                    continue
                self.complete(req, rid)
                self._stop_decoding(req, rid)
                sim.finish_request(rid)
        for rid in pieces:
            if req.work[rid] > 0:
                continue
            self.prefilling.remove(rid)
            sim.token(rid)
            if req.done[rid] >= req.output[rid]:
                self.kv_used -= req.load(rid)
                sim.finish_request(rid)
                continue
            self.start_decoding(req, rid, sim.now)
            self.decoding.add(rid)
            self.n_decoding += 1
            self.decode_kv += req.load(rid)


class ColocatedInstance:
    """One colocated instance; its methods are the engine's transitions for it."""

    HANDLERS = {EventKind.COLOCATED_START: "start_iteration", EventKind.COLOCATED_END: "end_iteration"}

    def __init__(self, sim: Host, idx: int, dp: int, slots: int, kv_cap: int, chunk_tokens: int, cost):
        self.sim = sim
        self.idx = idx
        self.dp = dp
        self.cost = cost
        self.units = [ColocatedUnit(slots, kv_cap, chunk_tokens) for _ in range(dp)]
        self.busy = False
        self.start_queued = False  # a COLOCATED_START event is on the heap
        self.iter_start = 0.0
        self.iter_end = 0.0
        self.n_iters = 0
        self.plan: list = []  # per unit: (pieces, decode flag) of the iteration in progress

    def accept(self, rid: int, dp: int | None) -> int:
        """A dispatch leaves the scheduler; the engine picks the unit with the fewest requests unless given."""
        if dp is None:
            units = self.units
            dp = min(range(len(units)), key=lambda u: units[u].n_running + len(units[u].waiting))
        return dp

    def arrive(self, rid: int) -> None:
        """The dispatched request reaches its unit's waiting queue."""
        sim = self.sim
        req = sim.req
        req.state[rid] = R.WAITING
        req.dev_arrive[rid] = sim.now
        waiting = self.units[int(req.prefill_dp[rid])].waiting
        waiting.append(rid)
        if sim.queue_order is not None:  # a discipline other than arrival order (ordering.py)
            sim.queue_order.sort_deque(waiting)
        self.wake()

    def wake(self) -> None:
        """Queue an iteration start now unless one runs or is queued."""
        if not self.busy and not self.start_queued:
            self.start_queued = True
            self.sim.push(self.sim.now, COLOCATED_START, self)

    def start_iteration(self) -> None:
        """COLOCATED_START: the batching policy picks each unit's batch; the iteration runs them in one pass."""
        self.start_queued = False
        if self.busy:
            return
        sim = self.sim
        order = sim.queue_order
        if order is not None and order.preempts:
            for u in self.units:
                u.yield_to_rank(sim, order.key)
        batches = []  # per unit: (the Batch, its checked pieces)
        empty = True
        for ui in range(self.dp):
            b = sim.ask("batching", self.wake, "next_batch", self.idx, ui)
            if b is PAUSED:  # an agent picks the batch: this start is replayed when the run resumes
                return
            if b is None:
                batches.append((NO_BATCH, ()))
                continue
            batches.append((b, self.check_batch(ui, b)))
            if empty and not b.empty():
                empty = False
        if empty:
            return
        dp = self.dp
        ptok = [0] * dp  # per unit, Python numbers: NumPy vectors only for the cost model's vector path
        attn = [0.0] * dp
        dreq = [0] * dp
        dkv = [0] * dp
        ends = [0] * dp  # prompts whose last token is in this iteration: each runs the LM head
        plan = []
        req = sim.req
        work = req.work
        budget = 0
        n_tok = n_req = 0  # the iteration's prompt tokens and decoding requests, over units
        relieved = False
        for ui, (u, (b, checked)) in enumerate(zip(self.units, batches)):
            budget += u.chunk_tokens
            if b.decode and u.n_decoding and u.kv_used + u.n_decoding > u.kv_cap:
                u.relieve(sim)
                relieved = True
            pieces = []
            tok = 0
            at = 0.0
            end = 0
            for rid, take, rem, waiting in checked:
                if waiting:
                    try:
                        u.admit(sim, rid, b.decode)
                    except ActionError as exc:
                        raise self.refused(ui, str(exc)) from None
                if take <= 0:
                    continue
                prior = req.load(rid) - rem
                at += take * (prior + take * 0.5)
                tok += take
                work[rid] = rem - take
                end += take == rem
                pieces.append(rid)
            ptok[ui] = tok
            attn[ui] = at
            ends[ui] = end
            n_tok += tok
            dec = bool(b.decode and u.n_decoding)
            if dec:
                dreq[ui] = u.n_decoding
                dkv[ui] = u.decode_kv
                n_req += u.n_decoding
            plan.append((pieces, dec))
        if not n_tok and not n_req:
            if relieved:  # preemption emptied the batch: ask the policy again with the new state
                self.wake()
            return
        tot = float(n_tok)
        nreq = float(n_req)
        one = self.cost.pass_time1 if dp == 1 and not sim.observers else None
        if one is not None:  # one unit: the cost model's scalar twin (same value)
            dur = one(ptok[0], attn[0], dreq[0], dkv[0], ends[0])
        else:
            ptok, attn, dreq, dkv, ends = (np.array(x, dtype=float) for x in (ptok, attn, dreq, dkv, ends))
            dur = self.cost.pass_time(ptok, attn, dreq, dkv, ends)
        now = sim.now
        self.busy = True
        self.iter_start = now
        self.iter_end = now + dur
        self.plan = plan
        if dp == 1:
            kv_max = kv_min = self.units[0].kv_used
        else:
            kvs = [u.kv_used for u in self.units]
            kv_max, kv_min = max(kvs), min(kvs)
        sim.record_pass(COLOCATED_PASS, self, dur, tot + nreq, nreq, kv_max, kv_min, tot / budget, ptok, dreq, dkv)
        sim.push(now + dur, COLOCATED_END, self)

    def check_batch(self, ui: int, b) -> list[tuple[int, int, int, bool]]:
        """The engine's rules for the batch a policy picked for unit `ui`, checked before anything changes: a
        `Batch` of (request id, tokens) pieces, no request twice, each request waiting or prefilling on this unit,
        tokens an integer >= 0, and the pieces' tokens (each capped at its request's remaining prompt) within the
        unit's budget `chunk_tokens`. Whether a waiting request fits the unit's slots and KV is checked when it is
        admitted (ColocatedUnit.admit: a decode step may first free KV). Returns the pieces as the iteration runs
        them, (request id, tokens capped at its remaining prompt, its remaining prompt, whether it is waiting): the
        iteration reads the request table once."""
        if not isinstance(b, Batch):
            raise self.refused(ui, f"got {type(b).__name__}; must be a Batch or None")
        if not b.prefill:  # decodes only: nothing to check
            return []
        req = self.sim.req
        state, work, p_inst, p_dp, n = req.state, req.work, req.prefill_inst, req.prefill_dp, req.n
        seen: set[int] = set()
        total = 0
        idx = self.idx
        out = []
        for piece in b.prefill:
            if type(piece) is not tuple or len(piece) != 2:
                raise self.refused(ui, f"piece {piece!r} is not a (request id, tokens) pair")
            rid, take = piece
            if not ((type(rid) is int or _integer(rid)) and 0 <= rid < n):  # type() first: the ABC check is slow
                raise self.refused(ui, f"piece {piece!r}: no request {rid!r}")
            if rid in seen:
                raise self.refused(ui, f"request {rid} appears twice (one piece per request and iteration)")
            seen.add(rid)
            if not (type(take) is int or _integer(take)) or take < 0:
                raise self.refused(ui, f"piece ({rid}, {take!r}): tokens must be an integer >= 0")
            st = state.item(rid)  # .item: a Python int, cheaper to read and compare than a NumPy scalar
            if (st != WAITING and st != PREFILL) or p_inst.item(rid) != idx or p_dp.item(rid) != ui:
                raise self.refused(ui, f"request {rid} is not waiting or prefilling on this unit (a unit takes only "
                                   "requests it holds)")
            rem = work.item(rid)
            take = int(take) if take < rem else rem
            total += take
            out.append((rid, take, rem, st == WAITING))
        if total > self.units[ui].chunk_tokens:
            raise self.refused(ui, f"{total:,} prompt tokens exceed the unit's budget chunk_tokens="
                               f"{self.units[ui].chunk_tokens:,}")
        return out

    def refused(self, ui: int, rule: str) -> ActionError:
        """The batching policy's Batch for unit `ui` broke `rule`: the one line that says so."""
        return ActionError(f"policy.batching: {type(self.sim.policies['batching']).__name__}.next_batch(inst="
                           f"{self.idx}, unit={ui}) returned a Batch the engine refuses: {rule}", named=True)

    def end_iteration(self) -> None:
        """COLOCATED_END: each unit settles its part; the next iteration is asked for if work is left."""
        sim = self.sim
        self.busy = False
        self.n_iters += 1
        busy_after = False
        for u, (pieces, dec) in zip(self.units, self.plan):
            u.end_iteration(sim, pieces, dec)
            busy_after = busy_after or u.n_running > 0 or bool(u.waiting)
        self.plan = []
        sim.pass_ended(COLOCATED_PASS, self.idx)
        if busy_after:
            if not self.start_queued and sim.next_now():  # the start it would queue runs next: run it now
                self.start_iteration()
            else:
                self.wake()
