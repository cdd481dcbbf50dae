"""Block-level prefix KV cache of a prefill DP unit (vLLM / SGLang style, Mooncake's 512-token blocks).

Granularity: DP-attention units each hold their own KV, so the cache is per DP unit (PBAA's L_hit(r, d));
a router that sees per instance reads the best of its units. A request's prompt is a chain of block
hashes; its hit is the longest prefix of the chain the unit holds, in tokens min(block_tokens x blocks,
prompt - 1) (the last prompt token is always computed, so the pass yields the first output token).

Life cycle (prefill.py): the hit is looked up when the request is dispatched to the unit, and its
blocks are locked there (not evictable) until its prefill completes; at that pass end the whole chain
enters the cache (blocks enter when their pass completes, not before), then the lock is released.
Capacity is in tokens (every block counts as `block_tokens`, the last partial one too); eviction is
`lru` (touching a chain deepest block first, so the parent stays more recent than its children and a
chain is evicted from its tail, as a radix tree evicts leaves), `fifo` (insertion order, hits do not
refresh), or `belady` (hindsight: evicts the block whose next use, in request order, is furthest away;
the headroom row of the prefix board). An optional host-DRAM tier (Mooncake's pool) takes what HBM
evicts; a hit there costs a transfer at `host_cache_gbps` before the request's first pass.

Memory is bounded by the capacities (blocks held) and the locks of requests in flight, never by the
trace length; a Belady cache keeps one heap entry per touch, compacted when it doubles.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .validation import ConfigError

EVICTIONS = ("lru", "fifo", "belady")


@dataclass(frozen=True)
class BlockSetup:
    """What every DP unit's cache of one prefill pool is built with (the engine derives it from the config)."""

    capacity_tokens: int
    block_tokens: int
    eviction: str
    host_tokens: int = 0
    host_s_per_token: float = 0.0  # host -> HBM transfer seconds per KV token of a host-tier hit
NEVER = 1 << 62  # next use of a block no later request needs


def next_uses(block_ids: np.ndarray, block_off: np.ndarray) -> np.ndarray:
    """For each position of the flat block array: the index of the next request whose chain holds the same
    block (NEVER if none). Belady's eviction key; one backward pass."""
    n = block_off.shape[0] - 1
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(block_off))
    out = np.full(block_ids.shape[0], NEVER, dtype=np.int64)
    seen: dict[int, int] = {}
    ids, own = block_ids.tolist(), owner.tolist()
    for j in range(len(ids) - 1, -1, -1):
        b = ids[j]
        nxt = seen.get(b)
        if nxt is not None:
            out[j] = nxt
        seen[b] = own[j]
    return out


def sequential_hit_tokens(block_ids: np.ndarray, block_off: np.ndarray, prompt: np.ndarray, block_tokens: int) -> np.ndarray:
    """Hit tokens of each request replayed in order through one unbounded cache: the ideal a cluster-wide
    cache could serve (the `recomputed_tokens` metric counts what a run recomputes beyond it)."""
    seen: set[int] = set()
    out = np.zeros(prompt.shape[0], dtype=np.int64)
    ids, off = block_ids.tolist(), block_off.tolist()
    for i in range(prompt.shape[0]):
        chain = ids[off[i]:off[i + 1]]
        m = 0
        for b in chain:
            if b not in seen:
                break
            m += 1
        out[i] = min(m * block_tokens, int(prompt[i]) - 1)
        seen.update(chain)
    return out


