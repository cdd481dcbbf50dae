"""PBAA: Prioritized Batch Allocation (SBS Algorithm 2, arXiv 2512.16134; ALGORITHMS.md s2).

A released batch is spread over the DP units of one prefill instance so that no unit is
handed much more than one pass's worth of work:

    C_avail(d) = C_chunk - U_flight(d) - R_queued(d)

GreedyDispatch(Q) sorts Q by prompt length, descending, and puts each request on
d* = argmax_d Cap(r, d), Cap = C_avail(d) - L(r) (basic) or C_avail(d) - (L(r) - L_hit(r, d))
(cache aware). It is assigned only if C_avail(d*) > 0, and C_avail(d*) becomes Cap(r, d*)
(it may go negative: the engine chunks the rest over later passes); otherwise it waits
for the next cycle. Requests left over from earlier cycles are allocated first (FCFS
fairness); every cycle a request is left over its wait counter grows, and past N_limit
flow control either rejects it (reason "flow_control") or throttles new arrivals (they
are held out of allocation until the starving requests are placed).

`CapacityModel` is what the scheduler knows, no more: the tokens it dispatched that no
EndForward has acknowledged yet (U_flight, its own bookkeeping), the tokens each DP unit
still had to process when its last EndForward was sent (R_queued: the signal's payload,
SBS Fig. 5; a long prompt's next chunks count), and the sliding window of forward times
SBS's interval control reads. From the payload and an offline profile of the pass time it
also predicts when an instance that is still working will be free (`busy_until`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.validation import check, is_num


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


class CapacityModel:
    """The scheduler's view of every prefill DP unit: U_flight, R_queued, acks and forward times.

    A dispatch is acknowledged by the first EndForward of its instance issued after it
    reached the device (L_net after the dispatch): by then its tokens are either done, in
    the pass that just started, or in the reported device queue. A quiescence poll is a
    request to the instance: a dead instance does not answer it.
    """

    def __init__(self, window: int = 32, t_default: float | None = None):
        check(isinstance(window, int) and window >= 1, "policy.prefill.window", f"got {window!r}; must be an integer >= 1")
        check(t_default is None or (is_num(t_default) and t_default > 0), "policy.prefill.t_default",
                    f"got {t_default!r}; must be > 0 (or null: full-chunk pass time of the cost model)")
        self.window = window
        self.t_default = t_default

    def reset(self, sim) -> None:
        if not sim.disaggregated or not sim.prefill:
            raise ConfigError("policy.prefill.name: PBAA / SBS need cluster.topology=disaggregated "
                              "(prefill instances with DP units)")
        P0 = sim.prefill[0]
        n, dp = len(sim.prefill), P0.dp
        self.n, self.dp = n, dp
        self.chunk = np.array([[P.chunk_tokens] * dp for P in sim.prefill], dtype=np.int64)
        self.u_flight = np.zeros((n, dp), dtype=np.int64)
        self.r_queued = np.zeros((n, dp), dtype=np.int64)
        self.flight: list[deque] = [deque() for _ in range(n)]  # (device arrival time, dp, tokens)
        self.acked = np.ones(n, dtype=bool)  # EndForward (or quiescence) since the last dispatch
        self.last_fwd = np.full(n, math.nan)
        self._reported, self._last_fwd = _read_only(self.r_queued), _read_only(self.last_fwd)
        self.last_end = np.full(n, -math.inf)  # time of the last EndForward
        self.last_dispatch = np.full(n, -math.inf)
        self.busy_until = np.full(n, -math.inf)  # predicted end of the work the last EndForward reported
        self.form_s = sim.cfg.cluster.prefill.batch_form_s  # the engine's batch-forming step (config)
        self.profile = P0.cost
        self.net = sim.cfg.cluster.net_latency_s
        full = np.full(dp, float(P0.chunk_tokens))
        z = np.zeros(dp)
        self.t_full = P0.cost.pass_time(full, full * full / 2, z, z)  # offline profile: a full-chunk pass
        self._t0 = self.t_default if self.t_default is not None else self.t_full
        self._win: deque = deque(maxlen=self.window)
        self._sum = 0.0

    @property
    def t_fwd(self) -> float:
        """Mean of the forward-time window, or the offline estimate while it is empty."""
        return self._sum / len(self._win) if self._win else self._t0

    @property
    def chunk_tokens(self) -> int:
        return int(self.chunk[0, 0])

    def c_avail(self, inst: int) -> np.ndarray:
        return self.chunk[inst] - self.u_flight[inst] - self.r_queued[inst]

    def avail(self) -> np.ndarray:
        """C_avail of every DP unit, (instances, units)."""
        return self.chunk - self.u_flight - self.r_queued

    def busy(self) -> np.ndarray:
        """Per instance: a dispatch of ours has no EndForward (or quiescence) yet."""
        return ~self.acked

    def reported(self) -> np.ndarray:
        """R_queued, (instances, units): the last EndForward's payload (a read-only view: it follows the model,
        and a reader that writes to it fails instead of changing SBS's state; no copy on the env's hot path)."""
        return self._reported

    def last_forward(self) -> np.ndarray:
        """The last reported pass time per instance (NaN before the first; a read-only view, as `reported`)."""
        return self._last_fwd

    def dispatched(self, inst: int, dp: int, tokens: int, now: float) -> None:
        self.u_flight[inst, dp] += tokens
        self.flight[inst].append((now + self.net, dp, tokens))
        self.acked[inst] = False
        self.last_dispatch[inst] = now

    def end_forward(self, sim, inst: int, fwd: float) -> None:
        """EndForward: the pass time joins the window; the report sets R_queued and acknowledges dispatches."""
        win = self._win
        if len(win) == win.maxlen:
            self._sum -= win[0]
        win.append(fwd)
        self._sum += fwd
        now = sim.now
        self.last_fwd[inst] = fwd
        self.last_end[inst] = now
        left = sim.prefill[inst].reported  # the EndForward payload: tokens left per DP unit
        self.r_queued[inst] = left
        self.busy_until[inst] = now + self.time_to_drain(left)
        fl, uf = self.flight[inst], self.u_flight[inst]
        while fl and fl[0][0] <= now:
            _, d, tok = fl.popleft()
            uf[d] -= tok
        self.acked[inst] = not fl  # a dispatch still on the wire is not acknowledged by this pass's end

    def time_to_drain(self, left: np.ndarray) -> float:
        """Offline-profile estimate of how long an instance needs for `left` tokens per unit (0 if none):
        the batch-forming step, then one pass per chunk of the fullest unit."""
        if not left.any():
            return 0.0
        chunk = int(self.chunk[0, 0])
        t = 0.0
        rest = left.astype(np.float64)
        while rest.any():
            take = np.minimum(rest, chunk)
            z = np.zeros_like(take)
            t += (self.form_s if (take < chunk).any() else 0.0) + self.profile.pass_time(take, take * take / 2, z, z)
            rest -= take
        return t

    def in_form_window(self, inst: int, now: float) -> bool:
        """A release sent now reaches the instance inside its batch-forming step (joins the next pass)."""
        left = self.r_queued[inst]
        return (bool(left.any()) and bool((left < self.chunk[inst]).any())
                and now + self.net < self.last_end[inst] + self.form_s)

    def poll(self, sim, inst: int) -> bool:
        """Quiescence poll: True (and the unit state is reset) if the instance answers with task depth zero."""
        P = sim.prefill[inst]
        if not P.up or P.depth:
            return False
        self.clear(inst)
        return True

    def clear(self, inst: int) -> None:
        """Forget an instance's outstanding work (quiescent, reset by the watchdog, or gone)."""
        self.u_flight[inst] = 0
        self.r_queued[inst] = 0
        self.flight[inst].clear()
        self.acked[inst] = True
        self.busy_until[inst] = -math.inf

    def expected_free(self, inst: int, now: float) -> float:
        """Seconds until the instance is expected to report its pass end (0 if it already did)."""
        if self.acked[inst]:
            return 0.0
        return max(0.0, self.last_dispatch[inst] + self.net + self.t_fwd - now)


