"""Batching policies of the batching study (ALGORITHMS.md section 4) for a colocated instance.

Every policy proposes prompt pieces through `sim.fill_prefill` (running prefills first, then
FIFO admission while slots and KV allow), so admission rules live in one place; the
policies only decide *when* to prefill, how many tokens, and whether decodes step.

- fcfs: process-to-completion, one request at a time (prefill, then all its decode).
- prefill_first: prefill-prioritised batching under a token budget K (decode only when no
  prompt can be admitted); with K = the unit's budget it is vLLM v0 (`v0`).
- fixed: a prefill batch leaves once queued prompt work >= b tokens or the oldest waiting
  request has waited `timeout_s`; decodes run in between.
- dynamic: like fixed, but the target b grows with the queue depth (thresholds) and a
  latency guard releases early when the oldest request nears its TTFT target.
- chunked: each request contributes at most chunk_size tokens per prefill iteration, K in
  total; prefill and decode iterations alternate.
"""

from __future__ import annotations

import math

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import Batch, BatchingPolicy

from .registry import register


# --------------------------------------------------------------------------- parameter checks
def check_int(value, key: str, lo: int = 1, allow_none: bool = False) -> int | None:
    """An integer >= lo (or None when allowed), else a one-line ConfigError naming the key."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{key}: got {value!r}; must be an integer >= {lo}" + (" or null" if allow_none else ""))
    return int(value)


def check_float(value, key: str, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False,
                hi_open: bool = False) -> float:
    """A finite number in [lo, hi] (open ends when asked), else a one-line ConfigError naming the key."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if ok:
        v = float(value)
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ConfigError(f"{key}: got {value!r}; allowed {lb}{lo}, {hi}{rb}")
    return float(value)


def _budget(param: int | None, unit) -> int:
    return unit.chunk_tokens if param is None else param


# --------------------------------------------------------------------------- policies
@register("batching", "fcfs")
class FCFS(BatchingPolicy):
    """Process to completion: one request at a time, its prefill (chunked by the unit budget) then its decode."""

    def next_batch(self, sim, inst, unit):
        u = sim.colocated[inst].units[unit]
        if u.n_decoding:
            return Batch(decode=True)
        pieces = sim.fill_prefill(inst, unit, u.chunk_tokens)[:1]
        return Batch(prefill=pieces) if pieces else None


@register("batching", "prefill_first")
class PrefillFirst(BatchingPolicy):
    """Prefill-prioritised exclusive batching: a prefill-only batch of up to K tokens whenever a
    prompt can be admitted or continued; otherwise every running request decodes."""

    def __init__(self, K: int | None = None):
        self.K = check_int(K, "policy.batching.K", allow_none=True)

    def next_batch(self, sim, inst, unit):
        u = sim.colocated[inst].units[unit]
        pieces = sim.fill_prefill(inst, unit, _budget(self.K, u))
        if pieces:
            return Batch(prefill=pieces)
        return Batch(decode=True) if u.n_decoding else None


@register("batching", "fixed")
class FixedBatching(BatchingPolicy):
    """Release a prefill batch (up to K tokens, FIFO) once queued prompt work reaches b tokens or
    the oldest waiting request has waited timeout_s; decode in between; an admitted batch's
    chunks finish before anything else. Idle units set a timer for the timeout."""

    def __init__(self, b: int = 512, timeout_s: float = 0.05, K: int | None = None):
        self.b = check_int(b, "policy.batching.b")
        self.timeout_s = check_float(timeout_s, "policy.batching.timeout_s")
        self.K = check_int(K, "policy.batching.K", allow_none=True)

    def reset(self, sim):
        self._timers: set[float] = set()

    def target(self, sim, u) -> tuple[int, float]:
        """(token target, seconds the oldest request may wait) for unit u now."""
        return self.b, self.timeout_s

    def next_batch(self, sim, inst, unit):
        u = sim.colocated[inst].units[unit]
        budget = _budget(self.K, u)
        if u.prefilling:
            return Batch(prefill=sim.fill_prefill(inst, unit, budget, admit_new=False))
        if u.waiting:
            b, wait_s = self.target(sim, u)
            req = sim.req
            due = req.dev_arrive[u.waiting[0]] + wait_s
            queued = 0
            for rid in u.waiting:
                queued += int(req.work[rid])
                if queued >= b:
                    break
            if queued >= b or sim.now >= due:
                pieces = sim.fill_prefill(inst, unit, budget)
                if pieces:
                    return Batch(prefill=pieces)
            elif not u.n_decoding and due not in self._timers:
                self._timers.add(due)
                sim.set_timer(due, "batching", due)
        return Batch(decode=True) if u.n_decoding else None

    def on_timer(self, sim, tag):
        self._timers.discard(tag)


@register("batching", "dynamic")
class DynamicBatching(FixedBatching):
    """Fixed batching whose target grows with the queue: b = tokens of the last [depth, tokens]
    threshold whose depth <= waiting requests; a latency guard releases the batch once the oldest
    request has waited guard x ttft_target_s."""

    def __init__(self, thresholds: list | None = None, ttft_target_s: float = 1.0, guard: float = 0.5,
                 K: int | None = None):
        thresholds = [[0, 256], [4, 1024], [16, 4096]] if thresholds is None else thresholds
        key = "policy.batching.thresholds"
        try:
            pairs = sorted((int(d), int(t)) for d, t in thresholds)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: got {thresholds!r}; must be a list of [queue_depth, tokens] pairs") from None
        if not pairs or pairs[0][0] != 0 or any(t < 1 for _, t in pairs):
            raise ConfigError(f"{key}: got {thresholds!r}; the first depth must be 0 and tokens >= 1")
        self.thresholds = pairs
        ttft = check_float(ttft_target_s, "policy.batching.ttft_target_s", lo_open=True)
        g = check_float(guard, "policy.batching.guard", 0.0, 1.0, lo_open=True)
        super().__init__(b=pairs[0][1], timeout_s=g * ttft, K=K)
        self.ttft_target_s, self.guard = ttft, g

    def target(self, sim, u):
        q = len(u.waiting)
        b = self.b
        for depth, tokens in self.thresholds:
            if depth > q:
                break
            b = tokens
        return b, self.timeout_s


@register("batching", "chunked")
class ChunkedPrefill(BatchingPolicy):
    """Chunked prefill alternating with decode: a prefill iteration gives each request at most
    chunk_size tokens and at most K in total; when both phases have work they take turns."""

    def __init__(self, chunk_size: int = 128, K: int = 128):
        self.chunk_size = check_int(chunk_size, "policy.batching.chunk_size")
        self.K = check_int(K, "policy.batching.K")

    def reset(self, sim):
        self._last_prefill: dict[tuple[int, int], bool] = {}

    def next_batch(self, sim, inst, unit):
        u = sim.colocated[inst].units[unit]
        key = (inst, unit)
        if not (u.n_decoding and self._last_prefill.get(key)):
            pieces = sim.fill_prefill(inst, unit, self.K, per_request=self.chunk_size)
            if pieces:
                self._last_prefill[key] = True
                return Batch(prefill=pieces)
        self._last_prefill[key] = False
        return Batch(decode=True) if u.n_decoding else None
