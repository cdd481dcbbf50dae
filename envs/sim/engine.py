"""The discrete-event engine: construction, the event loop, the policy action API, observers and faults.

One `Simulator` is one run. Time is continuous (seconds); a heap orders events and a
sequence number breaks ties, so a seed gives one exact history. Open-loop arrivals
are read from a sorted array instead of the heap (they are the most numerous events).
Each event kind has one handler (a table indexed by `EventKind`); the instance modules
(prefill.py, decode.py, colocated.py) own their state and transitions, and heap events
of an instance carry the instance object itself. Every request ends finished or rejected
with a reason; a run that would otherwise end with requests still in the system marks
them rejected("stalled") and sets `stalled`.
"""

from __future__ import annotations

import heapq
import math
import numbers
import time
from typing import Any

import numpy as np

from . import requests as R
from .classes import class_table
from .colocated import ColocatedInstance
from .config import ConfigError, SimConfig, check, check_seed, sim_config
from .cost import build_cost_model, kv_capacity_tokens, kv_transfer_fn
from .decode import DecodeInstance
from .events import PAUSED, SPREAD, DeviceArrive, EventKind, PassKind, Timer
from .faults import FaultInjector
from .hardware import load_hardware
from .models import load_model
from .observers import Observer, PassStart
from .ordering import make_order, new_queue
from .points import POINTS, resolve_policies
from .policy_errors import ActionError, named
from .prefill import PrefillInstance
from .prefix_cache import BlockSetup, cache_capacity, next_uses
from .requests import RequestTable
from .steplog import StepLog, SummaryLog
from .tamper_check import TamperCheck
from .view import OrderView, RunView
from .workload import make_workload

DEVICE_ARRIVE, KV_READY, TIMER, ARRIVE = (int(k) for k in (
    EventKind.DEVICE_ARRIVE, EventKind.KV_READY, EventKind.TIMER, EventKind.ARRIVE))
INSTANCE_TYPES = (PrefillInstance, DecodeInstance, ColocatedInstance)  # each declares HANDLERS: its events' methods


def _spread(fn):
    return lambda p: fn(*p)


def _index_in(i, n: int) -> bool:
    """`i` is an integer (a Python or NumPy one, not a bool) in 0..n-1: an index an action may name."""
    return (type(i) is int or isinstance(i, numbers.Integral) and not isinstance(i, bool)) and 0 <= i < n