class BlockTier:
    """One tier (HBM or host DRAM) of one unit: a set of block hashes under a capacity and an eviction rule."""

    __slots__ = ("belady", "bit", "capacity", "evictions", "heap", "index", "keys", "locks", "lru", "order")

    def __init__(self, capacity_blocks: int, eviction: str):
        self.capacity = capacity_blocks
        self.lru = eviction == "lru"
        self.belady = eviction == "belady"
        self.order: OrderedDict[int, int] = OrderedDict()  # block -> next use (belady) / 0
        self.heap: list[tuple[int, int]] = []  # belady: (-next use, block), stale entries skipped
        self.locks: dict[int, int] = {}  # block -> requests in flight that count on it
        self.evictions = 0
        self.index: dict[int, int] | None = None  # block -> bit mask of the units holding it (UnitsIndex), once built
        self.bit = 0  # this unit's bit in that index

    def attach(self, index: dict[int, int], bit: int) -> None:
        """Record this tier's blocks in `index` under `bit`, and keep them there as blocks enter and leave."""
        self.index, self.bit = index, bit
        for b in self.order:
            index[b] = index.get(b, 0) | bit

    def _unindex(self, b: int) -> None:
        index = self.index
        m = index[b] & ~self.bit
        if m:
            index[b] = m
        else:
            del index[b]

    def __contains__(self, b: int) -> bool:
        return b in self.order

    def __len__(self) -> int:
        return len(self.order)

    def touch(self, b: int, nxt: int) -> None:
        """A hit on a held block: refresh its recency (lru) or its next use (belady)."""
        if self.lru:
            self.order.move_to_end(b)
        elif self.belady:
            self.order[b] = nxt
            heapq.heappush(self.heap, (-nxt, b))

    def put(self, b: int, nxt: int, evicted: list[tuple[int, int]]) -> None:
        """Hold block `b` (refresh it if held); evict past the capacity, appending (victim, its next use)."""
        order = self.order
        if b in order:
            self.touch(b, nxt)
            return
        order[b] = nxt
        index = self.index
        if index is not None:
            index[b] = index.get(b, 0) | self.bit
        if self.belady:
            heapq.heappush(self.heap, (-nxt, b))
        while len(order) > self.capacity:
            v = self._victim()
            if v is None:
                break  # every block is locked by requests in flight: the tier runs over until they finish
            evicted.append((v, order.pop(v)))
            if index is not None:
                self._unindex(v)
            self.evictions += 1

    def _victim(self) -> int | None:
        order, locks = self.order, self.locks
        if self.belady:
            heap, skipped, v = self.heap, [], None
            while heap:
                key, b = heapq.heappop(heap)
                if order.get(b) != -key:
                    continue  # stale: touched since, or gone
                if b in locks:
                    skipped.append((key, b))
                    continue
                v = b
                break
            for e in skipped:
                heapq.heappush(heap, e)
            if len(heap) > 4 * len(order) + 64:
                self.heap = [(-nx, b) for b, nx in order.items()]
                heapq.heapify(self.heap)
            return v
        for _ in range(len(order)):
            b = next(iter(order))
            if b not in locks:
                return b
            order.move_to_end(b)  # locked: pass over it (it is in use, hence recent)
        return None

    def clear(self) -> None:
        if self.index is not None:
            for b in self.order:
                self._unindex(b)
        self.order.clear()
        self.heap.clear()
        self.locks.clear()


