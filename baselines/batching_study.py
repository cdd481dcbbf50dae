"""Batching policies of the batching study (ALGORITHMS.md section 4) for a colocated instance.

Every policy proposes prompt pieces through `sim.fill_prefill` (running prefills first, then
FIFO admission while slots and KV allow), so admission rules live in one place; the
policies only decide *when* to prefill, how many tokens, and whether decodes step.

- fcfs: process-to-completion, one request at a time (prefill, then all its decode).
- prefill_first: prefill-prioritised batching under a token budget K (decode only when no
  prompt can be admitted); with K = the unit's budget it is vLLM v0 (`v0`).
- fixed: an iteration leaves once the queued token work (decode tokens + prompt tokens) reaches
  b or the oldest queued job has waited `timeout_s`; it serves the queue FIFO up to b tokens.
- dynamic: like fixed, but b grows with the queued token work (thresholds) and a latency
  guard releases early when the oldest job nears its target.
- chunked: each request contributes at most chunk_size tokens per prefill iteration, K in
  total; prefill and decode iterations alternate.
"""

from __future__ import annotations

import math

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import Batch, BatchingPolicy
from pdgym.envs.sim.validation import check_float, check_int

from .registry import register


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
    """Token-work batching (the batching study): the unit idles until its queued token work (one
    token per running decode plus the prompt tokens not yet prefilled) reaches b, or its oldest
    queued job has waited timeout_s; then one iteration serves the queue FIFO up to b tokens.

    Jobs queue in the study's order: a prompt at its arrival, a decode token (and a prompt's next
    chunk) when the previous iteration ends. Prompts that arrived before that end go first (pieces
    up to b tokens, K at most); the decodes step in the same iteration if their tokens still fit
    in b. Otherwise the decodes go first and prompts fill b minus the decodes. Departure: the
    engine steps all running decodes or none, so a batch never splits the decodes (the study's
    queue could). An idle unit sets a timer for its timeout.
    """

    def __init__(self, b: int = 128, timeout_s: float = 0.05, K: int | None = None):
        self.b = check_int(b, "policy.batching.b")
        self.timeout_s = check_float(timeout_s, "policy.batching.timeout_s")
        self.K = check_int(K, "policy.batching.K", allow_none=True)

    def reset(self, sim):
        self._timers: set[float] = set()

    def target(self, queued: int) -> int:
        """Token target b when `queued` tokens of work wait."""
        return self.b

    def next_batch(self, sim, inst, unit):
        C = sim.colocated[inst]
        u = C.units[unit]
        req = sim.req
        n_dec = u.n_decoding
        ready = C.iter_end  # decode tokens and running prompts re-queued when the last iteration ended
        first_prompt = req.dev_arrive[u.waiting[0]] if u.waiting else math.inf
        oldest = min(ready if (n_dec or u.prefilling) else math.inf, first_prompt)
        if oldest == math.inf:
            return None
        queued = n_dec + int(req.work[[*u.prefilling, *u.waiting]].sum())
        b = self.target(queued)
        due = oldest + self.timeout_s
        if queued < b and sim.now < due:
            if due not in self._timers:
                self._timers.add(due)
                sim.set_timer(due, "batching", due)
            return None
        cap = _budget(self.K, u)
        if first_prompt < ready or not n_dec:
            pieces = sim.fill_prefill(inst, unit, min(b, cap))
            tok = sum(t for _, t in pieces)
            decode = n_dec > 0 and tok + n_dec <= b
        else:
            pieces = sim.fill_prefill(inst, unit, min(b - n_dec, cap)) if b > n_dec else []
            decode = True
        if not pieces and not decode:  # nothing admissible fits b beside the decodes: step them alone
            return Batch(decode=True) if n_dec else None
        return Batch(prefill=pieces, decode=decode)

    def on_timer(self, sim, tag):
        self._timers.discard(tag)


@register("batching", "dynamic")
class DynamicBatching(FixedBatching):
    """Token-work batching whose target grows with the queue: b = the tokens of the last
    [queued_tokens, b] threshold whose queued_tokens <= the queued token work; a latency guard
    releases the batch once the oldest queued job has waited guard x ttft_target_s. Defaults are
    the batching study's: b = 32 below 64 queued tokens, 64 below 256, then 128; guard at 80 ms."""

    def __init__(self, thresholds: list | None = None, ttft_target_s: float = 0.1, guard: float = 0.8,
                 K: int | None = None):
        thresholds = [[0, 32], [64, 64], [256, 128]] if thresholds is None else thresholds
        key = "policy.batching.thresholds"
        try:
            pairs = sorted((int(q), int(t)) for q, t in thresholds)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: got {thresholds!r}; must be a list of [queued_tokens, b] pairs") from None
        if not pairs or pairs[0][0] != 0 or any(t < 1 for _, t in pairs):
            raise ConfigError(f"{key}: got {thresholds!r}; the first queued_tokens must be 0 and b >= 1")
        self.thresholds = pairs
        ttft = check_float(ttft_target_s, "policy.batching.ttft_target_s", lo_open=True)
        g = check_float(guard, "policy.batching.guard", 0.0, 1.0, lo_open=True)
        super().__init__(b=pairs[0][1], timeout_s=g * ttft, K=K)
        self.ttft_target_s, self.guard = ttft, g

    def target(self, queued):
        b = self.b
        for depth, tokens in self.thresholds:
            if depth > queued:
                break
            b = tokens
        return b


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