class Allocation(NamedTuple):
    unit: np.ndarray  # per request (input order): DP unit, or -1 if left for the next cycle
    avail_at: np.ndarray  # C_avail of the chosen unit just before the assignment (0 if left)
    avail: np.ndarray  # C_avail of every unit after the allocation


def greedy_dispatch(lengths: np.ndarray, c_avail: np.ndarray, hits: np.ndarray | None = None) -> Allocation:
    """GreedyDispatch(Q) over one instance's DP units (lengths descending, d* = argmax Cap).

    `hits` (requests x units, cache-aware mode) are the prefix-cache tokens each unit would
    serve. Ties go to the lowest unit index.
    """
    n = len(lengths)
    unit = np.full(n, -1, dtype=np.int64)
    at = np.zeros(n, dtype=np.int64)
    avail = [int(x) for x in c_avail]
    L = [int(x) for x in lengths]
    order = np.argsort(-np.asarray(lengths), kind="stable").tolist()
    units = range(len(avail))
    if hits is None:  # argmax_d (C_avail(d) - L) is argmax_d C_avail(d)
        for k in order:
            d = max(units, key=avail.__getitem__)
            a = avail[d]
            if a <= 0:
                break  # no unit has capacity left: the rest waits
            unit[k] = d
            at[k] = a
            avail[d] = a - L[k]
    else:
        H = np.asarray(hits).tolist()
        for k in order:
            if max(avail) <= 0:
                break
            h = H[k]
            d = max(units, key=lambda j: avail[j] + h[j])
            a = avail[d]
            if a <= 0:
                continue  # its best unit (cache) is full: wait for it rather than lose the hit
            unit[k] = d
            at[k] = a
            avail[d] = a - (L[k] - h[d])
    return Allocation(unit, at, np.array(avail, dtype=np.int64))


