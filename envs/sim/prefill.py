"""Prefill instances of a disaggregated cluster: state, passes and failures.

A prefill instance is a non-preemptive batch processor of D DP units behind one barrier.
Each unit has a FIFO device queue the scheduler cannot reorder; a pass takes up to
`chunk_tokens` tokens per unit from its queue head (long prompts span several passes).
Per-unit quantities are NumPy vectors updated incrementally, so the load views policies
read cost O(1) Python work per pass.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

import numpy as np

from . import requests as R
from .events import EventKind, PassKind, PrefillEnd
from .prefix_cache import UnitCache, UnitsIndex

if TYPE_CHECKING:  # pragma: no cover
    from .host import Host
    from .prefix_cache import BlockSetup

PREFILL_END, PREFILL_START = int(EventKind.PREFILL_END), int(EventKind.PREFILL_START)
PREFILL_PASS = int(PassKind.PREFILL)


class PrefixCache:
    """Per-DP-unit LRU set of prefix keys: a hit means the prefix's KV is already on that unit."""

    __slots__ = ("entries", "keys")

    def __init__(self, entries: int):
        self.entries = entries
        self.keys: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.keys

    def touch(self, key: int) -> None:
        self.keys[key] = None
        self.keys.move_to_end(key)
        if len(self.keys) > self.entries:
            self.keys.popitem(last=False)


