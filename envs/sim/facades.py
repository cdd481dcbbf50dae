"""Read-only facades of the engine's instances: what `view.prefill[i]`, `view.decode[i]` and `view.colocated[i]` are.

A policy reads an instance through its facade and changes the run only through the view's actions
(view.py). A facade holds no public reference to the engine or to an instance: its arrays are
read-only NumPy views of the instance's own (they follow the run, so reading them costs what it did),
its changing scalars are properties, its queries are methods, its containers read-only wrappers, and
every attribute write raises AttributeError. Names starting with an underscore (the wrapped instance
`_i` among them) are outside the contract: Python cannot hide an object from code that goes looking
(gc, __self__, ...), so the contract is the public names, and tests/test_view_contract.py walks them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from operator import attrgetter
from types import MappingProxyType
from typing import Any

import numpy as np


def read_only(a: np.ndarray) -> np.ndarray:
    """A view of `a` that refuses writes (it follows `a`)."""
    v = a.view()
    v.flags.writeable = False
    return v


class Frozen:
    """Base of the facades: attributes are set once, in __init__ (object.__setattr__); writes raise."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__}.{name} is read-only: a policy changes the run only through "
                             "the view's actions (dispatch, reject, admit, set_timer, pause)")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def _set(self, **values: Any) -> None:
        for k, v in values.items():
            object.__setattr__(self, k, v)


def live(*names: str):
    """Class decorator: a property per name, reading the wrapped instance's current value (`_i.NAME`)."""
    def add(cls: type) -> type:
        for n in names:
            setattr(cls, n, property(attrgetter(f"_i.{n}"), doc=f"the instance's current {n}"))
        return cls
    return add


class SeqView(Frozen, Sequence):
    """A read-only sequence over a list or deque the engine keeps changing."""

    __slots__ = ("_s",)

    def __init__(self, s):
        self._set(_s=s)

    def __len__(self) -> int:
        return len(self._s)

    def __iter__(self) -> Iterator:
        return iter(self._s)

    def __getitem__(self, k):
        return self._s[k]

    def __contains__(self, x) -> bool:
        return x in self._s

    def __repr__(self) -> str:
        return f"SeqView({list(self._s)!r})"


class SetView(Frozen, Set):
    """A read-only set over a set the engine keeps changing."""

    __slots__ = ("_s",)

    def __init__(self, s: set):
        self._set(_s=s)

    def __len__(self) -> int:
        return len(self._s)

    def __iter__(self) -> Iterator:
        return iter(self._s)

    def __contains__(self, x) -> bool:
        return x in self._s

    def __repr__(self) -> str:
        return f"SetView({set(self._s)!r})"


class CostQuery(Frozen):
    """An instance's forward-pass time model as a query: `pass_time` answers and leaves the model as it was
    (the engine reads the model's last-call fields after its own calls)."""

    __slots__ = ("_c", "dp")

    def __init__(self, cost):
        self._set(_c=cost, dp=cost.dp)

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends=None) -> float:
        c = self._c
        unit, idle = c.last_unit, c.last_idle_frac
        try:
            return c.pass_time(prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends)
        finally:
            c.last_unit, c.last_idle_frac = unit, idle


class PrefixKeys(Frozen):
    """One DP unit's prefix-key LRU (prefill.PrefixCache), read-only: `key in cache`, `keys` (LRU order)."""

    __slots__ = ("_c", "entries", "keys")

    def __init__(self, cache):
        self._set(_c=cache, entries=cache.entries, keys=MappingProxyType(cache.keys))

    def __contains__(self, key: int) -> bool:
        return key in self._c.keys