def prefix_hits(sim, inst: int, ids: list[int]) -> np.ndarray:
    """L_hit(r, d) for every request x DP unit of `inst` (what `sim.dispatch` would take off), vectorised."""
    P = sim.prefill[inst]
    H = np.zeros((len(ids), P.dp), dtype=np.int64)
    if P.blocks is not None:  # prefix-block caches (envs/sim/prefix_cache.py): a recompute gets no credit
        done = sim.req.done
        for k, rid in enumerate(ids):
            if done[rid] == 0:
                H[k] = P.cache_hits(rid)[0]
        return H
    if P.caches is None or not ids:
        return H
    req = sim.req
    idx = np.asarray(ids)
    keys = req.prefix_key[idx]
    ok = (keys >= 0) & (req.done[idx] == 0)
    if not ok.any():
        return H
    where: dict[int, int] = {}  # prefix key -> bit mask of the units whose cache holds it
    for d, cache in enumerate(P.caches):
        bit = 1 << d
        for k in cache.keys:
            where[k] = where.get(k, 0) | bit
    masks = np.fromiter((where.get(k, 0) for k in keys.tolist()), dtype=np.int64, count=len(ids))
    hit = np.where(ok, np.minimum(req.prefix_len[idx], req.work[idx] - 1), 0)
    return hit[:, None] * ((masks[:, None] >> np.arange(P.dp)) & 1)


class PBAA:
    """Pending-first GreedyDispatch with wait counters and flow control; one `release` per released batch.

    overload: "reject" rejects a request left over more than `n_limit` cycles with reason
    "flow_control"; "throttle" keeps it (it goes first next cycle) and holds new arrivals out
    of allocation while any such request waits. Both are counted in `stats`.
    """

    OVERLOAD = ("reject", "throttle")

    def __init__(self, n_limit: int = 3, overload: str = "reject", cache_aware: bool = False):
        check(isinstance(n_limit, int) and n_limit >= 0, "policy.prefill.n_limit", f"got {n_limit!r}; must be an integer >= 0")
        check(overload in self.OVERLOAD, "policy.prefill.overload", f"got {overload!r}; allowed: {', '.join(self.OVERLOAD)}")
        self.n_limit = n_limit
        self.overload = overload
        self.cache_aware = bool(cache_aware)
        self.reset()

    def reset(self) -> None:
        self.wait: dict[int, int] = {}  # left-over requests (pending) -> cycles waited, first left over first
        self.stats = {"cycles": 0, "placed": 0, "left_over": 0, "flow_control_rejected": 0, "throttled": 0}

    def wait_cycles(self, rid: int) -> int:
        """Cycles `rid` has been left over (0 if it never was)."""
        return self.wait.get(rid, 0)

    def n_left_over(self, buffer) -> int:
        """How many of the requests in `buffer` an earlier cycle left over."""
        return sum(1 for r in self.wait if r in buffer)

    def plan(self, sim, inst: int, c_avail: np.ndarray, only: list[int] | None = None
             ) -> tuple[list[tuple[int, int]], list[int], list[int]]:
        """(placed (rid, dp) pending first, left-over rids, throttled new rids) for one cycle over the buffer,
        or over its requests `only` (a release composition: the rest is not offered this cycle); changes nothing."""
        buf = sim.buffer if only is None else dict.fromkeys(only)
        wait = self.wait
        pending = [r for r in wait if r in buf]
        new = [r for r in buf if r not in wait]
        throttled: list[int] = []
        if self.overload == "throttle" and any(wait[r] > self.n_limit for r in pending):
            new, throttled = [], new
        placed: list[tuple[int, int]] = []
        left: list[int] = []
        avail = c_avail
        work = sim.req.work
        for group in (pending, new):
            if not group:
                continue
            hits = prefix_hits(sim, inst, group) if self.cache_aware else None
            alloc = greedy_dispatch(work[group], avail, hits)
            avail = alloc.avail
            for rid, d in zip(group, alloc.unit.tolist()):
                if d >= 0:
                    placed.append((rid, d))
                else:
                    left.append(rid)
        return placed, left, throttled

    def release(self, sim, inst: int, cap: CapacityModel, only: list[int] | None = None) -> int:
        """Allocate the buffer (or its requests `only`) to the DP units of `inst`, dispatch, count waits,
        apply flow control."""
        placed, left, throttled = self.plan(sim, inst, cap.c_avail(inst), only)
        wait = self.wait
        for r in [r for r in wait if r not in sim.buffer]:  # resolved elsewhere (e.g. the run's horizon)
            del wait[r]
        now = sim.now
        work = sim.req.work
        for rid, d in placed:
            wait.pop(rid, None)
            sim.dispatch(rid, inst, d)
            cap.dispatched(inst, d, int(work[rid]), now)
        for rid in left:
            w = wait.get(rid, 0) + 1
            wait[rid] = w
            if w > self.n_limit and self.overload == "reject":
                del wait[rid]
                sim.reject(rid, "flow_control")
                self.stats["flow_control_rejected"] += 1
        st = self.stats
        st["cycles"] += 1
        st["placed"] += len(placed)
        st["left_over"] += len(left)
        st["throttled"] += len(throttled)
        return len(placed)
