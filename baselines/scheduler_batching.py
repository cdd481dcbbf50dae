"""Batching at the global prefill scheduler: fixed and dynamic batching (the batching study, ALGORITHMS.md s4).

Both hold arrivals in the scheduler buffer and release the whole buffer at once to the
healthy instance with the fewest outstanding prefill tokens (the engine spreads it over
its DP units). They differ in when:

- fixed batching: once the buffered prompt tokens reach `b`, or the oldest buffered
  request has waited `timeout_s`; a steady cadence of similar batches;
- dynamic batching: the token target grows with the queue depth (requests buffered plus
  requests unfinished on the devices): `thresholds` = [[depth, b], ...] with depths rising
  from 0, the last pair whose depth is reached gives b; so a quiet cluster gets small,
  immediate batches and a busy one large, efficient ones. A latency guard releases early
  when the oldest request's wait plus the expected forward time (mean of the last
  `window` EndForward times) reaches `ttft_target_s`.

These are the batching study's two policies (ALGORITHMS.md s4) moved from one instance's
iteration to the global scheduler; pdgym.baselines.batching_study has them per instance.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.validation import check, is_num

from .dispatch import outstanding_tokens, queue_depth
from .registry import register


class BufferedRelease(PrefillScheduler):
    """Common mechanics: keep a running token count of the buffer, release it all when `due`."""

    def reset(self, sim) -> None:
        self._tokens = 0
        self._wake_at = math.inf

    def due(self, sim, oldest_age: float) -> tuple[bool, float]:  # pragma: no cover - abstract
        """(release now?, otherwise the time by which to look again)."""
        raise NotImplementedError

    def on_arrival(self, sim, rid: int) -> None:
        self._tokens += int(sim.req.work[rid])
        self._check(sim)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self._check(sim)

    def on_timer(self, sim, tag) -> None:
        if tag == self._wake_at:
            self._wake_at = math.inf
        self._check(sim)

    def on_topology_change(self, sim) -> None:
        self._check(sim)

    def _check(self, sim) -> None:
        if not sim.buffer:
            return
        healthy = sim.healthy_prefill()
        if not healthy:
            return  # held until an instance is back
        oldest = next(iter(sim.buffer))
        go, t = self.due(sim, sim.now - float(sim.req.buf_t[oldest]))
        if go:
            inst = min(healthy, key=lambda i: outstanding_tokens(sim, i))
            for rid in list(sim.buffer):
                sim.dispatch(rid, inst)
            self._tokens = 0
        elif t < self._wake_at:
            self._wake_at = t
            sim.set_timer(t, "prefill", t)


@register("prefill", "fixed_batch")
class FixedBatchRelease(BufferedRelease):
    """Release the buffer once it holds `b` prompt tokens or its oldest request waited `timeout_s`."""

    def __init__(self, b: int = 8192, timeout_s: float = 0.1):
        check(isinstance(b, int) and b >= 1, "policy.prefill.b", f"got {b!r}; must be an integer >= 1 (tokens)")
        check(is_num(timeout_s) and timeout_s > 0, "policy.prefill.timeout_s",
                    f"got {timeout_s!r}; must be > 0 (seconds)")
        self.b = b
        self.timeout_s = float(timeout_s)

    def due(self, sim, oldest_age: float) -> tuple[bool, float]:
        if self._tokens >= self.b or oldest_age >= self.timeout_s - 1e-12:
            return True, sim.now
        return False, sim.now + self.timeout_s - oldest_age


@register("prefill", "dynamic_batch")
class DynamicBatchRelease(BufferedRelease):
    """Token target chosen by queue depth, with a latency guard on the oldest request."""

    def __init__(self, thresholds: list | None = None, ttft_target_s: float = 1.0, window: int = 32):
        pairs = [[0, 1024], [8, 4096], [32, 12288], [128, 24576]] if thresholds is None else thresholds
        ok = isinstance(pairs, (list, tuple)) and len(pairs) >= 1 and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, int) for x in p) for p in pairs)
        depths = [p[0] for p in pairs] if ok else []
        ok = ok and depths[0] == 0 and depths == sorted(set(depths)) and all(p[1] >= 1 for p in pairs)
        check(ok, "policy.prefill.thresholds", f"got {thresholds!r}; need [[depth, b], ...] integer pairs, depths rising "
                    "strictly from 0, b >= 1 tokens")
        check(is_num(ttft_target_s) and ttft_target_s > 0, "policy.prefill.ttft_target_s",
                    f"got {ttft_target_s!r}; must be > 0 (seconds)")
        check(isinstance(window, int) and window >= 1, "policy.prefill.window", f"got {window!r}; must be an integer >= 1")
        self.depths = depths[1:]
        self.targets = [p[1] for p in pairs]
        self.ttft_target_s = float(ttft_target_s)
        self.window = window

    def reset(self, sim) -> None:
        super().reset(sim)
        self._fwd: deque = deque(maxlen=self.window)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self._fwd.append(fwd_time)
        super().on_end_forward(sim, inst, fwd_time)

    def target(self, sim) -> int:
        depth = len(sim.buffer) + sum(queue_depth(sim, i) for i in sim.healthy_prefill())
        return self.targets[bisect.bisect_right(self.depths, depth)]

    def due(self, sim, oldest_age: float) -> tuple[bool, float]:
        t_fwd = sum(self._fwd) / len(self._fwd) if self._fwd else 0.0
        slack = self.ttft_target_s - t_fwd - oldest_age
        if self._tokens >= self.target(sim) or slack <= 1e-12:
            return True, sim.now
        return False, sim.now + slack
