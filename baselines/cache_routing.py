"""Cache-aware prefill routers of production systems (ALGORITHMS.md-style notes in docs/prefix_cache.md).

Each dispatches every arrival at once, like the classic dispatchers (dispatch.py), but reads the
prefill units' prefix-block caches (envs/sim/prefix_cache.py) or its own record of what it routed:

- `cache_ttft`  Mooncake's Conductor (Qin et al., FAST'25, s5): the (instance, DP unit) with the lowest
  estimated TTFT = the rest of the pass in progress + (the unit's queued tokens + the prompt's uncached
  tokens) / chunk x the instance's recent pass time + the host-tier load of its hit. The pass time is
  an average of the instance's EndForward times (the full-chunk pass time of the cost model before
  any): Conductor's profile of prefill time, measured online, so it carries the barrier and the
  attention over long contexts that a token count misses. It reads the true caches.
- `sglang_cache`  the SGLang router's cache_aware policy (sgl-router, cache_aware.rs): an approximate
  tree of the prompts it sent to each instance (not the true cache); when the load (requests in
  flight) is imbalanced (max - min > balance_abs_threshold and max > balance_rel_threshold x min)
  it sends to the least loaded; else to the instance with the longest match when the match covers
  more than cache_threshold of the prompt, else to the instance with the smallest tree. It sees
  instances, not DP units: the engine places the request on a unit (cluster.prefill.dp_dispatch).
- `dynamo_kv`  NVIDIA Dynamo's KV router (KvScheduler): the worker (here a DP unit, as Dynamo's KV
  events carry the dp rank) minimising overlap_weight x prefill blocks + active blocks, with weight
  1 and temperature 0 (argmin); prefill blocks = the unit's queued tokens plus the prompt's uncached
  tokens, active blocks = the unit's queued tokens plus the prompt, in blocks, from the true caches.
- `preble_e2`  Preble's E2 (Srivatsa et al., ICLR'25, s4): exploit when some unit's cached prefix is longer
  than the prompt's missing part (the unit with the longest hit, ties least loaded), else explore: the
  unit of least cost L + M + P, L its outstanding prefill tokens (Preble's load over a recent window), M the
  tokens its cache must evict to take the prompt's new blocks, P the prompt's uncached tokens there.
- `prefix_hash`  session affinity: rendezvous hashing of the first `prefix_blocks` block hashes over the
  healthy (instance, unit) pairs (consistent: a failed instance only moves its own keys). On the
  Mooncake trace every prompt starts with the same block, so one block would send all to one unit.

Requests without block hashes go to the unit with the fewest outstanding tokens.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from pdgym.envs.sim.validation import check, check_float, is_num

from .dispatch import ImmediateDispatch
from .registry import register


class UnitDispatch(ImmediateDispatch):
    """Immediate dispatch to an (instance, DP unit) pair (dp None: the engine's choice)."""

    def reset(self, sim) -> None:
        super().reset(sim)
        self._t_full: dict[int, float] = {}
        self._t_pass: dict[int, float] = {}

    def choose_unit(self, sim, rid: int, healthy: list[int]) -> tuple[int, int | None]:  # pragma: no cover
        raise NotImplementedError

    def on_arrival(self, sim, rid: int) -> None:
        healthy = sim.healthy_prefill()
        if healthy:
            inst, dp = self.choose_unit(sim, rid, healthy)
            sim.dispatch(rid, inst, dp)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        """Recent pass time per instance: an exponential average of its EndForward times (weight 1/8)."""
        t = self._t_pass.get(inst)
        self._t_pass[inst] = fwd_time if t is None else t + (fwd_time - t) / 8.0

    def t_pass(self, sim, inst: int) -> float:
        t = self._t_pass.get(inst)
        return self.t_full(sim, inst) if t is None else max(t, 0.0)

    def t_full(self, sim, inst: int) -> float:
        """Seconds of a pass whose every unit runs a full chunk (the offline profile Conductor keeps)."""
        t = self._t_full.get(inst)
        if t is None:
            P = sim.prefill[inst]
            full = np.full(P.dp, float(P.chunk_tokens))
            z = np.zeros(P.dp)
            t = self._t_full[inst] = float(P.cost.pass_time(full, full * full / 2, z, z))
        return t

    def backlog(self, sim, inst: int) -> np.ndarray:
        """Tokens each unit of `inst` still has to start (on the wire and queued; the running pass apart)."""
        P = sim.prefill[inst]
        return P.queued_tokens + P.inflight_tokens

    def argmin_unit(self, sim, rid: int, healthy: list[int], keys, by_backlog=None) -> tuple[int, int]:
        """The (instance, unit) whose key is least: `keys(i, instance, units, hits, host, backlog)` gives one tuple
        per unit of `units` (hits and host indexed by unit); ties go to a rotating instance, then the lower unit.
        by_backlog(i, instance) True: among units of equal hit the key grows strictly with the backlog, so only
        the least backlogged unit (the lower among equals) of each group of PrefillFacade.cache_matches is keyed:
        a few keys per instance, not one per unit."""
        best, n = None, len(healthy)
        for i in healthy:
            P = sim.prefill[i]
            back = self.backlog(sim, i)
            if by_backlog is not None and by_backlog(i, P):
                units, hits, host = [], {}, {}
                load = back.tolist()
                for mask, h, s in P.cache_matches(rid):
                    low = mask & -mask
                    d = low.bit_length() - 1
                    mask ^= low
                    while mask:  # units in ascending order: strict < keeps the lower among equals
                        low = mask & -mask
                        u = low.bit_length() - 1
                        if load[u] < load[d]:
                            d = u
                        mask ^= low
                    units.append(d)
                    hits[d], host[d] = h, s
            else:
                units = range(P.dp)
                hits, host = P.cache_hits(rid)
            for d, k in zip(units, keys(i, P, units, hits, host, back)):
                key = (*k, (i - self._turn) % n, d)
                if best is None or key < best[0]:
                    best = (key, i, d)
        self._turn += 1
        return best[1], best[2]

    def least_tokens(self, sim, healthy: list[int]) -> tuple[int, int]:
        best = None
        for i in healthy:
            load = sim.prefill[i].load_tokens()
            d = int(np.argmin(load))
            key = (int(load[d]), (i - self._turn) % len(healthy))
            if best is None or key < best[0]:
                best = (key, i, d)
        self._turn += 1
        return best[1], best[2]


def _has_blocks(sim) -> bool:
    return sim.req.block_ids is not None


@register("prefill", "cache_ttft")
class CacheTTFT(UnitDispatch):
    """Mooncake Conductor: the unit with the lowest estimated TTFT (queue + uncached prefill + host load)."""

    def choose_unit(self, sim, rid: int, healthy: list[int]) -> tuple[int, int]:
        now, work = sim.now, int(sim.req.work[rid])

        def keys(i: int, P, units, hits, host, back) -> list[tuple]:
            t_pass, chunk = self.t_pass(sim, i), P.chunk_tokens
            wait = max(P.pass_end - now, 0.0) if P.busy else 0.0
            s_tok = P.blocks.host_s_per_token if P.blocks is not None else 0.0
            return [(wait + (int(back[d]) + work - hits[d]) / chunk * t_pass + host[d] * s_tok, -hits[d])
                    for d in units]

        # the backlog's weight is t_pass / chunk: with a positive pass time the key grows with the backlog
        return self.argmin_unit(sim, rid, healthy, keys, lambda i, P: self.t_pass(sim, i) > 0.0)


@register("prefill", "dynamo_kv")
class DynamoKV(UnitDispatch):
    """Dynamo's KV router: argmin over units of overlap_weight x prefill blocks + active blocks."""

    def __init__(self, overlap_weight: float = 1.0):
        self.overlap_weight = check_float(overlap_weight, "policy.prefill.overlap_weight", 0.0, 1e6)

    def choose_unit(self, sim, rid: int, healthy: list[int]) -> tuple[int, int]:
        work, bt, w = int(sim.req.work[rid]), sim.block_tokens or 512, self.overlap_weight

        def keys(i: int, P, units, hits, host, back) -> list[tuple]:
            return [(w * (int(back[d]) + work - hits[d]) / bt + (int(back[d]) + work) / bt,) for d in units]

        return self.argmin_unit(sim, rid, healthy, keys, lambda i, P: True)  # (back + work) / bt: grows with back


@register("prefill", "sglang_cache")
class SGLangCacheAware(UnitDispatch):
    """The SGLang router's cache_aware policy over instances, on its own approximate record of routed prompts."""

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, max_tree_tokens: int = 2**26):
        self.cache_threshold = check_float(cache_threshold, "policy.prefill.cache_threshold", 0.0, 1.0)
        check(is_num(balance_abs_threshold) and balance_abs_threshold >= 0, "policy.prefill.balance_abs_threshold",
              f"got {balance_abs_threshold!r}; must be >= 0 (requests)")
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = check_float(balance_rel_threshold, "policy.prefill.balance_rel_threshold", 1.0, 1e6)
        check(isinstance(max_tree_tokens, int) and max_tree_tokens >= 1, "policy.prefill.max_tree_tokens",
              f"got {max_tree_tokens!r}; must be an integer >= 1")
        self.max_tree_tokens = max_tree_tokens

    def reset(self, sim) -> None:
        super().reset(sim)
        self.trees: dict[int, OrderedDict[int, None]] = {}

    def choose_unit(self, sim, rid: int, healthy: list[int]) -> tuple[int, int | None]:
        if not _has_blocks(sim):
            return self.least_tokens(sim, healthy)[0], None
        req = sim.req
        chain = req.block_ids[req.block_off[rid]:req.block_off[rid + 1]].tolist()
        loads = {i: sim.prefill[i].depth for i in healthy}
        hi, lo = max(loads.values()), min(loads.values())
        n = len(healthy)
        self._turn += 1
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            pick = min(healthy, key=lambda i: (loads[i], (i - self._turn) % n))
        else:
            match = {}
            for i in healthy:
                tree = self.trees.get(i, ())
                m = 0
                for b in chain:
                    if b not in tree:
                        break
                    m += 1
                match[i] = m
            best = max(healthy, key=lambda i: (match[i], -loads[i], -((i - self._turn) % n)))
            bt = sim.block_tokens
            if min(match[best] * bt, int(req.prompt[rid])) / int(req.prompt[rid]) > self.cache_threshold:
                pick = best
            else:
                pick = min(healthy, key=lambda i: (len(self.trees.get(i, ())), (i - self._turn) % n))
        self._insert(pick, chain, sim.block_tokens)
        return pick, None

    def _insert(self, inst: int, chain: list[int], block_tokens: int) -> None:
        tree = self.trees.setdefault(inst, OrderedDict())
        for b in reversed(chain):
            tree[b] = None
            tree.move_to_end(b)
        cap = max(self.max_tree_tokens // max(block_tokens, 1), 1)
        while len(tree) > cap:
            tree.popitem(last=False)


@register("prefill", "preble_e2")
class PrebleE2(UnitDispatch):
    """Preble's E2: exploit a long cached prefix, else explore by load + eviction + prefill cost."""

    def choose_unit(self, sim, rid: int, healthy: list[int]) -> tuple[int, int]:
        work = int(sim.req.work[rid])
        hit_max = max(max(sim.prefill[i].cache_hits(rid)[0]) for i in healthy)
        bt = sim.block_tokens or 512
        n_blocks = -(-work // bt)

        def keys(i: int, P, units, hits: list[int], host: list[int], back) -> list[tuple]:
            load = P.load_tokens()
            if hit_max > work - hit_max:  # exploit: the cached part outweighs what is missing
                return [(-hits[d], int(load[d])) for d in range(P.dp)]
            out = []
            room = P.cache_free_blocks()
            for d in range(P.dp):
                free = room[d] if room is not None else n_blocks
                new_blocks = n_blocks - hits[d] // bt
                evict = max(new_blocks - free, 0) * bt
                out.append((int(load[d]) + evict + work - hits[d],))
            return out

        return self.argmin_unit(sim, rid, healthy, keys)


@register("prefill", "prefix_hash")
class PrefixHash(UnitDispatch):
    """Session affinity: rendezvous hashing of the first blocks over the healthy (instance, unit) pairs."""

    def __init__(self, prefix_blocks: int = 2):
        check(isinstance(prefix_blocks, int) and prefix_blocks >= 1, "policy.prefill.prefix_blocks",
              f"got {prefix_blocks!r}; must be an integer >= 1")
        self.prefix_blocks = prefix_blocks

    def choose_unit(self, sim, rid: int, healthy: list[int]) -> tuple[int, int]:
        if not _has_blocks(sim):
            return self.least_tokens(sim, healthy)
        req = sim.req
        lo = int(req.block_off[rid])
        key = hash(tuple(req.block_ids[lo:min(lo + self.prefix_blocks, int(req.block_off[rid + 1]))].tolist()))
        return max(((i, d) for i in healthy for d in range(sim.prefill[i].dp)),
                   key=lambda u: _mix(key, u[0], u[1]))


def _mix(key: int, inst: int, unit: int) -> int:
    """A deterministic 64-bit mix of (key, instance, unit) (splitmix64's finaliser; Python's hash of ints is fixed)."""
    x = (key * 0x9E3779B97F4A7C15 + inst * 0xBF58476D1CE4E5B9 + unit * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)