class PrefillInstance:
    """One prefill instance; its methods are the engine's transitions for it."""

    HANDLERS = {EventKind.PREFILL_END: "end_pass", EventKind.PREFILL_START: "kick"}  # event kind -> method

    def __init__(self, sim: Host, idx: int, dp: int, chunk_tokens: int, cost, cache_entries: int,
                 batch_form_s: float = 0.0, dp_dispatch: str = "least_loaded", blocks: BlockSetup | None = None):
        self.sim = sim
        self.idx = idx
        self.dp = dp
        self.chunk_tokens = chunk_tokens
        self.cost = cost
        self.up = True  # ground truth; the scheduler sees sim.prefill_healthy
        self.busy = False
        self.start_queued = False  # a PREFILL_START event is on the heap
        self.epoch = 0  # bumped on failure so a lost pass's end event is ignored
        self.queues = [deque() for _ in range(dp)]
        self.queued_tokens = np.zeros(dp, dtype=np.int64)  # R_queued: on the device, not in a pass
        self.inflight_tokens = np.zeros(dp, dtype=np.int64)  # dispatched, still on the wire
        self.running_tokens = np.zeros(dp, dtype=np.int64)  # tokens of the pass in progress
        self.reported = np.zeros(dp, dtype=np.int64)  # EndForward payload: tokens left per unit at the pass end
        self.batch_form_s = batch_form_s  # hold before a pass that continues queued work (config.py)
        self.dp_dispatch = dp_dispatch  # unit for a request sent without one (config.py)
        self.rr_unit = 0
        self.depth = 0  # requests on the wire, queued or in the pass
        self.pass_start = 0.0
        self.pass_end = 0.0
        self.last_fwd = float("nan")
        self.n_passes = 0
        self.completing: list[int] = []  # requests whose prefill ends with the current pass
        self.lost: list[int] = []  # requests stranded by a failure, returned once it is detected
        self.caches = [PrefixCache(cache_entries) for _ in range(dp)] if cache_entries > 0 else None
        # prefix-block KV caches, one per DP unit (prefix_cache.py), when the requests carry block hashes
        self.blocks = blocks
        self.bcaches = None if blocks is None else [
            UnitCache(blocks.capacity_tokens, blocks.block_tokens, blocks.eviction, blocks.host_tokens)
            for _ in range(dp)]
        self.index: UnitsIndex | None = None  # which units hold which block: built by the first cache_matches
        self.host_load: dict[int, float] = {}  # request -> seconds to load its host-tier hit before its first pass
        self.locked: dict[int, int] = {}  # request -> blocks it locked on its unit (matched at dispatch)
        self._zeros = np.zeros(dp)

    def pick_unit(self) -> int:
        """The engine's own DP unit for a request the scheduler sent without one."""
        if self.dp_dispatch == "round_robin":
            self.rr_unit = (self.rr_unit + 1) % self.dp
            return (self.rr_unit - 1) % self.dp
        load = self.load_tokens().tolist()  # min + index over a short list beats np.argmin; same first minimum
        return load.index(min(load))

    def load_tokens(self) -> np.ndarray:
        """Tokens each DP unit still has to process (wire + queue + current pass)."""
        return self.queued_tokens + self.inflight_tokens + self.running_tokens

    def chain(self, rid: int) -> list[int]:
        """The prefix-block hashes of request `rid`'s prompt."""
        req = self.sim.req
        return req.block_ids[req.block_off[rid]:req.block_off[rid + 1]].tolist()

    def cache_matches(self, rid: int) -> list[tuple[int, int, int]]:
        """cache_hits grouped: (bit mask of DP units, hit tokens, host tokens) per group of units with the same
        hit, the units that hold none of `rid`'s prompt last (left out when there are none). One walk of the chain
        over an index of the units' blocks (built on the first call, then kept by the caches): no step per unit."""
        full = (1 << self.dp) - 1
        if self.bcaches is None:
            return [(full, 0, 0)]
        if self.index is None:
            self.index = UnitsIndex(self.bcaches)
        cap = int(self.sim.req.work[rid]) - 1
        bt = self.blocks.block_tokens
        out, rest = [], full
        for mask, m, h in self.index.matches(self.chain(rid)):
            hit = min(m * bt, cap)
            out.append((mask, hit, min(h * bt, hit)))
            rest &= ~mask
        if rest:
            zero = min(0, cap)
            out.append((rest, zero, min(0, zero)))
        return out

    def cache_hits(self, rid: int) -> tuple[list[int], list[int]]:
        """Per DP unit: prompt tokens of `rid` its prefix-block cache would serve now, and how many of them sit
        in the host tier (to be loaded). Zeros without block caches."""
        hits, host = [0] * self.dp, [0] * self.dp
        for mask, h, s in self.cache_matches(rid):
            while mask:
                low = mask & -mask
                u = low.bit_length() - 1
                hits[u], host[u] = h, s
                mask ^= low
        return hits, host

    def cache_fill(self) -> list[float]:
        """Per DP unit: the fraction of the HBM prefix-cache capacity in use (empty without block caches)."""
        if self.bcaches is None:
            return []
        return [len(c.hbm) / max(c.hbm.capacity, 1) for c in self.bcaches]

    def prefix_hit(self, rid: int, dp: int) -> int:
        """Prompt tokens of `rid` that the prefix cache of unit `dp` would serve now."""
        if self.bcaches is not None:
            return self.cache_hits(rid)[0][dp]
        req = self.sim.req
        key = int(req.prefix_key[rid])
        if self.caches is None or key < 0 or key not in self.caches[dp]:
            return 0
        return min(int(req.prefix_len[rid]), int(req.work[rid]) - 1)

    # ------------------------------------------------------------------ transitions
    def accept(self, rid: int, dp: int | None) -> int:
        """A dispatch to unit `dp` (None: the least-loaded unit) leaves the scheduler; returns the unit."""
        req = self.sim.req
        if dp is None:
            dp = self.pick_unit()
        work = req.work[rid]
        if self.caches is not None and req.prefix_key[rid] >= 0 and req.done[rid] == 0:
            cache = self.caches[dp]
            key = int(req.prefix_key[rid])
            if key in cache:
                hit = min(int(req.prefix_len[rid]), int(work) - 1)
                req.cached[rid] = hit
                req.work[rid] = work = work - hit
            cache.touch(key)
        elif self.bcaches is not None and req.done[rid] == 0:
            work = self._match_blocks(rid, dp, int(work))
        self.inflight_tokens[dp] += work
        self.depth += 1
        return dp

    def _match_blocks(self, rid: int, dp: int, work: int) -> int:
        """Dispatch to unit `dp`: the cached prefix comes off the work and its blocks are locked there."""
        req = self.sim.req
        lo, hi = int(req.block_off[rid]), int(req.block_off[rid + 1])
        chain = req.block_ids[lo:hi].tolist()
        cache = self.bcaches[dp]
        m, h = cache.match(chain)
        if m == 0:
            return work
        bt = self.blocks.block_tokens
        hit = min(m * bt, work - 1)
        req.cached[rid] = hit
        cache.lock(chain[:m], req.block_next[lo:lo + m].tolist())
        self.locked[rid] = m
        if h:
            self.host_load[rid] = min(h * bt, hit) * self.blocks.host_s_per_token
        req.work[rid] = work - hit
        return work - hit

    def _admit_blocks(self, rid: int) -> None:
        """Its prefill completed: its chain enters its unit's cache, and its locks are released."""
        req = self.sim.req
        lo, hi = int(req.block_off[rid]), int(req.block_off[rid + 1])
        chain = req.block_ids[lo:hi].tolist()
        cache = self.bcaches[int(req.prefill_dp[rid])]
        cache.admit(chain, req.block_next[lo:hi].tolist())
        m = self.locked.pop(rid, 0)
        if m:
            cache.unlock(chain[:m])

    def arrive(self, rid: int) -> None:
        """The dispatched request reaches the device (or is refused by a dead instance)."""
        sim = self.sim
        req = sim.req
        dp = int(req.prefill_dp[rid])
        work = int(req.work[rid])
        self.inflight_tokens[dp] -= work
        if not self.up:  # connection refused: back to the scheduler, which now knows the instance is down
            self.depth -= 1
            if sim.prefill_healthy[self.idx]:  # a refusal is a health report: hold, don't bounce again
                sim.set_healthy(self.idx, False)
                sim.call("prefill", "on_topology_change")
            sim.bounce(rid)
            return
        req.state[rid] = R.PREFILL
        req.dev_arrive[rid] = sim.now
        self.queues[dp].append(rid)
        self.queued_tokens[dp] += work
        if not self.busy and not self.start_queued:
            # Start after every arrival of this instant is queued: a batch sent at once runs as one pass.
            self.start_queued = True
            sim.push(sim.now, PREFILL_START, self)

    def kick(self, _: object = None) -> None:
        """PREFILL_START: start a pass if the instance is up, idle and has queued work."""
        self.start_queued = False
        if self.up and not self.busy and self.queued_tokens.any():
            self.start_pass()

    def start_pass(self) -> None:
        """Each DP unit takes up to chunk_tokens from its queue head (gated, FIFO)."""
        sim = self.sim
        req = sim.req
        dp = self.dp
        chunk = self.chunk_tokens
        tokens = np.zeros(dp)
        attn = np.zeros(dp)
        ends = np.zeros(dp)  # prompts whose last token is in this pass: each runs the LM head
        load = self.host_load
        load_s = 0.0  # host-tier KV loads of requests starting here, serialised before the pass (no overlap)
        completing = []
        now = sim.now
        work, prompt, done = req.work, req.prompt, req.done
        for d in range(dp):
            q = self.queues[d]
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
                    req.start_prefill(rid, now)
                    if load:
                        load_s = max(load_s, load.pop(rid, 0.0))
                if take == rem:
                    n_done += 1
                if cap == 0:
                    break
            for _ in range(n_done):
                completing.append(q.popleft())
            tokens[d] = tok
            attn[d] = at
            ends[d] = n_done
        self.queued_tokens -= tokens.astype(np.int64)
        self.running_tokens[:] = tokens
        z = self._zeros
        kernel = self.cost.prefill_kernel  # engine=numba: pass_time's compiled twin (compiled.py), same value
        dur = (self.cost.pass_time(tokens, attn, z, z, ends) if kernel is None else kernel(tokens, attn, ends)) + load_s
        self.busy = True
        self.pass_start = now
        self.pass_end = now + dur
        self.completing = completing
        tot = float(tokens.sum())
        sim.record_pass(PREFILL_PASS, self, dur, tot, len(completing), 0, 0, tot / (dp * chunk), tokens, z, z)
        sim.push(now + dur, PREFILL_END, PrefillEnd(self, self.epoch))

    def end_pass(self, epoch: int) -> None:
        """PREFILL_END: the pass's finished prompts move on; EndForward goes to the scheduler (unless dropped)."""
        if epoch != self.epoch:
            return  # the pass died with its instance
        sim = self.sim
        self.busy = False
        self.running_tokens[:] = 0
        self.n_passes += 1
        fwd = sim.now - self.pass_start
        self.last_fwd = fwd
        if self.bcaches is not None:
            for rid in self.completing:
                self._admit_blocks(rid)
        for rid in self.completing:
            self.depth -= 1
            sim.prefill_done(rid)
        self.completing = []
        self.reported[:] = self.queued_tokens  # the EndForward payload: work left on each unit
        if self.queued_tokens.any():
            if self.batch_form_s > 0 and (self.queued_tokens < self.chunk_tokens).any():
                # batch-forming step: a release sent on this EndForward reaches the idle units in time
                self.start_queued = True
                sim.push(sim.now + self.batch_form_s, PREFILL_START, self)
            else:
                self.start_pass()
        sim.pass_ended(PREFILL_PASS, self.idx)
        sim.end_forward(self.idx, fwd)

    def take_down(self) -> list[int]:
        """Failure or scale-down: the pass and queues are lost; returns the stranded requests."""
        self.up = False
        self.busy = False
        self.epoch += 1
        stranded = list(self.completing)
        for q in self.queues:
            stranded.extend(q)
            q.clear()
        self.completing = []
        self.depth -= len(stranded)
        self.queued_tokens[:] = 0
        self.running_tokens[:] = 0
        if self.bcaches is not None:
            for c in self.bcaches:
                c.clear()
            self.locked.clear()
            self.host_load.clear()
        return stranded