class UnitCache:
    """The prefix cache of one DP unit: an HBM tier and an optional host-DRAM tier."""

    __slots__ = ("block_tokens", "hbm", "host", "inserted")

    def __init__(self, capacity_tokens: int, block_tokens: int, eviction: str, host_tokens: int = 0):
        self.block_tokens = block_tokens
        self.hbm = BlockTier(capacity_tokens // block_tokens, eviction)
        self.host = BlockTier(host_tokens // block_tokens, eviction) if host_tokens > 0 else None
        self.inserted = 0  # blocks that entered HBM

    def match(self, chain: list[int]) -> tuple[int, int]:
        """(blocks of the chain's longest cached prefix, how many of them only the host tier holds)."""
        hbm, host = self.hbm, self.host
        m = h = 0
        for b in chain:
            if b in hbm:
                m += 1
            elif host is not None and b in host:
                m += 1
                h += 1
            else:
                break
        return m, h

    def lock(self, chain: list[int], nxt: list[int]) -> None:
        """A request counts on these (matched) blocks: refresh them deepest first and pin them in HBM or host."""
        for tier in (self.hbm, self.host):
            if tier is None:
                continue
            locks = tier.locks
            for k in range(len(chain) - 1, -1, -1):
                b = chain[k]
                if b in tier:
                    tier.touch(b, nxt[k])
                    locks[b] = locks.get(b, 0) + 1

    def unlock(self, chain: list[int]) -> None:
        for tier in (self.hbm, self.host):
            if tier is None:
                continue
            locks = tier.locks
            for b in chain:
                c = locks.get(b)
                if c is not None:
                    if c <= 1:
                        del locks[b]
                    else:
                        locks[b] = c - 1

    def admit(self, chain: list[int], nxt: list[int]) -> None:
        """A prefill completed: its whole chain enters HBM (deepest block first); what HBM evicts goes to host."""
        evicted: list[tuple[int, int]] = []
        hbm = self.hbm
        before = len(hbm)
        for k in range(len(chain) - 1, -1, -1):
            hbm.put(chain[k], nxt[k], evicted)
        self.inserted += len(hbm) - before + len(evicted)
        if self.host is not None:
            spill: list[tuple[int, int]] = []
            for b, nx in evicted:
                self.host.put(b, nx, spill)

    def clear(self) -> None:
        """The unit failed: its HBM is gone (the host pool survives, Mooncake's point)."""
        self.hbm.clear()
        if self.host is not None:
            self.host.locks.clear()


class UnitsIndex:
    """Which DP units of one instance hold each block, as a bit mask per block and tier, kept current by the
    tiers once built: matching a prompt against all the units walks its chain once (while some unit still
    matches), not once per unit, and names only the units that hold part of it."""

    __slots__ = ("hbm", "host", "n")

    def __init__(self, caches: list[UnitCache]):
        self.n = len(caches)
        self.hbm: dict[int, int] = {}
        self.host: dict[int, int] = {}
        for u, c in enumerate(caches):
            c.hbm.attach(self.hbm, 1 << u)
            if c.host is not None:
                c.host.attach(self.host, 1 << u)

    def matches(self, chain: list[int]) -> list[tuple[int, int, int]]:
        """UnitCache.match of every unit at once, grouped: (bit mask of units, blocks matched, host-only blocks)
        for each group of units with the same match; units matching nothing are in no group. The walk costs
        bit operations per block of the longest match, a step per unit only for host-tier hits."""
        hbm, host = self.hbm, self.host
        out: list[tuple[int, int, int]] = []
        on_host: dict[int, int] = {}  # unit -> host-only blocks so far (units with none are absent)
        alive = (1 << self.n) - 1
        k = 0
        for b in chain:
            h = hbm.get(b, 0)
            o = host.get(b, 0) & ~h if host else 0
            gone = alive & ~(h | o)
            if gone and k:
                _settle(gone, k, on_host, out)
            alive &= h | o
            if not alive:
                return out
            o &= alive
            while o:
                low = o & -o
                u = low.bit_length() - 1
                on_host[u] = on_host.get(u, 0) + 1
                o ^= low
            k += 1
        if k:
            _settle(alive, k, on_host, out)
        return out


def _settle(units: int, k: int, on_host: dict[int, int], out: list[tuple[int, int, int]]) -> None:
    """The units of mask `units` matched k blocks: one group, less the units with host-tier blocks (one each)."""
    for u in [u for u in on_host if units >> u & 1]:
        out.append((1 << u, k, on_host[u]))
        units &= ~(1 << u)
    if units:
        out.append((units, k, 0))


def cache_capacity(cfg_tokens: int | None, kv_tokens: int, reserve: int, block_tokens: int, key: str) -> int:
    """Cache tokens per unit: the configured value, or the KV capacity minus the running KV (`reserve`)."""
    if cfg_tokens is not None:
        if 0 < cfg_tokens < block_tokens:
            raise ConfigError(f"{key}: {cfg_tokens} tokens is smaller than one block ({block_tokens} tokens); "
                              "give at least one block, or 0 to switch the cache off")
        return int(cfg_tokens)
    left = kv_tokens - reserve
    if left < block_tokens:
        raise ConfigError(f"{key}: HBM leaves {max(left, 0)} tokens per DP unit for the prefix cache after the "
                          f"weights and the running KV ({reserve} tokens), less than one block ({block_tokens}); "
                          "set it explicitly (or 0: off)")
    return int(left)
