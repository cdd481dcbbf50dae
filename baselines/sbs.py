"""Staggered Batch Scheduling (SBS, arXiv 2512.16134; ALGORITHMS.md s1), the prefill side.

Immediate dispatch queues a request on a busy instance, where it waits about half a
forward time T whatever the cluster size. SBS holds requests at the scheduler and
releases the buffered batch to one instance every I_opt = (T_fwd + L_net) / N_active, in
a staggered round robin over the healthy instances, so each instance gets a batch just as
it frees and a request waits about T / (2N) instead.

Interval control: T_fwd = mean of a sliding window of EndForward times (`t_default`, the
offline estimate, until the first one); I_opt is recomputed on every EndForward and every
topology change. Release rule (dual trigger): the interval has elapsed since the last
release AND the target is ready: (1) a quiescence poll finds its task depth zero (also the
cold start), (2) it sent EndForward after our last dispatch reached it (fast path), or (3) it is
degraded: the watchdog armed at dispatch expired after `watchdog` x T_fwd without a signal
(lost EndForward or dead instance); the scheduler then resets that instance's state and
releases to it on the interval alone (fixed-interval batching) until it reports again.

Target order (`order`): "strict" (the paper's rule, default) waits for the next instance of
the round robin to be ready; "next_ready" (an ablation, not in the paper) releases to the
first ready instance from that point of the round robin, so a slow pass does not hold the
whole stagger back.

Allocation of the released batch over the target's DP units (`allocation`): "pbaa" and
"pbaa_cache" (pdgym.baselines.pbaa), or, with PBAA switched off, "first_fit" (arrival
order, first unit whose C_avail fits the prompt, else the emptiest; never holds back)
and "round_robin" (units in turn, no capacity model).
"""

from __future__ import annotations

import math

import numpy as np
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.validation import check, is_num

from .pbaa import PBAA, CapacityModel
from .registry import register

ALLOCATIONS = ("pbaa", "pbaa_cache", "first_fit", "round_robin")
ORDERS = ("strict", "next_ready")