class Simulator:
    """A P/D disaggregated or colocated cluster under one traffic sample. The attributes are the state view policies
    read: `now`, `req` (RequestTable), `buffer` (requests held by the prefill scheduler) and `pool` (prefill-done,
    awaiting decode admission), both in `queue_order` (ordering.py; None: arrival order), `prefill` / `decode` /
    `colocated`, `prefill_healthy`, `rng` (the policies' generator)."""

    def __init__(self, config: SimConfig | dict | Any, policies: dict | None = None, seed: int = 0,
                 step_log: bool = True):
        """`step_log=False`: keep of the passes only what SimResult.summary() reads (steplog.SummaryLog), for a
        run nobody reads pass by pass (no steps table, no plot of passes)."""
        cfg = sim_config(config)
        self.cfg = cfg
        # numpy integers too (seeds drawn from arrays); 1.5, "3", None or -1 fail in one line, not inside numpy
        self.seed = check_seed(int(seed) if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) else seed)
        root = np.random.default_rng(self.seed)
        wl_rng, self.fault_rng, self.rng, labels_rng = root.spawn(4)  # the first three as spawn(3) made them
        self.hw = load_hardware(cfg.hardware)
        self.model = load_model(cfg.model)
        cl = cfg.cluster
        self.topology = cl.topology
        self.disaggregated = cl.topology == "disaggregated"

        wl = make_workload(cfg.workload, wl_rng, labels_rng)
        self.req = RequestTable(wl.prompt, wl.output, wl.prefix_key, wl.prefix_len, wl.cls, wl.predicted)
        self.classes = class_table(cfg.workload.classes, cfg.slo.ttft_s, cfg.slo.tpot_s)
        self.block_tokens = wl.block_tokens
        if wl.block_ids is not None:
            self.req.block_ids, self.req.block_off = wl.block_ids, wl.block_off
        self._arrivals = wl.arrival  # None in closed loop
        self._concurrency = wl.concurrency
        self._think = wl.think_s

        self.prefill: list[PrefillInstance] = []
        self.decode: list[DecodeInstance] = []
        self.colocated: list[ColocatedInstance] = []
        getattr(self, f"_build_{cl.topology}")()  # one builder per topology (config: cluster.topology)
        self._front: list[PrefillInstance] | list[ColocatedInstance] = self.prefill or self.colocated
        self._net = cl.net_latency_s
        self.policies = resolve_policies(policies or {})  # decision point name -> policy (points.POINTS)

        self.now = 0.0
        self.queue_order = make_order(self, cfg.queue, OrderView)  # None: arrival order (ordering.py)
        self.buffer: dict[int, None] = new_queue(self.queue_order)
        self.pool: dict[int, None] = new_queue(self.queue_order)
        self.paused = False
        self.finished_run = False
        self.stalled = False
        self.n_resolved = 0
        self.completed = R.IdLog(self.req.n)  # finished request ids in completion order (their output is known)
        self.tokens_out = 0  # output tokens produced (conservation check)
        self.dropped_signals = 0
        self.n_events = 0
        self.steps = (StepLog if step_log else SummaryLog)(float_reqs=cl.topology == "colocated")
        self.observers: list[Observer] = []
        self._heap: list[tuple] = []
        self._seq = 0
        self._next_arrival = 0  # open loop: index of the next arrival; closed loop: next release
        self._inflight = 0  # closed loop: released, unresolved requests
        self._wall = 0.0
        self._started = False
        self._healthy: tuple[int, ...] | None = None
        self.faults = FaultInjector(self)
        self.tamper = TamperCheck(self) if cfg.check_policies else None  # tamper_check.py (before the views: their
        # actions are the engine's methods as they are now)
        parts = RunView.parts(self)
        self.views = {name: RunView.of(self, parts) for name in POINTS}  # each policy's own view (view.py)
        self.view = RunView.of(self, parts)  # the observers' (and a caller's who reads the run as a policy would)
        # Instance events carry the instance, so their handlers are the classes' own (unbound) methods, which each
        # class declares in HANDLERS; the engine's own events and the fault injector's are bound here.
        handlers = {kind: getattr(cls, meth) for cls in INSTANCE_TYPES for kind, meth in cls.HANDLERS.items()}
        handlers.update({EventKind.DEVICE_ARRIVE: self._device_arrive, EventKind.KV_READY: self._kv_ready,
                         EventKind.TIMER: self._timer, EventKind.ARRIVE: self._arrive, EventKind.FAULT: self.faults.handle})
        for kind in SPREAD:  # a NamedTuple payload's fields are the handler's arguments
            handlers[kind] = _spread(handlers[kind])
        self._handlers = [handlers[k] for k in EventKind]  # indexed by the int kind of a heap entry (all kinds handled)

    # ------------------------------------------------------------------ construction
    def _build_disaggregated(self) -> None:
        cl, hw, model, cost_cfg = self.cfg.cluster, self.hw, self.model, self.cfg.cost
        p, d = cl.prefill, cl.decode
        n_prefill = max([p.count] + [int(s["count"]) for s in self.cfg.faults.scale])
        pcost = build_cost_model(cost_cfg, hw, model, p, self.cfg.engine)
        dcost = build_cost_model(cost_cfg, hw, model, d, self.cfg.engine)
        pkv = self._kv_capacity(p, "cluster.prefill")  # a prefill unit holds a prompt's KV until it is sent to decode
        blocks = self._block_setup(p, pkv)
        self.prefill = [PrefillInstance(self, i, p.dp, p.chunk_tokens, pcost, p.prefix_cache_entries, p.batch_form_s,
                                        p.dp_dispatch, blocks)
                        for i in range(n_prefill)]
        kv_cap = self._kv_capacity(d, "cluster.decode")
        self._asleep: set[int] = set()  # decode instances neither stepping nor queued to start (decode.py keeps it)
        self.decode = [DecodeInstance(self, i, d.dp, d.batch_limit, kv_cap, dcost, self._asleep) for i in range(d.count)]
        self.prefill_healthy = np.arange(n_prefill) < p.count
        for inst in self.prefill[p.count:]:
            inst.up = False
        self._transfer = kv_transfer_fn(hw, model, cl.kv_link, cl.kv_transfer_base_s)

    def _block_setup(self, p, kv_tokens: int) -> BlockSetup | None:
        """The prefill units' prefix-block caches (prefix_cache.py), when the requests carry block hashes and
        cluster.prefill.cache_tokens is not 0; the default capacity is what the KV leaves after the running
        KV (the longest prompt plus one chunk)."""
        req = self.req
        if req.block_ids is None or p.cache_tokens == 0:
            return None
        bt = self.block_tokens
        reserve = int(req.prompt.max()) + p.chunk_tokens
        cap = cache_capacity(p.cache_tokens, kv_tokens, reserve, bt, "cluster.prefill.cache_tokens")
        if p.host_cache_tokens:
            check(p.host_cache_tokens >= bt, "cluster.prefill.host_cache_tokens",
                  f"{p.host_cache_tokens} tokens is smaller than one block ({bt} tokens); 0 switches the tier off")
        req.block_next = (next_uses(req.block_ids, req.block_off) if p.cache_eviction == "belady"
                          else np.zeros(req.block_ids.shape[0], dtype=np.int64))
        per_token = self.model.kv_bytes_per_token / (p.host_cache_gbps * 1e9)
        self.cache_capacity_tokens = cap
        return BlockSetup(cap, bt, p.cache_eviction, int(p.host_cache_tokens), per_token)

    def _build_colocated(self) -> None:
        c = self.cfg.cluster.colocated
        cost = build_cost_model(self.cfg.cost, self.hw, self.model, c)
        kv_cap = self._kv_capacity(c, "cluster.colocated")
        self.colocated = [ColocatedInstance(self, i, c.dp, c.batch_limit, kv_cap, c.chunk_tokens, cost)
                          for i in range(c.count)]
        self.prefill_healthy = np.ones(c.count, dtype=bool)

    def _kv_capacity(self, inst, key: str) -> int:
        """KV tokens one DP unit of `inst` holds (explicit, or what HBM leaves after the weights: a model that
        does not fit is a ConfigError), checked against the longest prompt, which every kind holds whole."""
        kv_cap = kv_capacity_tokens(self.hw, self.model, inst, key=key)
        longest = int(self.req.prompt.max()) + 1 if self.req.n else 0
        if longest > kv_cap:
            raise ConfigError(f"{key}.kv_capacity_tokens: a prompt of {longest - 1} tokens does not fit the KV "
                              f"capacity of {kv_cap} tokens per DP unit; raise the capacity or cap workload.prompt.max")
        return kv_cap

    # ------------------------------------------------------------------ policy action API
    def healthy_prefill(self) -> tuple[int, ...]:
        """Instances that accept prompts (prefill, or colocated) and that health checks call healthy (a tuple:
        the engine keeps it until health changes, so no caller may edit it)."""
        if self._healthy is None:
            self._healthy = tuple(np.flatnonzero(self.prefill_healthy).tolist())
        return self._healthy

    def set_healthy(self, inst: int, value: bool) -> None:
        """What health checks report for instance `inst` changed."""
        self.prefill_healthy[inst] = value
        self._healthy = None

    def dispatch(self, rid: int, inst: int, dp: int | None = None) -> None:
        """Send buffered request `rid` to instance `inst` (DP unit `dp`, or the engine's choice)."""
        if rid not in self.buffer:
            raise ActionError(f"dispatch(rid={rid!r}, inst={inst!r}): request {rid!r} is not in the scheduler buffer "
                              "(a routed request must exist and be waiting)")
        front = self._front
        if not _index_in(inst, len(front)):
            raise ActionError(f"dispatch(rid={rid}, inst={inst!r}): no instance {inst!r}; allowed 0..{len(front) - 1}")
        if dp is not None and not _index_in(dp, front[inst].dp):
            raise ActionError(f"dispatch(rid={rid}, inst={inst}, dp={dp!r}): instance {inst} has DP units "
                              f"0..{front[inst].dp - 1}")
        del self.buffer[rid]
        req = self.req
        req.leave_buffer(rid, self.now, inst)
        req.prefill_dp[rid] = self._front[inst].accept(rid, dp)
        self.push(self.now + self._net, DEVICE_ARRIVE, DeviceArrive(rid, inst))

    def prefix_hit(self, rid: int, inst: int, dp: int) -> int:
        """Prompt tokens of `rid` that the prefix cache of (inst, dp) would serve now."""
        return self.prefill[inst].prefix_hit(rid, dp)

    def reject(self, rid: int, reason: str) -> None:
        """Reject a request the policy holds (buffer or pool), recording why."""
        try:
            code = R.reason_code(reason)
        except ValueError as exc:
            raise ActionError(f"reject(rid={rid!r}, reason={reason!r}): {exc}") from None
        if rid in self.buffer:
            del self.buffer[rid]
        elif rid in self.pool:
            del self.pool[rid]
        else:
            raise ActionError(f"reject(rid={rid!r}): request {rid!r} is neither buffered nor pooled (a policy rejects "
                              "only requests it holds)")
        self.reject_request(rid, code)

    def set_timer(self, t: float, owner: str, tag: object = None) -> None:
        """Call `on_timer(sim, tag)` of the `owner` policy ('prefill', 'decode', 'batching') at time t."""
        if owner not in POINTS:
            raise ActionError(f"set_timer(owner={owner!r}): unknown owner; allowed: {', '.join(POINTS)}")
        if not t <= math.inf:  # NaN (or not a number) would break the heap's order
            raise ActionError(f"set_timer(t={t!r}, owner={owner!r}): t must be a time in seconds, not NaN")
        self.push(max(t, self.now), TIMER, Timer(owner, tag))

    def admit(self, rid: int, inst: int, worker: int) -> bool:
        """Admit pool request `rid` to `worker` of decode instance `inst` at a step boundary.

        Returns False (and changes nothing) when the worker has no free slot or not enough KV.
        """
        if rid not in self.pool:
            raise ActionError(f"admit(rid={rid!r}, inst={inst!r}, worker={worker!r}): request {rid!r} is not in the "
                              "decode pool (an admitted request must exist and be waiting)")
        if not _index_in(inst, len(self.decode)):
            raise ActionError(f"admit(rid={rid}, inst={inst!r}): no decode instance {inst!r}; allowed "
                              f"0..{len(self.decode) - 1}")
        d = self.decode[inst]
        if not _index_in(worker, d.dp):
            raise ActionError(f"admit(rid={rid}, inst={inst}, worker={worker!r}): instance {inst} has workers "
                              f"0..{d.dp - 1}")
        if d.busy:
            raise ActionError(f"admit(rid={rid}, inst={inst}, worker={worker}): decode instances admit only at step "
                              "boundaries (inside route())")
        if not d.admit(rid, worker):
            return False
        del self.pool[rid]
        return True

    def fill_prefill(self, inst: int, unit: int, budget: int, admit_new: bool = True,
                     per_request: int | None = None) -> list[tuple[int, int]]:
        """Prompt pieces for a colocated unit: running prefills first, then waiting requests (FIFO)
        while slots and KV allow, up to `budget` tokens (`per_request` caps one request's piece).
        Pure: it proposes a batch and changes nothing."""
        return self.colocated[inst].units[unit].fill(self.req, budget, admit_new, per_request)

    def pause(self) -> None:
        """Stop the run after the current callback; `run()` resumes it (the Gymnasium envs use this)."""
        self.paused = True

    def call(self, point: str, method: str, *args):
        """Call the policy of decision point `point`: `method(view, *args)` (`ask` without a replay)."""
        return self.ask(point, None, method, *args)

    def ask(self, point: str, replay, method: str, *args):
        """The one place that calls a policy: `method(view, *args)` of the policy of decision point `point`, handed
        that policy's own view. Anything it raises but a ConfigError becomes one PolicyError line naming the policy
        and the call (policy_errors.py); the original stays chained (`__cause__`). With a `replay` (decode.py's step
        start, colocated.py's iteration start), a policy that paused the run (an agent takes this decision in its
        env, between two `run()` calls) did not decide: `replay()` re-queues the asking event for the resumed run
        and PAUSED is returned, so the call site only returns (the one place where a decision is deferred)."""
        pol = self.policies[point]
        tamper = self.tamper
        if tamper is not None:
            tamper.enter(point, method)
        try:
            out = getattr(pol, method)(self.views[point], *args)
        except Exception as exc:
            if isinstance(exc, ConfigError) and (getattr(exc, "named", True)):
                raise
            raise named(point, pol, method, exc) from exc
        if tamper is not None:
            tamper.leave()
        if replay is not None and self.paused:
            replay()
            return PAUSED
        return out

    def observe(self, observer: Observer) -> None:
        """Attach an observer (observers.py): it sees pass starts / ends and request resolutions."""
        self.observers.append(observer)

    # ------------------------------------------------------------------ event loop
    def push(self, t: float, kind: int, payload: Any) -> None:
        """Queue event `kind` (an EventKind value) at time t with its payload (events.py's table)."""
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def next_now(self) -> bool:
        """Whether an event queued now would be the next to run: no event is queued for now and the run is not
        paused (the heap takes equal times in queue order, before an arrival at the same time)."""
        heap = self._heap
        return not self.paused and (not heap or heap[0][0] > self.now)

    def _start(self) -> None:
        self._started = True
        for point in self.policies:
            self.call(point, "reset")
        self.faults.schedule()
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
                    self.finish_run()
                    return True
                if ht > stop:
                    break
                t, _, kind, payload = pop(heap)
                self.now = t
                n_events += 1
                handlers[kind](payload)
            if not self.paused and stop == horizon and horizon < until:
                self.now = horizon
                self.finish_run(reason="horizon")
                return True
            return False
        finally:
            self.n_events += n_events
            self._wall += time.perf_counter() - t0

    def finish_run(self, reason: str = "stalled") -> None:
        """End the run now (end of events; a caller stopping a run early: agents/evaluation/runner.py): anything
        unresolved is rejected with `reason` (never silently dropped)."""
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
                self.reject_request(rid, code, release=False)
        self.finished_run = True

    def record_pass(self, kind: int, inst, dur: float, tokens: float, reqs: float, kv_max: int, kv_min: int,
                    util: float, unit_tokens: np.ndarray, unit_reqs: np.ndarray, unit_kv: np.ndarray) -> None:
        """A pass of `inst` starts now: one step-table row (steplog.COLUMNS), then the observers."""
        cost = inst.cost
        self.steps.append((self.now, dur, kind, inst.idx, tokens, reqs, kv_max, kv_min, cost.last_idle_frac, util))
        if self.observers:
            p = PassStart(PassKind(kind), inst.idx, self.now, dur, cost.last_unit, unit_tokens, unit_reqs, unit_kv)
            for obs in self.observers:
                obs.on_pass_start(self.view, p)

    def pass_ended(self, kind: int, inst: int) -> None:
        if self.observers:
            for obs in self.observers:
                obs.on_pass_end(self.view, PassKind(kind), inst)

    # ------------------------------------------------------------------ requests: arrival and resolution
    def _arrive(self, rid: int) -> None:
        self.req.arrival[rid] = self.now
        self.buffer_request(rid)

    def buffer_request(self, rid: int) -> None:
        """Put a request (new, bounced or preempted) in the scheduler buffer and tell the scheduler."""
        self.req.enter_buffer(rid, self.now)
        self.buffer[rid] = None
        self.ask("prefill", None, "on_arrival", rid)  # ask itself: one frame less on every arrival

    def bounce(self, rid: int) -> None:
        """A request lost by a dead prefill instance goes back to the scheduler, to be recomputed."""
        self.req.requeue(rid)
        self.buffer_request(rid)

    def _release_closed_loop(self, t: float) -> None:
        conc = self._concurrency
        n = self.req.n
        while self._next_arrival < n and self._inflight < conc[self._next_arrival]:
            self.push(t, ARRIVE, self._next_arrival)
            self._next_arrival += 1
            self._inflight += 1

    def _resolved(self) -> None:
        self.n_resolved += 1
        if self._arrivals is None:
            self._inflight -= 1
            self._release_closed_loop(self.now + self._think)

    def finish_request(self, rid: int) -> None:
        self.req.complete(rid, self.now)
        self.completed.append(rid)
        self._resolved()
        if self.observers:
            for obs in self.observers:
                obs.on_finish(self.view, rid)

    def reject_request(self, rid: int, code: int, release: bool = True) -> None:
        self.req.reject(rid, code, self.now)
        if release:
            self._resolved()
        else:
            self.n_resolved += 1
        if self.observers:
            for obs in self.observers:
                obs.on_reject(self.view, rid)

    def token(self, rid: int) -> None:
        """A prefill pass produced the next output token of `rid`."""
        self.req.produce_token(rid, self.now)
        self.tokens_out += 1

    # ------------------------------------------------------------------ between instances
    def _device_arrive(self, rid: int, inst: int) -> None:
        self._front[inst].arrive(rid)

    def prefill_done(self, rid: int) -> None:
        """Its prompt is done (first token out): finished, or its KV moves to the decode tier."""
        req = self.req
        self.token(rid)
        if req.done[rid] >= req.output[rid]:
            self.finish_request(rid)
            return
        req.state[rid] = R.TRANSFER
        self.push(self.now + self._transfer(req.load(rid)), KV_READY, rid)

    def _kv_ready(self, rid: int) -> None:
        self.req.state[rid] = R.POOL
        self.pool[rid] = None
        for i in sorted(self._asleep):  # the others step or are queued to start: they will see the pool then
            self.decode[i].wake()

    def end_forward(self, inst: int, fwd: float) -> None:
        """EndForward of a prefill pass reaches the scheduler, unless the fault injector drops it."""
        if not self.faults.drop_signal():
            self.call("prefill", "on_end_forward", inst, fwd)

    # ------------------------------------------------------------------ timers
    def _timer(self, owner: str, tag: object) -> None:
        self.call(owner, "on_timer", tag)
        wake = POINTS[owner].wake  # what the decision point re-checks once its policy's timer fired
        if wake is not None:
            wake(self)

    # ------------------------------------------------------------------ results
    @property
    def wall_time_s(self) -> float:
        return self._wall
