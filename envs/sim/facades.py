"""Read-only facades of the engine's instances: what `view.prefill[i]`, `view.decode[i]` and `view.colocated[i]` are.

A policy reads an instance through its facade and changes the run only through the view's actions
(view.py). What a facade hands out cannot be written and leads nowhere into the engine by attribute:
- arrays are `seal`ed: read-only arrays over the engine's memory (they follow the run, so reading them
  costs what it did) whose flag cannot be reopened and whose `.base` is an array interface that holds no
  reference to the engine's array (the engine's array is kept alive beside it, in `_KEEP`);
- a facade holds no state of its own: each is the one instance of a class made for it (`build`), whose
  fixed values are class attributes, whose changing scalars are properties and whose queries are plain
  functions, both closing over the instance. Neither `setattr` nor `object.__setattr__` can change it, and
  no method is bound to an engine object (`__self__` is the facade, or absent).
What Python still allows (a class patched, a closure's cells, gc) is listed in docs/architecture.md, "What a
policy cannot do"; tests/test_view_contract.py tries each tamper the view must refuse.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator, Sequence, Set
from operator import attrgetter
from types import MappingProxyType
from typing import Any

import numpy as np

_KEEP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # interface -> the engine array it exposes
_SIGNATURES: dict[Any, inspect.Signature] = {}  # a query's function -> its signature less `self`


class ArrayInterface:
    """The read-only NumPy array interface of one engine array, and nothing else: the `.base` of a sealed array.
    Whatever its slot is set to, the interface it gives says read-only."""

    __slots__ = ("_iface", "__weakref__")

    @property
    def __array_interface__(self) -> dict:
        ptr, shape, strides, typestr = self._iface
        return {"data": (ptr, True), "shape": shape, "strides": strides, "typestr": typestr, "version": 3}


def seal(a: np.ndarray) -> np.ndarray:
    """A read-only array over `a`'s memory (it follows `a`): its writeable flag cannot be reopened and no attribute
    of it or of its `.base` is `a` (measured: 3 us a call, once per array and view at the start of a run)."""
    if a.dtype.hasobject:  # pointers the interface would hand out without their references
        raise TypeError("seal: object arrays are not sealed; hand out a copy")
    iface = ArrayInterface()
    object.__setattr__(iface, "_iface", (a.ctypes.data, a.shape, a.strides, a.dtype.str))
    _KEEP[iface] = a  # the memory lives as long as any sealed array over it
    return np.asarray(iface)


class Frozen:
    """Base of the facades and the view: writes raise (and `build`'s instances hold nothing a write could change)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__}.{name} is read-only: a policy changes the run only through "
                             "the view's actions (dispatch, reject, admit, set_timer, pause)")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)


def live(obj: Any, name: str) -> property:
    """A property reading `obj.name` now (the facade holds no reference to `obj`: the getter's closure does)."""
    get = attrgetter(name)
    return property(lambda _self: get(obj), doc=f"the current {name}")


def query(bound: Callable) -> Callable:
    """`bound` (an engine object's method) as a plain function of the same signature: no `__self__` to follow."""
    fn = bound.__func__
    sig = _SIGNATURES.get(fn)
    if sig is None:
        params = list(inspect.signature(fn).parameters.values())[1:]
        sig = _SIGNATURES[fn] = inspect.Signature(params)

    def call(*args, **kwargs):
        return bound(*args, **kwargs)

    call.__name__, call.__doc__, call.__signature__ = fn.__name__, fn.__doc__, sig
    return call


def build(base: type, values: dict[str, Any], props: dict[str, property] | None = None,
          funcs: dict[str, Callable] | None = None, dunders: dict[str, Callable] | None = None) -> Any:
    """The one instance of a new subclass of `base` whose class holds `values` (attributes), `props` (properties),
    `funcs` (plain functions: no self) and `dunders` (special methods, taking self): no instance state at all."""
    ns: dict[str, Any] = {"__slots__": (), "__module__": base.__module__, "__qualname__": base.__qualname__,
                          "__doc__": base.__doc__, **values, **(props or {}), **(dunders or {})}
    for name, fn in (funcs or {}).items():
        ns[name] = staticmethod(fn)
    return object.__new__(type(base.__name__, (base,), ns))