@register("prefill", "sbs")
class SBS(PrefillScheduler):
    """SBS interval control + dual-trigger release + watchdog, with a pluggable DP allocation."""

    def __init__(self, allocation: str = "pbaa", window: int = 32, t_default: float | None = None,
                 l_net: float | None = None, watchdog: float = 5.0, poll_s: float = 0.05, n_limit: int = 3,
                 overload: str = "reject", order: str = "strict"):
        check(allocation in ALLOCATIONS, "policy.prefill.allocation",
                    f"got {allocation!r}; allowed: {', '.join(ALLOCATIONS)}")
        check(l_net is None or (is_num(l_net) and l_net >= 0), "policy.prefill.l_net",
                    f"got {l_net!r}; must be >= 0 (or null: cluster.net_latency_s)")
        check(is_num(watchdog) and watchdog > 1, "policy.prefill.watchdog",
                    f"got {watchdog!r}; must be > 1 (multiples of T_fwd)")
        check(is_num(poll_s) and poll_s > 0, "policy.prefill.poll_s", f"got {poll_s!r}; must be > 0")
        check(order in ORDERS, "policy.prefill.order", f"got {order!r}; allowed: {', '.join(ORDERS)}")
        self.allocation = allocation
        self.order_rule = order
        self.cap = CapacityModel(window, t_default)
        self.pbaa = PBAA(n_limit, overload, cache_aware=allocation == "pbaa_cache")
        self.l_net = l_net
        self.watchdog = float(watchdog)
        self.poll_s = float(poll_s)

    # ------------------------------------------------------------------ protocol
    def reset(self, sim) -> None:
        self.cap.reset(sim)
        self.pbaa.reset()
        n = self.cap.n
        self._lnet = self.l_net if self.l_net is not None else sim.cfg.cluster.net_latency_s
        self.order = sim.healthy_prefill()
        self.ptr = 0
        self.last_release = -math.inf
        self.wd_token = [0] * n
        self.degraded = np.zeros(n, dtype=bool)
        self.rr_unit = [0] * n
        self._wake_at = math.inf
        # late_s: release time past last_release + I_opt, summed (stagger slip, or an empty buffer at the due
        # time); busy_target: releases whose target was still running a pass (e.g. a long prompt's next
        # chunk). Both are measurements for the reproductions; the policy does not read them.
        self.stats = {"releases": 0, "watchdog_resets": 0, "late_s": 0.0, "busy_target": 0}
        self._update_interval()

    def on_arrival(self, sim, rid: int) -> None:
        self.try_release(sim)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self.cap.end_forward(sim, inst, fwd_time)
        self.degraded[inst] = False
        if self.cap.acked[inst]:
            self.wd_token[inst] += 1  # disarm the watchdog (not while a dispatch is still on the wire)
        self._update_interval()
        self.try_release(sim)

    def on_timer(self, sim, tag) -> None:
        if tag[0] == "wd":
            _, inst, token = tag
            if token != self.wd_token[inst] or self.cap.acked[inst]:
                return
            self.cap.clear(inst)  # reset the silent instance and carry on at a fixed interval
            self.degraded[inst] = True
            self.stats["watchdog_resets"] += 1
        elif tag[1] == self._wake_at:
            self._wake_at = math.inf
        self.try_release(sim)

    def on_topology_change(self, sim) -> None:
        healthy = sim.healthy_prefill()
        for i in set(self.order).symmetric_difference(healthy):
            self.cap.clear(i)
            self.wd_token[i] += 1
            self.degraded[i] = False
        self.order = healthy
        self._update_interval()
        self.try_release(sim)

    # ------------------------------------------------------------------ release rule
    @property
    def interval(self) -> float:
        return self._interval

    def _update_interval(self) -> None:
        n = len(self.order)
        self._interval = (self.cap.t_fwd + self._lnet) / n if n else math.inf

    def _wake(self, sim, t: float) -> None:
        if t < self._wake_at:
            self._wake_at = t
            sim.set_timer(t, "prefill", ("wake", t))

    def ready(self, sim, inst: int) -> bool:
        """Fast path (EndForward since our last dispatch), degraded (watchdog fired), or quiescence poll."""
        return bool(self.cap.acked[inst] or self.degraded[inst] or self.cap.poll(sim, inst))

    def try_release(self, sim) -> None:
        if not sim.buffer or not self.order:
            return  # nothing to send, or no healthy instance: held until on_topology_change
        now = sim.now
        due = self.last_release + self._interval
        if now < due - 1e-12:
            self._wake(sim, due)
            return
        n = len(self.order)
        tries = n if self.order_rule == "next_ready" else 1
        for k in range(tries):
            target = self.order[(self.ptr + k) % n]
            if self.ready(sim, target):
                self.ptr += k
                break
        else:
            self._wake(sim, now + self.poll_s)  # EndForward, the next poll or the watchdog will come
            return
        self.release(sim, target)
        if sim.buffer:
            self._wake(sim, now + self._interval)

    def release(self, sim, target: int) -> int:
        """Send the buffered batch to `target` (allocation over its DP units); one SBS cycle."""
        if self.allocation in ("pbaa", "pbaa_cache"):
            n = self.pbaa.release(sim, target, self.cap)
        else:
            n = self._release_all(sim, target)
        now = sim.now
        st = self.stats
        if st["releases"]:
            st["late_s"] += max(0.0, now - self.last_release - self._interval)
        st["busy_target"] += bool(sim.prefill[target].busy)
        self.last_release = now
        self.ptr += 1
        st["releases"] += 1
        if n:
            self.wd_token[target] += 1
            sim.set_timer(now + self.watchdog * self.cap.t_fwd, "prefill", ("wd", target, self.wd_token[target]))
        return n

    def _release_all(self, sim, target: int) -> int:
        """PBAA off: every buffered request goes to `target` now, first-fit or round robin over its units."""
        cap = self.cap
        work = sim.req.work
        now = sim.now
        rids = list(sim.buffer)
        D = cap.dp
        if self.allocation == "first_fit":
            avail = cap.c_avail(target).tolist()
            for rid in rids:
                L = int(work[rid])
                d = next((j for j in range(D) if avail[j] >= L), None)
                if d is None:
                    d = max(range(D), key=avail.__getitem__)
                avail[d] -= L
                sim.dispatch(rid, target, d)
                cap.dispatched(target, d, int(work[rid]), now)
        else:
            for rid in rids:
                d = self.rr_unit[target] % D
                self.rr_unit[target] += 1
                sim.dispatch(rid, target, d)
                cap.dispatched(target, d, int(work[rid]), now)
        return len(rids)
