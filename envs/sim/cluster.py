"""The discrete-event cluster simulator: event loop, instance mechanics and the policy action API.

One `Simulator` is one run. Time is continuous (seconds); a heap orders events and a
sequence number breaks ties, so a seed gives one exact history. Open-loop arrivals
are read from a sorted array instead of the heap (they are the most numerous events).
Every request ends finished or rejected with a reason; a run that would otherwise end
with requests still in the system marks them rejected("stalled") and sets `stalled`.
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Any

import numpy as np

from . import requests as R
from .config import ConfigError, SimConfig, sim_config
from .cost import build_cost_model, kv_capacity_tokens, kv_transfer_time
from .events import EventKind, PassKind
from .hardware import load_hardware
from .instances import ColocatedInstance, DecodeInstance, PrefillInstance
from .models import load_model
from .policy import (
    Batch,
    BatchingPolicy,
    DecodeRouter,
    LeastLoadedAdmission,
    MixedBatching,
    PrefillScheduler,
    RoundRobinDispatch,
)
from .requests import RequestTable
from .workload import make_workload

# Heap entries and step rows hold plain ints (EventKind / PassKind values): cheap in the hot loop.
DEC_END, DEC_START, PF_END, DEV_ARRIVE, KV_READY = (int(k) for k in (
    EventKind.DECODE_END, EventKind.DECODE_START, EventKind.PREFILL_END, EventKind.DEVICE_ARRIVE, EventKind.KV_READY))
CO_START, CO_END, TIMER, ARRIVE, FAULT, PF_START = (int(k) for k in (
    EventKind.COLOCATED_START, EventKind.COLOCATED_END, EventKind.TIMER, EventKind.ARRIVE, EventKind.FAULT,
    EventKind.PREFILL_START))
PASS_PREFILL, PASS_DECODE, PASS_COLOCATED = int(PassKind.PREFILL), int(PassKind.DECODE), int(PassKind.COLOCATED)

POLICY_KINDS = {"prefill": PrefillScheduler, "decode": DecodeRouter, "batching": BatchingPolicy}


class Simulator:
    """A P/D disaggregated or colocated cluster under one traffic sample.

    The attributes are the read-only state view policies use: `now`, `req` (RequestTable),
    `buffer` (requests held by the prefill scheduler, arrival order), `pool` (prefill-done
    requests awaiting decode admission), `prefill` / `decode` / `colocated` (instances),
    `prefill_healthy` (what health checks report), `rng` (the policies' generator).
    """

    def __init__(self, config: SimConfig | dict | Any, policies: dict | None = None, seed: int = 0):
        cfg = sim_config(config)
        self.cfg = cfg
        self.seed = int(seed)
        root = np.random.default_rng(self.seed)
        wl_rng, self._fault_rng, self.rng = root.spawn(3)
        self.hw = load_hardware(cfg.hardware)
        self.model = load_model(cfg.model)
        cl = cfg.cluster
        self.topology = cl.topology
        self.disaggregated = cl.topology == "disaggregated"

        wl = make_workload(cfg.workload, wl_rng)
        self.req = RequestTable(wl.prompt, wl.output, wl.prefix_key, wl.prefix_len)
        self._arrivals = wl.arrival  # None in closed loop
        self._concurrency = wl.concurrency
        self._think = wl.think_s

        self.prefill: list[PrefillInstance] = []
        self.decode: list[DecodeInstance] = []
        self.colocated: list[ColocatedInstance] = []
        if self.disaggregated:
            self._build_disaggregated()
        else:
            self._build_colocated()

        self.policies = self._resolve_policies(policies or {})
        self.scheduler: PrefillScheduler = self.policies["prefill"]
        self.router: DecodeRouter = self.policies["decode"]
        self.batcher: BatchingPolicy = self.policies["batching"]

        self.now = 0.0
        self.buffer: dict[int, None] = {}
        self.pool: dict[int, None] = {}
        self.paused = False
        self.finished_run = False
        self.stalled = False
        self.n_resolved = 0
        self.completed: list[int] = []  # finished request ids in completion order (their output is known)
        self.tokens_out = 0  # output tokens produced (conservation check)
        self.dropped_signals = 0
        self.n_events = 0
        self.steps: list[tuple] = []
        # Called as f(kind, inst, t, dur, unit_time, prefill_tokens, decode_reqs) when a pass starts
        # (per-DP-unit vectors, live: copy what you keep); read-only watchers such as the trace recorder.
        self.pass_observers: list = []
        self._heap: list[tuple] = []
        self._seq = 0
        self._next_arrival = 0  # open loop: index of the next arrival; closed loop: next release
        self._inflight = 0  # closed loop: released, unresolved requests
        self._start_pending: set[tuple[int, int]] = set()  # (kind, inst) start events already queued
        self._wall = 0.0
        self._started = False
        self._healthy: list[int] | None = None
        handlers = {
            EventKind.DECODE_END: self._decode_end, EventKind.DECODE_START: self._decode_start,
            EventKind.PREFILL_END: self._prefill_end, EventKind.DEVICE_ARRIVE: self._device_arrive,
            EventKind.KV_READY: self._kv_ready, EventKind.COLOCATED_START: self._colocated_start,
            EventKind.COLOCATED_END: self._colocated_end, EventKind.TIMER: self._timer,
            EventKind.ARRIVE: self._arrive, EventKind.FAULT: self._fault, EventKind.PREFILL_START: self._prefill_kick,
        }
        self._handlers = [handlers[k] for k in EventKind]  # indexed by the int kind of a heap entry

    # ------------------------------------------------------------------ construction
    def _build_disaggregated(self) -> None:
        cl, hw, model, cost_cfg = self.cfg.cluster, self.hw, self.model, self.cfg.cost
        p, d = cl.prefill, cl.decode
        n_prefill = max([p.count] + [int(s["count"]) for s in self.cfg.faults.scale])
        pcost = build_cost_model(cost_cfg, hw, model, p)
        dcost = build_cost_model(cost_cfg, hw, model, d)
        self.prefill = [PrefillInstance(i, p.dp, p.chunk_tokens, pcost, p.prefix_cache_entries, p.batch_form_s,
                                        p.dp_dispatch)
                        for i in range(n_prefill)]
        kv_cap = d.kv_capacity_tokens or kv_capacity_tokens(hw, model, d, key="cluster.decode")
        self.decode = [DecodeInstance(i, d.dp, d.batch_limit, kv_cap, dcost) for i in range(d.count)]
        self.prefill_healthy = np.arange(n_prefill) < p.count
        for inst in self.prefill[p.count:]:
            inst.up = False
        self._check_fits(kv_cap, "cluster.decode.kv_capacity_tokens")
        self._net = cl.net_latency_s
        link = cl.kv_link
        self._transfer = lambda tokens: kv_transfer_time(tokens, hw, model, link, cl.kv_transfer_base_s)

    def _build_colocated(self) -> None:
        cl = self.cfg.cluster
        c = cl.colocated
        cost = build_cost_model(self.cfg.cost, self.hw, self.model, c)
        kv_cap = c.kv_capacity_tokens or kv_capacity_tokens(self.hw, self.model, c, key="cluster.colocated")
        self.colocated = [ColocatedInstance(i, c.dp, c.batch_limit, kv_cap, c.chunk_tokens, cost)
                          for i in range(c.count)]
        self.prefill_healthy = np.ones(c.count, dtype=bool)
        self._check_fits(kv_cap, "cluster.colocated.kv_capacity_tokens")
        self._net = cl.net_latency_s

    def _check_fits(self, kv_cap: int, key: str) -> None:
        longest = int(self.req.prompt.max()) + 1 if self.req.n else 0
        if longest > kv_cap:
            raise ConfigError(f"{key}: a prompt of {longest - 1} tokens does not fit the KV capacity of "
                              f"{kv_cap} tokens per DP unit; raise the capacity or cap workload.prompt.max")

    def _resolve_policies(self, given: dict) -> dict:
        defaults = {"prefill": RoundRobinDispatch, "decode": LeastLoadedAdmission, "batching": MixedBatching}
        out = {}
        for k in given:
            if k not in POLICY_KINDS:
                raise ConfigError(f"policies.{k}: unknown decision point; allowed: {', '.join(POLICY_KINDS)}")
        for k, base in POLICY_KINDS.items():
            pol = given.get(k)
            if pol is None:
                pol = defaults[k]()
            if not isinstance(pol, base):
                raise ConfigError(f"policies.{k}: {type(pol).__name__} is not a {base.__name__}")
            out[k] = pol
        return out

    # ------------------------------------------------------------------ policy action API
    def healthy_prefill(self) -> list[int]:
        """Instances that accept prompts (prefill, or colocated) and that health checks call healthy."""
        if self._healthy is None:
            self._healthy = np.flatnonzero(self.prefill_healthy).tolist()
        return self._healthy

    def _set_healthy(self, inst: int, value: bool) -> None:
        self.prefill_healthy[inst] = value
        self._healthy = None

    def dispatch(self, rid: int, inst: int, dp: int | None = None) -> None:
        """Send buffered request `rid` to instance `inst` (DP unit `dp`, or the engine's choice)."""
        if rid not in self.buffer:
            raise ValueError(f"dispatch: request {rid} is not in the scheduler buffer")
        req = self.req
        del self.buffer[rid]
        now = self.now
        if math.isnan(req.dispatch[rid]):
            req.dispatch[rid] = now
        req.sched_wait[rid] += now - req.buf_t[rid]
        req.prefill_inst[rid] = inst
        req.state[rid] = R.DISPATCHED
        if self.disaggregated:
            P = self.prefill[inst]
            if dp is None:
                dp = P.pick_unit()
            work = req.work[rid]
            if P.caches is not None and req.prefix_key[rid] >= 0 and req.done[rid] == 0:
                cache = P.caches[dp]
                key = int(req.prefix_key[rid])
                if key in cache:
                    hit = min(int(req.prefix_len[rid]), int(work) - 1)
                    req.cached[rid] = hit
                    req.work[rid] = work = work - hit
                cache.touch(key)
            P.inflight_tokens[dp] += work
            P.depth += 1
        elif dp is None:
            units = self.colocated[inst].units
            dp = min(range(len(units)), key=lambda u: units[u].n_running + len(units[u].waiting))
        req.prefill_dp[rid] = dp
        self._push(now + self._net, DEV_ARRIVE, rid, inst)

    def prefix_hit(self, rid: int, inst: int, dp: int) -> int:
        """Prompt tokens of `rid` that the prefix cache of (inst, dp) would serve now."""
        P = self.prefill[inst]
        key = int(self.req.prefix_key[rid])
        if P.caches is None or key < 0 or key not in P.caches[dp]:
            return 0
        return min(int(self.req.prefix_len[rid]), int(self.req.work[rid]) - 1)

    def reject(self, rid: int, reason: str) -> None:
        """Reject a request the policy holds (buffer or pool), recording why."""
        if rid in self.buffer:
            del self.buffer[rid]
        elif rid in self.pool:
            del self.pool[rid]
        else:
            raise ValueError(f"reject: request {rid} is neither buffered nor pooled")
        self._reject(rid, R.reason_code(reason))

    def set_timer(self, t: float, owner: str, tag: object = None) -> None:
        """Call `on_timer(sim, tag)` of the `owner` policy ('prefill', 'decode', 'batching') at time t."""
        if owner not in POLICY_KINDS:
            raise ValueError(f"set_timer: owner {owner!r} unknown; allowed: {', '.join(POLICY_KINDS)}")
        self._push(max(t, self.now), TIMER, owner, tag)

    def admit(self, rid: int, inst: int, worker: int) -> bool:
        """Admit pool request `rid` to `worker` of decode instance `inst` at a step boundary.

        Returns False (and changes nothing) when the worker has no free slot or not enough KV.
        """
        d = self.decode[inst]
        if rid not in self.pool:
            raise ValueError(f"admit: request {rid} is not in the decode pool")
        if d.busy:
            raise RuntimeError("admit: decode instances admit only at step boundaries (inside route())")
        req = self.req
        load = int(req.prompt[rid] + req.done[rid])
        if d.batch[worker] >= d.batch_limit or d.kv[worker] + load > d.kv_cap[worker]:
            return False
        del self.pool[rid]
        d.batch[worker] += 1
        d.kv[worker] += load
        d.active[worker].add(rid)
        req.state[rid] = R.DECODE
        req.decode_inst[rid] = inst
        req.worker[rid] = worker
        req.decode_admit[rid] = self.now
        req.admit_step[rid] = d.steps
        req.done_at_admit[rid] = req.done[rid]
        fs = d.steps + int(req.output[rid] - req.done[rid])
        req.finish_step[rid] = fs
        d.buckets.setdefault(fs, []).append(rid)
        return True

    def fill_prefill(self, inst: int, unit: int, budget: int, admit_new: bool = True,
                     per_request: int | None = None) -> list[tuple[int, int]]:
        """Prompt pieces for a colocated unit: running prefills first, then waiting requests (FIFO)
        while slots and KV allow, up to `budget` tokens (`per_request` caps one request's piece).
        Pure: it proposes a batch and changes nothing."""
        u = self.colocated[inst].units[unit]
        req = self.req
        pieces: list[tuple[int, int]] = []
        cap = per_request or budget
        for rid in u.prefilling:
            if budget <= 0:
                return pieces
            take = min(int(req.work[rid]), budget, cap)
            pieces.append((rid, take))
            budget -= take
        if not admit_new:
            return pieces
        slots = u.free_slots
        kv_free = u.kv_cap - u.kv_used - u.n_decoding  # this iteration's decode tokens come first
        for rid in u.waiting:
            if budget <= 0 or slots <= 0:
                break
            need = int(req.prompt[rid] + req.done[rid]) + 1
            if need > kv_free:
                break  # FIFO: no overtaking
            take = min(int(req.work[rid]), budget, cap)
            pieces.append((rid, take))
            budget -= take
            slots -= 1
            kv_free -= need
        return pieces

    def pause(self) -> None:
        """Stop the run after the current callback; `run()` resumes it (the Gymnasium envs use this)."""
        self.paused = True

    # ------------------------------------------------------------------ event loop
    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _schedule_start(self, kind: int, inst: int) -> None:
        """Queue a start event of `inst` now, unless one is already queued (starts are idempotent)."""
        key = (kind, inst)
        if key not in self._start_pending:
            self._start_pending.add(key)
            self._push(self.now, kind, inst)

    def _start(self) -> None:
        self._started = True
        for pol in self.policies.values():
            pol.reset(self)
        f = self.cfg.faults
        for d in f.down:
            self._push(float(d["at"]), FAULT, "down", int(d["instance"]))
            if d.get("until") is not None:
                self._push(float(d["until"]), FAULT, "up", int(d["instance"]))
        for s in f.scale:
            self._push(float(s["at"]), FAULT, "scale", int(s["count"]))
        if self._arrivals is None:
            self._release_closed_loop(0.0)

    def run(self, until: float = math.inf) -> bool:
        """Advance the simulation until it ends (True), `until` is reached or a policy pauses (False)."""
        t0 = time.perf_counter()
        if not self._started:
            self._start()
        self.paused = False
        heap = self._heap
        arr = self._arrivals
        n_open = len(arr) if arr is not None else 0
        horizon = self.cfg.max_sim_time_s
        stop = min(until, horizon)
        pop = heapq.heappop
        handlers = self._handlers
        n_events = 0
        try:
            while not self.paused:
                ht = heap[0][0] if heap else math.inf
                i = self._next_arrival
                at = arr[i] if i < n_open else math.inf
                if at < ht:
                    if at > stop:
                        break
                    self.now = at
                    self._next_arrival = i + 1
                    n_events += 1
                    self._arrive(i)
                    continue
                if ht == math.inf:
                    self._finish_run()
                    return True
                if ht > stop:
                    break
                t, _, kind, a, b = pop(heap)
                self.now = t
                n_events += 1
                handlers[kind](a, b)
            if not self.paused and stop == horizon and horizon < until:
                self.now = horizon
                self._finish_run(reason="horizon")
                return True
            return False
        finally:
            self.n_events += n_events
            self._wall += time.perf_counter() - t0

    def _finish_run(self, reason: str = "stalled") -> None:
        """End of events: anything unresolved is rejected with `reason` (never silently dropped)."""
        left = np.flatnonzero(self.req.state < R.FINISHED).tolist()
        if left:
            if reason == "stalled":
                self.stalled = True
            code = R.reason_code(reason)
            arr = self._arrivals
            for rid in left:
                self.buffer.pop(rid, None)
                self.pool.pop(rid, None)
                if math.isnan(self.req.arrival[rid]):  # never arrived before the horizon
                    self.req.arrival[rid] = arr[rid] if arr is not None else self.now
                self._reject(rid, code, release=False)
        self.finished_run = True

    # ------------------------------------------------------------------ arrivals and resolution
    def _arrive(self, rid: int, _: Any = None) -> None:
        req = self.req
        req.arrival[rid] = self.now
        self._buffer(rid)

    def _buffer(self, rid: int) -> None:
        """Put a request (new, bounced or preempted) in the scheduler buffer and tell the scheduler."""
        self.req.state[rid] = R.BUFFERED
        self.req.buf_t[rid] = self.now
        self.buffer[rid] = None
        self.scheduler.on_arrival(self, rid)

    def _release_closed_loop(self, t: float) -> None:
        conc = self._concurrency
        n = self.req.n
        while self._next_arrival < n and self._inflight < conc[self._next_arrival]:
            self._push(t, ARRIVE, self._next_arrival)
            self._next_arrival += 1
            self._inflight += 1

    def _resolved(self) -> None:
        self.n_resolved += 1
        if self._arrivals is None:
            self._inflight -= 1
            self._release_closed_loop(self.now + self._think)

    def _finish(self, rid: int) -> None:
        req = self.req
        req.state[rid] = R.FINISHED
        req.finish[rid] = self.now
        self.completed.append(rid)
        self._resolved()

    def _reject(self, rid: int, code: int, release: bool = True) -> None:
        req = self.req
        req.state[rid] = R.REJECTED
        req.reason[rid] = code
        req.finish[rid] = self.now
        if release:
            self._resolved()
        else:
            self.n_resolved += 1

    def _token(self, rid: int) -> None:
        """A prefill pass produced the next output token of `rid` (first token, or after a recompute)."""
        req = self.req
        now = self.now
        if math.isnan(req.first_token[rid]):
            req.first_token[rid] = now
        else:
            gap = now - req.last_tok[rid]
            req.itl_max[rid] = max(req.itl_max[rid], gap)
        req.last_tok[rid] = now
        req.done[rid] += 1
        self.tokens_out += 1

    def _segment_itl(self, rid: int, steps, s0: int, s1: int) -> None:
        """Account the tokens of steps s0+1..s1 of `rid` (a decode instance or colocated unit) in its
        longest inter-token gap; `steps.gap` holds each step's gap since the previous step's end."""
        if s1 <= s0:
            return
        req = self.req
        g = steps.step_t.data[s0] - req.last_tok[rid]
        if s1 - s0 > 1:
            g = max(g, float(steps.gap.data[s0 + 1:s1].max()))
        req.itl_max[rid] = max(req.itl_max[rid], g)
        req.last_tok[rid] = steps.step_t.data[s1 - 1]

    # ------------------------------------------------------------------ prefill instances
    def _device_arrive(self, rid: int, inst: int) -> None:
        req = self.req
        if not self.disaggregated:
            self._colocated_arrive(rid, inst)
            return
        P = self.prefill[inst]
        dp = int(req.prefill_dp[rid])
        work = int(req.work[rid])
        P.inflight_tokens[dp] -= work
        if not P.up:  # connection refused: back to the scheduler, which now knows the instance is down
            P.depth -= 1
            if self.prefill_healthy[inst]:  # a refusal is a health report: hold, don't bounce again
                self._set_healthy(inst, False)
                self.scheduler.on_topology_change(self)
            self._bounce(rid)
            return
        req.state[rid] = R.PREFILL
        req.dev_arrive[rid] = self.now
        P.queues[dp].append(rid)
        P.queued_tokens[dp] += work
        if not P.busy:
            # Start after every arrival of this instant is queued: a batch sent at once runs as one pass.
            self._schedule_start(PF_START, inst)

    def _prefill_kick(self, inst: int, _: Any = None) -> None:
        self._start_pending.discard((PF_START, inst))
        P = self.prefill[inst]
        if P.up and not P.busy and P.queued_tokens.any():
            self._prefill_start(P)

    def _bounce(self, rid: int) -> None:
        req = self.req
        req.work[rid] = req.prompt[rid] + req.done[rid]
        req.cached[rid] = 0
        self._buffer(rid)

    def _prefill_start(self, P: PrefillInstance) -> None:
        """Start a pass: each DP unit takes up to chunk_tokens from its queue head (gated, FIFO)."""
        req = self.req
        dp = P.dp
        chunk = P.chunk_tokens
        tokens = np.zeros(dp)
        attn = np.zeros(dp)
        completing = []
        now = self.now
        work, prompt, done = req.work, req.prompt, req.done
        for d in range(dp):
            q = P.queues[d]
            if not q:
                continue
            cap = chunk
            tok = 0
            at = 0.0
            n_done = 0
            for rid in q:
                rem = int(work[rid])
                take = min(rem, cap)
                prior = int(prompt[rid] + done[rid]) - rem
                at += take * (prior + take * 0.5)
                tok += take
                cap -= take
                work[rid] = rem - take
                if math.isnan(req.prefill_start[rid]):
                    req.prefill_start[rid] = now
                    req.device_wait[rid] += now - req.dev_arrive[rid]
                if take == rem:
                    n_done += 1
                if cap == 0:
                    break
            for _ in range(n_done):
                completing.append(q.popleft())
            tokens[d] = tok
            attn[d] = at
        P.queued_tokens -= tokens.astype(np.int64)
        P.running_tokens[:] = tokens
        z = np.zeros(dp)
        dur = P.cost.pass_time(tokens, attn, z, z)
        P.busy = True
        P.pass_start = now
        P.pass_end = now + dur
        P.completing = completing
        tot = float(tokens.sum())
        self.steps.append((now, dur, PASS_PREFILL, P.idx, tot, len(completing), 0, 0,
                           P.cost.last_idle_frac, tot / (dp * chunk)))
        for f in self.pass_observers:
            f(PASS_PREFILL, P.idx, now, dur, P.cost.last_unit_time, tokens, z)
        self._push(now + dur, PF_END, P.idx, P.epoch)

    def _prefill_end(self, inst: int, epoch: int) -> None:
        P = self.prefill[inst]
        if epoch != P.epoch:
            return  # the pass died with its instance
        P.busy = False
        P.running_tokens[:] = 0
        P.n_passes += 1
        fwd = self.now - P.pass_start
        P.last_fwd = fwd
        for rid in P.completing:
            P.depth -= 1
            self._prefill_done(rid)
        P.completing = []
        P.reported[:] = P.queued_tokens  # the EndForward payload: work left on each unit
        if P.queued_tokens.any():
            if P.batch_form_s > 0 and (P.queued_tokens < P.chunk_tokens).any():
                # batch-forming step: a release sent on this EndForward reaches the idle units in time
                self._start_pending.add((PF_START, inst))
                self._push(self.now + P.batch_form_s, PF_START, inst)
            else:
                self._prefill_start(P)
        drop = self.cfg.faults.drop_end_forward
        if drop > 0 and self._fault_rng.random() < drop:
            self.dropped_signals += 1
            return
        self.scheduler.on_end_forward(self, inst, fwd)

    def _prefill_done(self, rid: int) -> None:
        req = self.req
        self._token(rid)
        if req.done[rid] >= req.output[rid]:
            self._finish(rid)
            return
        req.state[rid] = R.TRANSFER
        self._push(self.now + self._transfer(int(req.prompt[rid] + req.done[rid])), KV_READY, rid)

    # ------------------------------------------------------------------ decode instances
    def _kv_ready(self, rid: int, _: Any = None) -> None:
        self.req.state[rid] = R.POOL
        self.pool[rid] = None
        for d in self.decode:
            if not d.busy:
                self._schedule_start(DEC_START, d.idx)

    def _decode_start(self, inst: int, _: Any = None) -> None:
        self._start_pending.discard((DEC_START, inst))
        d = self.decode[inst]
        if d.busy:
            return
        if self.pool and (d.batch < d.batch_limit).any():
            self.router.route(self, inst)
            if self.paused:  # an agent decides the admissions; replay this start afterwards
                self._schedule_start(DEC_START, inst)
                return
        over = d.kv + d.batch > d.kv_cap
        if over.any():
            for w in np.flatnonzero(over).tolist():
                self._relieve_worker(d, w)
        nb = int(d.batch.sum())
        if nb == 0:
            if over.any() and self.pool:
                # every running request was just rejected: admit from the pool again, or it would wait forever
                self._schedule_start(DEC_START, inst)
            return
        dur = d.cost.pass_time(d.zeros, d.zeros, d.batch, d.kv)
        now = self.now
        d.busy = True
        d.step_start = now
        d.step_end = now + dur
        kv = d.kv
        self.steps.append((now, dur, PASS_DECODE, inst, nb, nb, int(kv.max()), int(kv.min()),
                           d.cost.last_idle_frac, nb / (d.dp * d.batch_limit)))
        for f in self.pass_observers:
            f(PASS_DECODE, inst, now, dur, d.cost.last_unit_time, d.zeros, d.batch)
        self._push(now + dur, DEC_END, inst)

    def _relieve_worker(self, d: DecodeInstance, w: int) -> None:
        """KV of worker w would overflow this step: preempt its youngest requests (or reject)."""
        req = self.req
        while d.kv[w] + d.batch[w] > d.kv_cap[w]:
            rid = max(d.active[w], key=lambda r: (req.admit_step[r], r))
            s0 = int(req.admit_step[rid])
            self._segment_itl(rid, d, s0, d.steps)
            req.done[rid] = req.done_at_admit[rid] + (d.steps - s0)
            d.active[w].discard(rid)
            d.batch[w] -= 1
            d.kv[w] -= req.prompt[rid] + req.done[rid]
            req.finish_step[rid] = -1  # invalidates its finish bucket entry
            req.preemptions[rid] += 1
            alone = d.batch[w] == 0
            if alone or self.cfg.cluster.kv_policy == "reject":
                self._reject(rid, R.reason_code("kv_exhausted"))
            else:
                req.work[rid] = req.prompt[rid] + req.done[rid]
                req.cached[rid] = 0
                self._buffer(rid)

    def _decode_end(self, inst: int, _: Any = None) -> None:
        d = self.decode[inst]
        d.busy = False
        d.steps += 1
        s = d.steps
        d.gap.append(self.now - d.step_t.data[s - 2] if s > 1 else 0.0)
        d.step_t.append(self.now)
        nb = int(d.batch.sum())
        self.tokens_out += nb
        d.kv += d.batch
        bucket = d.buckets.pop(s, None)
        if bucket:
            req = self.req
            for rid in bucket:
                if req.finish_step[rid] != s or req.decode_inst[rid] != inst or req.state[rid] != R.DECODE:
                    continue
                w = int(req.worker[rid])
                self._segment_itl(rid, d, int(req.admit_step[rid]), s)
                req.done[rid] = req.output[rid]
                d.batch[w] -= 1
                d.kv[w] -= req.prompt[rid] + req.output[rid]
                d.active[w].discard(rid)
                self._finish(rid)
        if nb or self.pool:
            self._decode_start(inst)

    # ------------------------------------------------------------------ colocated instances
    def _colocated_arrive(self, rid: int, inst: int) -> None:
        req = self.req
        u = self.colocated[inst].units[int(req.prefill_dp[rid])]
        req.state[rid] = R.WAITING
        req.dev_arrive[rid] = self.now
        u.waiting.append(rid)
        self._wake_colocated(inst)

    def _wake_colocated(self, inst: int) -> None:
        if not self.colocated[inst].busy:
            self._schedule_start(CO_START, inst)

    def _colocated_start(self, inst: int, _: Any = None) -> None:
        self._start_pending.discard((CO_START, inst))
        C = self.colocated[inst]
        if C.busy:
            return
        batches = []
        for ui in range(C.dp):
            b = self.batcher.next_batch(self, inst, ui)
            if self.paused:  # an agent picks the batch; replay this start afterwards
                self._schedule_start(CO_START, inst)
                return
            batches.append(b if b is not None else Batch())
        if all(b.empty() for b in batches):
            return
        dp = C.dp
        ptok = np.zeros(dp)
        attn = np.zeros(dp)
        dreq = np.zeros(dp)
        dkv = np.zeros(dp)
        plan = []
        req = self.req
        now = self.now
        budget = 0
        relieved = False
        for ui, (u, b) in enumerate(zip(C.units, batches)):
            budget += u.chunk_tokens
            if b.decode and u.n_decoding and u.kv_used + u.n_decoding > u.kv_cap:
                self._relieve_unit(u)
                relieved = True
            pieces = []
            tok = 0
            at = 0.0
            for rid, take in b.prefill:
                st = req.state[rid]
                if st == R.WAITING:
                    need = int(req.prompt[rid] + req.done[rid]) + 1
                    if u.free_slots <= 0 or u.kv_used + need + (u.n_decoding if b.decode else 0) > u.kv_cap:
                        raise RuntimeError(f"batching policy {self.batcher.name}: request {rid} does not fit "
                                           f"(slots {u.free_slots}, KV {u.kv_cap - u.kv_used} free, need {need})")
                    u.waiting.remove(rid)
                    u.prefilling.append(rid)
                    u.kv_used += need  # its context plus the token its prefill will produce
                    req.state[rid] = R.PREFILL
                    if math.isnan(req.prefill_start[rid]):
                        req.prefill_start[rid] = now
                    req.device_wait[rid] += now - req.dev_arrive[rid]
                elif st != R.PREFILL:
                    raise RuntimeError(f"batching policy {self.batcher.name}: request {rid} is not waiting "
                                       f"or prefilling")
                rem = int(req.work[rid])
                take = min(int(take), rem)
                if take <= 0:
                    continue
                prior = int(req.prompt[rid] + req.done[rid]) - rem
                at += take * (prior + take * 0.5)
                tok += take
                req.work[rid] = rem - take
                pieces.append(rid)
            ptok[ui] = tok
            attn[ui] = at
            dec = bool(b.decode and u.n_decoding)
            if dec:
                dreq[ui] = u.n_decoding
                dkv[ui] = u.decode_kv
            plan.append((pieces, dec))
        if not ptok.any() and not dreq.any():
            if relieved:  # preemption emptied the batch: ask the policy again with the new state
                self._wake_colocated(inst)
            return
        dur = C.cost.pass_time(ptok, attn, dreq, dkv)
        C.busy = True
        C.iter_start = now
        C.iter_end = now + dur
        C.plan = plan
        kvs = [u.kv_used for u in C.units]
        tot = float(ptok.sum())
        nreq = float(dreq.sum())
        self.steps.append((now, dur, PASS_COLOCATED, inst, tot + nreq, nreq, max(kvs), min(kvs),
                           C.cost.last_idle_frac, tot / budget))
        for f in self.pass_observers:
            f(PASS_COLOCATED, inst, now, dur, C.cost.last_unit_time, ptok, dreq)
        self._push(now + dur, CO_END, inst)

    def _relieve_unit(self, u) -> None:
        """A decode iteration would overflow the unit's KV: preempt the youngest decodes (recompute)."""
        req = self.req
        while u.n_decoding and u.kv_used + u.n_decoding > u.kv_cap:
            rid = max(u.decoding, key=lambda r: (req.admit_step[r], r))
            s0 = int(req.admit_step[rid])
            self._segment_itl(rid, u, s0, u.steps)
            req.done[rid] = req.done_at_admit[rid] + (u.steps - s0)
            load = int(req.prompt[rid] + req.done[rid])
            u.decoding.discard(rid)
            u.n_decoding -= 1
            u.kv_used -= load
            u.decode_kv -= load
            req.finish_step[rid] = -1
            req.preemptions[rid] += 1
            if u.n_running == 0 or self.cfg.cluster.kv_policy == "reject":
                self._reject(rid, R.reason_code("kv_exhausted"))
            else:
                req.work[rid] = req.prompt[rid] + req.done[rid]
                req.cached[rid] = 0
                req.state[rid] = R.WAITING
                req.dev_arrive[rid] = self.now
                u.waiting.appendleft(rid)

    def _colocated_end(self, inst: int, _: Any = None) -> None:
        C = self.colocated[inst]
        C.busy = False
        C.n_iters += 1
        req = self.req
        busy_after = False
        for u, (pieces, dec) in zip(C.units, C.plan):
            if dec:
                n = u.n_decoding
                u.steps += 1
                s = u.steps
                u.gap.append(self.now - u.step_t.data[s - 2] if s > 1 else 0.0)
                u.step_t.append(self.now)
                u.kv_used += n
                u.decode_kv += n
                self.tokens_out += n
                bucket = u.buckets.pop(s, None)
                if bucket:
                    for rid in bucket:
                        if req.finish_step[rid] != s or req.state[rid] != R.DECODE or rid not in u.decoding:
                            continue
                        self._segment_itl(rid, u, int(req.admit_step[rid]), s)
                        req.done[rid] = req.output[rid]
                        load = int(req.prompt[rid] + req.output[rid])
                        u.decoding.discard(rid)
                        u.n_decoding -= 1
                        u.kv_used -= load
                        u.decode_kv -= load
                        self._finish(rid)
            for rid in pieces:
                if req.work[rid] > 0:
                    continue
                u.prefilling.remove(rid)
                self._token(rid)
                if req.done[rid] >= req.output[rid]:
                    u.kv_used -= int(req.prompt[rid] + req.done[rid])
                    self._finish(rid)
                    continue
                load = int(req.prompt[rid] + req.done[rid])
                req.state[rid] = R.DECODE
                req.decode_admit[rid] = self.now
                req.admit_step[rid] = u.steps
                req.done_at_admit[rid] = req.done[rid]
                fs = u.steps + int(req.output[rid] - req.done[rid])
                req.finish_step[rid] = fs
                u.buckets.setdefault(fs, []).append(rid)
                u.decoding.add(rid)
                u.n_decoding += 1
                u.decode_kv += load
            busy_after = busy_after or u.n_running > 0 or bool(u.waiting)
        C.plan = []
        if busy_after:
            self._wake_colocated(inst)

    # ------------------------------------------------------------------ timers and faults
    def _timer(self, owner: str, tag: object) -> None:
        self.policies[owner].on_timer(self, tag)
        if owner == "batching":
            for C in self.colocated:
                self._wake_colocated(C.idx)
        elif owner == "decode":
            for d in self.decode:
                if not d.busy and self.pool:
                    self._schedule_start(DEC_START, d.idx)

    def _fault(self, what: str, arg: int) -> None:
        if not self.disaggregated:
            raise ConfigError("faults: down/scale events need cluster.topology=disaggregated")
        if what == "down":
            self._take_down(arg, notify_after=self.cfg.faults.detect_s)
        elif what == "up":
            self._bring_up(arg)
        elif what == "detect":
            P = self.prefill[arg]
            if not P.up:
                self._set_healthy(arg, False)
                lost, P.lost = P.lost, []
                for rid in lost:
                    self._bounce(rid)
                self.scheduler.on_topology_change(self)
        elif what == "scale":
            for i, P in enumerate(self.prefill):
                if i < arg and not P.up:
                    self._bring_up(i, notify=False)
                elif i >= arg and P.up:
                    self._take_down(i, notify_after=None)
            self.scheduler.on_topology_change(self)

    def _take_down(self, inst: int, notify_after: float | None) -> None:
        """Instance fails (or is scaled away): its pass and queues are lost; requests come back later."""
        P = self.prefill[inst]
        if not P.up:
            return
        P.up = False
        P.busy = False
        P.epoch += 1
        stranded = list(P.completing)
        for q in P.queues:
            stranded.extend(q)
            q.clear()
        P.completing = []
        P.depth -= len(stranded)
        P.queued_tokens[:] = 0
        P.running_tokens[:] = 0
        if notify_after is None:  # planned scale-down: drained back to the scheduler at once
            self._set_healthy(inst, False)
            for rid in stranded:
                self._bounce(rid)
        else:
            P.lost.extend(stranded)
            self._push(self.now + notify_after, FAULT, "detect", inst)

    def _bring_up(self, inst: int, notify: bool = True) -> None:
        P = self.prefill[inst]
        lost, P.lost = P.lost, []
        for rid in lost:  # came back before anyone noticed: its requests are resubmitted
            self._bounce(rid)
        P.up = True
        self._set_healthy(inst, True)
        if notify:
            self.scheduler.on_topology_change(self)

    # ------------------------------------------------------------------ results
    @property
    def wall_time_s(self) -> float:
        return self._wall