def seq_view(s) -> Sequence:
    """A read-only sequence over a list or deque the engine keeps changing."""
    return build(SeqView, {}, dunders={
        "__len__": lambda _self: len(s), "__iter__": lambda _self: iter(s), "__getitem__": lambda _self, k: s[k],
        "__contains__": lambda _self, x: x in s, "__repr__": lambda _self: f"SeqView({list(s)!r})"})


def set_view(s: set) -> Set:
    """A read-only set over a set the engine keeps changing."""
    return build(SetView, {}, dunders={
        "__len__": lambda _self: len(s), "__iter__": lambda _self: iter(s), "__contains__": lambda _self, x: x in s,
        "__repr__": lambda _self: f"SetView({set(s)!r})"})


class SeqView(Frozen, Sequence):
    """A read-only sequence over a list or deque the engine keeps changing (`seq_view`)."""

    __slots__ = ()


class SetView(Frozen, Set):
    """A read-only set over a set the engine keeps changing (`set_view`)."""

    __slots__ = ()


class CostQuery(Frozen):
    """An instance's forward-pass time model as a query: `pass_time` answers and leaves the model as it was
    (the engine reads the model's last-call fields after its own calls)."""

    __slots__ = ()

    @staticmethod
    def of(c) -> CostQuery:
        def pass_time(prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends=None) -> float:
            unit, idle = c.last_unit, c.last_idle_frac
            try:
                return c.pass_time(prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends)
            finally:
                c.last_unit, c.last_idle_frac = unit, idle

        return build(CostQuery, {"dp": c.dp}, funcs={"pass_time": pass_time})


class PrefixKeys(Frozen):
    """One DP unit's prefix-key LRU (prefill.PrefixCache), read-only: `key in cache`, `keys` (LRU order)."""

    __slots__ = ()

    @staticmethod
    def of(cache) -> PrefixKeys:
        keys = cache.keys
        return build(PrefixKeys, {"entries": cache.entries, "keys": MappingProxyType(keys)},
                     dunders={"__contains__": lambda _self, key: key in keys})


def _queries(inst, names: tuple[str, ...]) -> dict[str, Callable]:
    return {n: query(getattr(inst, n)) for n in names}


class PrefillFacade(Frozen):
    """A prefill instance (prefill.PrefillInstance) as a policy sees it: `idx`, `dp`, `chunk_tokens`,
    `batch_form_s`, `dp_dispatch`, `blocks`, the token arrays per DP unit (`queued_tokens`, `inflight_tokens`,
    `running_tokens`, `reported`), `caches` (PrefixKeys per unit, or None), `cost` (CostQuery), the live scalars
    `up`, `busy`, `depth`, `pass_start`, `pass_end`, `last_fwd`, `n_passes` and the queries below."""

    __slots__ = ()
    LIVE = ("up", "busy", "depth", "pass_start", "pass_end", "last_fwd", "n_passes")
    QUERIES = ("load_tokens", "chain", "cache_hits", "cache_matches", "cache_fill", "prefix_hit")

    @staticmethod
    def of(inst) -> PrefillFacade:
        """load_tokens(): tokens each DP unit still has to process (a fresh array); chain(rid): the prefix-block
        hashes of `rid`'s prompt; cache_hits(rid) / cache_matches(rid): per unit (grouped) the prompt tokens the
        prefix-block caches would serve now; cache_fill(), cache_blocks(), cache_free_blocks(): the HBM prefix
        caches' use; prefix_hit(rid, dp): tokens unit `dp`'s prefix cache would serve now."""
        bc = inst.bcaches

        def cache_blocks() -> list[int] | None:
            """Per DP unit: HBM prefix-cache blocks in use (None without block caches)."""
            return None if bc is None else [len(c.hbm) for c in bc]

        def cache_free_blocks() -> list[int] | None:
            """Per DP unit: HBM prefix-cache blocks not in use (None without block caches)."""
            return None if bc is None else [c.hbm.capacity - len(c.hbm) for c in bc]

        values = {"idx": inst.idx, "dp": inst.dp, "chunk_tokens": inst.chunk_tokens, "batch_form_s": inst.batch_form_s,
                  "dp_dispatch": inst.dp_dispatch, "blocks": inst.blocks, "cost": CostQuery.of(inst.cost),
                  "caches": None if inst.caches is None else tuple(PrefixKeys.of(c) for c in inst.caches),
                  **{n: seal(getattr(inst, n)) for n in ("queued_tokens", "inflight_tokens", "running_tokens",
                                                         "reported")}}
        return build(PrefillFacade, values, {n: live(inst, n) for n in PrefillFacade.LIVE},
                     {**_queries(inst, PrefillFacade.QUERIES), "cache_blocks": cache_blocks,
                      "cache_free_blocks": cache_free_blocks})