@live("up", "busy", "depth", "pass_start", "pass_end", "last_fwd", "n_passes")
class PrefillFacade(Frozen):
    """A prefill instance (prefill.PrefillInstance) as a policy sees it."""

    __slots__ = ("_i", "idx", "dp", "chunk_tokens", "batch_form_s", "dp_dispatch", "blocks", "queued_tokens",
                 "inflight_tokens", "running_tokens", "reported", "caches", "cost")

    def __init__(self, inst):
        self._set(_i=inst, idx=inst.idx, dp=inst.dp, chunk_tokens=inst.chunk_tokens, batch_form_s=inst.batch_form_s,
                  dp_dispatch=inst.dp_dispatch, blocks=inst.blocks, cost=CostQuery(inst.cost),
                  caches=None if inst.caches is None else tuple(PrefixKeys(c) for c in inst.caches),
                  **{n: read_only(getattr(inst, n)) for n in ("queued_tokens", "inflight_tokens", "running_tokens",
                                                              "reported")})

    def load_tokens(self) -> np.ndarray:
        """Tokens each DP unit still has to process (wire + queue + current pass): a fresh array."""
        return self._i.load_tokens()

    def chain(self, rid: int) -> list[int]:
        """The prefix-block hashes of request `rid`'s prompt."""
        return self._i.chain(rid)

    def cache_hits(self, rid: int) -> tuple[list[int], list[int]]:
        """Per DP unit: prompt tokens of `rid` its prefix-block cache would serve now, and how many sit in the
        host tier (zeros without block caches)."""
        return self._i.cache_hits(rid)

    def cache_matches(self, rid: int) -> list[tuple[int, int, int]]:
        """cache_hits grouped: (bit mask of DP units, hit tokens, host tokens) per group of units with the same
        hit (units holding nothing of the prompt last): no step per unit, for routers that key a group once."""
        return self._i.cache_matches(rid)

    def cache_fill(self) -> list[float]:
        """Per DP unit: the fraction of the HBM prefix-cache capacity in use (empty without block caches)."""
        return self._i.cache_fill()

    def cache_blocks(self) -> list[int] | None:
        """Per DP unit: HBM prefix-cache blocks in use (None without block caches)."""
        bc = self._i.bcaches
        return None if bc is None else [len(c.hbm) for c in bc]

    def cache_free_blocks(self) -> list[int] | None:
        """Per DP unit: HBM prefix-cache blocks not in use (None without block caches)."""
        bc = self._i.bcaches
        return None if bc is None else [c.hbm.capacity - len(c.hbm) for c in bc]

    def prefix_hit(self, rid: int, dp: int) -> int:
        """Prompt tokens of `rid` that the prefix cache of unit `dp` would serve now."""
        return self._i.prefix_hit(rid, dp)


@live("busy", "steps", "n_batch", "n_running", "step_start", "step_end")
class DecodeFacade(Frozen):
    """A decode instance (decode.DecodeInstance) as a policy sees it."""

    __slots__ = ("_i", "idx", "dp", "batch_limit", "slots", "kv_cap", "batch", "kv", "active", "cost")

    def __init__(self, inst):
        self._set(_i=inst, idx=inst.idx, dp=inst.dp, batch_limit=inst.batch_limit, slots=inst.slots,
                  kv_cap=read_only(inst.kv_cap), batch=read_only(inst.batch), kv=read_only(inst.kv),
                  active=tuple(SetView(s) for s in inst.active), cost=CostQuery(inst.cost))

    def free_slots(self) -> np.ndarray:
        """Free batch slots per worker (a fresh array)."""
        return self._i.free_slots()

    def fits(self, load: int) -> np.ndarray:
        """Workers that would admit a request holding `load` KV tokens now (a free slot and room for its KV):
        the admission rule itself (DecodeInstance.fits), which view.admit applies."""
        return self._i.fits(load)


@live("n_decoding", "kv_used", "decode_kv", "n_running", "steps")
class UnitFacade(Frozen):
    """A colocated DP unit (colocated.ColocatedUnit) as a policy sees it."""

    __slots__ = ("_i", "slots", "kv_cap", "chunk_tokens", "waiting", "prefilling", "decoding")

    def __init__(self, unit):
        self._set(_i=unit, slots=unit.slots, kv_cap=unit.kv_cap, chunk_tokens=unit.chunk_tokens,
                  waiting=SeqView(unit.waiting), prefilling=SeqView(unit.prefilling), decoding=SetView(unit.decoding))

    def free_slots(self) -> int:
        """Slots not held by a running request."""
        return self._i.free_slots()


@live("busy", "iter_start", "iter_end", "n_iters")
class ColocatedFacade(Frozen):
    """A colocated instance (colocated.ColocatedInstance) as a policy sees it."""

    __slots__ = ("_i", "idx", "dp", "units", "cost")

    def __init__(self, inst):
        self._set(_i=inst, idx=inst.idx, dp=inst.dp, units=tuple(UnitFacade(u) for u in inst.units),
                  cost=CostQuery(inst.cost))


FACADES: Mapping[str, type] = MappingProxyType({"prefill": PrefillFacade, "decode": DecodeFacade,
                                                 "colocated": ColocatedFacade})
