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
cold start), (2) it sent EndForward after our last dispatch reached it (fast path) and is
"ready or will soon be ready" (below), or (3) it is degraded: the watchdog armed at dispatch
expired after `watchdog` x T_fwd without a signal (lost EndForward or dead instance); the
scheduler then resets that instance's state and releases to it on the interval alone
(fixed-interval batching) until it reports again.

Readiness from the EndForward payload (`readiness="payload"`, default; SBS Figs. 2b, 4, 5): the
signal carries the tokens each DP unit still has to process (a long prompt's next chunks). An
instance that reported none is ready. One that reported some is running (or about to run) a
continuation pass; a release joins that pass's idle DP units when it reaches the engine inside
its batch-forming step (`cluster.prefill.batch_form_s` > L_net: the engine holds a pass that
continues queued work so that a batch released on the EndForward lands in it; PBAA then fills
the units the continuation leaves idle, the water-filling of Fig. 4). Such a release does not wait for
I_opt (`join="form"`, default): the interval paces batches to free instances, but a continuation pass
that forms without a release runs its leftover alone, with most DP units idle, and the next release then
waits that whole pass. `join="interval"` (ablation) keeps the interval gate for it too. Otherwise the instance is
ready once the offline profile says its reported work ends by the time a release sent now
arrives ("will soon be ready"), so a release never waits a whole pass on the device.
`readiness="ack"` (ablation) is the signal alone: any EndForward since our last dispatch means
ready, even when the engine has already started the next chunk of a long prompt.

Target order (`order`): "next_ready" (default) releases to the first instance from the
round-robin pointer that is ready or will soon be ready (SBS Fig. 2b: the batch goes to "an
engine that is ready or will soon be ready"), and when none is, looks again as soon as the
first one is predicted free; with every instance ready it is the plain staggered round robin.
"strict" (ablation; ALGORITHMS.md s1's literal reading) waits for the next instance of the
round robin, so one pass longer than the mean holds the whole stagger back. Measured (3 seeds
x 8000 requests, ds_v3_h800_3p1d at 126 req/s, 60% of immediate dispatch's peak; pdgym-repro
sbs_ttft): mean TTFT / immediate 0.66 next_ready, 0.76 strict.

Release composition (`compose`): "all" (default, the paper's) releases the whole buffer; "length"
(pdgym's, not in the paper: pdgym.baselines.length_classes) releases the short or the long half of it
(split at the median prompt of recent arrivals) so that short prompts do not wait for a long prompt's
pass; the leaderboard shows it as a headroom row of the prefill board.

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

from .length_classes import LengthClasses
from .pbaa import PBAA, CapacityModel
from .registry import register

ALLOCATIONS = ("pbaa", "pbaa_cache", "first_fit", "round_robin")
ORDERS = ("strict", "next_ready")
READINESS = ("payload", "ack")
JOIN = ("form", "interval")
EARLY = ("none", "full")
COMPOSE = ("all", "length")


@register("prefill", "sbs")
class SBS(PrefillScheduler):
    """SBS interval control + dual-trigger release + watchdog, with a pluggable DP allocation."""

    def __init__(self, allocation: str = "pbaa", window: int = 32, t_default: float | None = None,
                 l_net: float | None = None, watchdog: float = 5.0, poll_s: float = 0.05, n_limit: int = 3,
                 overload: str = "reject", order: str = "next_ready", readiness: str = "payload",
                 compose: str = "all", join: str = "form", early: str = "none"):
        check(allocation in ALLOCATIONS, "policy.prefill.allocation",
                    f"got {allocation!r}; allowed: {', '.join(ALLOCATIONS)}")
        check(l_net is None or (is_num(l_net) and l_net >= 0), "policy.prefill.l_net",
                    f"got {l_net!r}; must be >= 0 (or null: cluster.net_latency_s)")
        check(is_num(watchdog) and watchdog > 1, "policy.prefill.watchdog",
                    f"got {watchdog!r}; must be > 1 (multiples of T_fwd)")
        check(is_num(poll_s) and poll_s > 0, "policy.prefill.poll_s", f"got {poll_s!r}; must be > 0")
        check(order in ORDERS, "policy.prefill.order", f"got {order!r}; allowed: {', '.join(ORDERS)}")
        check(readiness in READINESS, "policy.prefill.readiness", f"got {readiness!r}; allowed: {', '.join(READINESS)}")
        check(join in JOIN, "policy.prefill.join", f"got {join!r}; allowed: {', '.join(JOIN)}")
        check(early in EARLY, "policy.prefill.early", f"got {early!r}; allowed: {', '.join(EARLY)}")
        check(compose in COMPOSE, "policy.prefill.compose", f"got {compose!r}; allowed: {', '.join(COMPOSE)}")
        self.readiness = readiness
        self.join = join == "form" and readiness == "payload"  # the batch-forming step is read from the payload
        self.early_full = early == "full"
        self.classes = LengthClasses() if compose == "length" else None
        self.allocation = allocation
        self.order_rule = order
        self.cap = CapacityModel(window, t_default)
        self.pbaa = PBAA(n_limit, overload, cache_aware=allocation == "pbaa_cache")
        self.l_net = l_net
        self.watchdog = float(watchdog)
        self.poll_s = float(poll_s)
        self._send = self.release  # what a due release calls (hook_release)

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
        if self.classes is not None:
            self.classes.reset()
        self._wake_at = math.inf
        # late_s: release time past last_release + I_opt, summed (stagger slip, or an empty buffer at the due
        # time); busy_target: releases whose target was still running a pass (e.g. a long prompt's next
        # chunk); joins: releases into a continuation pass's batch-forming step before I_opt was up. These are
        # measurements for the reproductions; the policy does not read them.
        self.stats = {"releases": 0, "watchdog_resets": 0, "late_s": 0.0, "busy_target": 0, "joins": 0}
        self._update_interval()

    def on_arrival(self, sim, rid: int) -> None:
        if self.classes is not None and sim.req.buf_t[rid] == sim.req.arrival[rid]:  # fresh, not bounced back
            self.classes.arrived(int(sim.req.work[rid]))
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

    def hook_release(self, hook) -> None:
        """Where SBS would release to `target`, call `hook(sim, target)` instead (None: release the batch
        itself). The hook's owner sends a release, of any part of the buffer, with `release(sim, target, only)`;
        SBS's timing (interval, readiness, watchdog) is unchanged. The PrefillDispatch env composes SBS's
        releases this way (baselines/shared.py)."""
        self._send = self.release if hook is None else hook

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
        """Fast path (EndForward since our last dispatch, and free, forming a batch or soon free by its
        payload), degraded (watchdog fired), or quiescence poll."""
        cap = self.cap
        if self.degraded[inst]:
            return True
        if cap.acked[inst]:
            if self.readiness == "ack":
                return True
            now = sim.now
            return bool(cap.busy_until[inst] <= now + cap.net + 1e-9 or cap.in_form_window(inst, now))
        return cap.poll(sim, inst)

    def _retry_at(self, sim, candidates: list[int]) -> float:
        """When to look again if no candidate is ready: the next poll, or earlier when a candidate's
        reported work is predicted to end (a release sent then arrives as it frees)."""
        cap = self.cap
        t = sim.now + self.poll_s
        for i in candidates:
            if cap.acked[i] and not self.degraded[i]:
                t = min(t, max(sim.now, cap.busy_until[i] - cap.net))
        return t

    def try_release(self, sim) -> None:
        if not sim.buffer or not self.order:
            return  # nothing to send, or no healthy instance: held until on_topology_change
        now = sim.now
        n = len(self.order)
        tries = n if self.order_rule == "next_ready" else 1
        due = self.last_release + self._interval
        if now < due - 1e-12:
            if (self.join or self.early_full) and self._release_early(sim, tries):
                return
            self._wake(sim, min(due, self._frees_at(sim, tries)) if self.early_full else due)
            return
        for k in range(tries):
            target = self.order[(self.ptr + k) % n]
            if self.ready(sim, target):
                self.ptr += k
                break
        else:  # EndForward, the predicted end, the next poll or the watchdog will come
            self._wake(sim, self._retry_at(sim, [self.order[(self.ptr + k) % n] for k in range(tries)]))
            return
        self._send(sim, target)

    def _release_early(self, sim, tries: int) -> bool:
        """Before I_opt is up, release to the first candidate that (join="form") has a continuation pass forming
        a batch, whose idle DP units would otherwise run empty for a whole pass, or (early="full") is ready
        while the buffer already holds what it can take, so waiting would only idle it. True if released."""
        n = len(self.order)
        cap = self.cap
        for k in range(tries):
            target = self.order[(self.ptr + k) % n]
            if self.degraded[target] or not cap.acked[target]:
                continue
            if self.join and cap.in_form_window(target, sim.now):
                self.stats["joins"] += 1
            elif not (self.early_full and self.ready(sim, target) and self._fills(sim, target)):
                continue
            self.ptr += k
            self._send(sim, target)
            return True
        return False

    def _frees_at(self, sim, tries: int) -> float:
        """early="full": the next time a candidate that is still working is predicted to become ready."""
        cap = self.cap
        n = len(self.order)
        t = math.inf
        for k in range(tries):
            i = self.order[(self.ptr + k) % n]
            if cap.acked[i] and not self.degraded[i] and cap.busy_until[i] - cap.net > sim.now:
                t = min(t, cap.busy_until[i] - cap.net)
        return t

    def _fills(self, sim, target: int) -> bool:
        """The buffer holds at least the target's free chunk capacity (summed only as far as needed)."""
        need = float(self.cap.c_avail(target).clip(0).sum())
        work = sim.req.work
        got = 0
        for rid in sim.buffer:
            got += int(work[rid])
            if got >= need:
                return True
        return False

    def release(self, sim, target: int, only: list[int] | None = None) -> int:
        """Send the buffered batch (or its requests `only`; with compose="length" the class the rule picks) to
        `target` (allocation over its DP units); one SBS cycle."""
        if only is None and self.classes is not None:
            only = self.classes.members(sim, self.classes.rule(sim))
        if self.allocation in ("pbaa", "pbaa_cache"):
            n = self.pbaa.release(sim, target, self.cap, only)
        else:
            n = self._release_all(sim, target, only)
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
        if sim.buffer:
            self._wake(sim, now + self._interval)
        return n

    def _release_all(self, sim, target: int, only: list[int] | None = None) -> int:
        """PBAA off: every buffered request (or those `only`) goes to `target` now, first-fit or round robin
        over its units."""
        cap = self.cap
        work = sim.req.work
        now = sim.now
        rids = list(sim.buffer) if only is None else list(only)
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