class DecodeFacade(Frozen):
    """A decode instance (decode.DecodeInstance) as a policy sees it: `idx`, `dp`, `batch_limit`, `slots`, the
    arrays per worker `kv_cap`, `batch`, `kv`, `active` (a SetView per worker), `cost`, the live scalars `busy`,
    `steps`, `n_batch`, `n_running`, `step_start`, `step_end`, and the queries `free_slots()` (free batch slots per
    worker, a fresh array) and `fits(load)` (the workers that would admit a request holding `load` KV tokens now:
    the admission rule itself, DecodeInstance.fits, which view.admit applies)."""

    __slots__ = ()
    LIVE = ("busy", "steps", "n_batch", "n_running", "step_start", "step_end")

    @staticmethod
    def of(inst) -> DecodeFacade:
        values = {"idx": inst.idx, "dp": inst.dp, "batch_limit": inst.batch_limit, "slots": inst.slots,
                  "kv_cap": seal(inst.kv_cap), "batch": seal(inst.batch), "kv": seal(inst.kv),
                  "active": tuple(set_view(s) for s in inst.active), "cost": CostQuery.of(inst.cost)}
        return build(DecodeFacade, values, {n: live(inst, n) for n in DecodeFacade.LIVE},
                     _queries(inst, ("free_slots", "fits")))


class UnitFacade(Frozen):
    """A colocated DP unit (colocated.ColocatedUnit) as a policy sees it: `slots`, `kv_cap`, `chunk_tokens`, the
    queues `waiting`, `prefilling` (SeqViews) and `decoding` (a SetView), the live scalars `n_decoding`, `kv_used`,
    `decode_kv`, `n_running`, `steps`, and `free_slots()` (slots not held by a running request)."""

    __slots__ = ()
    LIVE = ("n_decoding", "kv_used", "decode_kv", "n_running", "steps")

    @staticmethod
    def of(unit) -> UnitFacade:
        values = {"slots": unit.slots, "kv_cap": unit.kv_cap, "chunk_tokens": unit.chunk_tokens,
                  "waiting": seq_view(unit.waiting), "prefilling": seq_view(unit.prefilling),
                  "decoding": set_view(unit.decoding)}
        return build(UnitFacade, values, {n: live(unit, n) for n in UnitFacade.LIVE}, _queries(unit, ("free_slots",)))


class ColocatedFacade(Frozen):
    """A colocated instance (colocated.ColocatedInstance) as a policy sees it: `idx`, `dp`, `units` (UnitFacades),
    `cost`, the live scalars `busy`, `iter_start`, `iter_end`, `n_iters`."""

    __slots__ = ()
    LIVE = ("busy", "iter_start", "iter_end", "n_iters")

    @staticmethod
    def of(inst) -> ColocatedFacade:
        values = {"idx": inst.idx, "dp": inst.dp, "units": tuple(UnitFacade.of(u) for u in inst.units),
                  "cost": CostQuery.of(inst.cost)}
        return build(ColocatedFacade, values, {n: live(inst, n) for n in ColocatedFacade.LIVE})
