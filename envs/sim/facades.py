"""Read-only facades of the engine's instances: what `view.prefill[i]`, `view.decode[i]` and `view.colocated[i]` are.

A policy reads an instance through its facade and changes the run only through the view's actions
(view.py). What a facade hands out cannot be written and leads nowhere into the engine by attribute:
- arrays are `seal`ed: read-only arrays over the engine's memory (they follow the run, so reading them
  costs what it did) whose flag cannot be reopened and whose `.base` is an array interface that holds no
  reference to the engine's array (the engine's array is kept alive beside it, in `_KEEP`);
- a facade is the one instance of a class made for it (`frozen`, once per engine instance): its fixed values
  are class attributes (as fast to read as slots), its changing scalars properties and its queries plain
  functions, both closing over the instance, so the facade holds no state: neither `setattr` nor
  `object.__setattr__` can change it, and no attribute (no `_i`, no `__self__`) leads to the instance;
- the small containers (SeqView, SetView, CostQuery, PrefixKeys) are `sealed`: their one private slot has no
  name on the class, so nothing reaches or replaces it by attribute.
What Python still allows (a class patched, gc) is listed in docs/architecture.md, "What a policy cannot do";
tests/test_view_contract.py tries each tamper the view must refuse.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence, Set
from operator import attrgetter
from types import MappingProxyType
from typing import Any

import numpy as np

_KEEP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # interface -> the engine array it exposes
_SLOTS: dict[type, dict[str, Any]] = {}  # a sealed class -> its slot descriptors (taken off the class)
_RECORDS: dict[type, type] = {}  # a dataclass -> the named tuple a view hands out for it
_FACTORIES: dict[Any, Callable] = {}  # a method's function -> what makes its plain-function twin (`query`)


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
    of it or of its `.base` is `a` (measured: 10 us a call, once per array and view at the start of a run)."""
    if a.dtype.hasobject:  # pointers the interface would hand out without their references
        raise TypeError("seal: object arrays are not sealed; hand out a copy")
    iface = ArrayInterface()
    object.__setattr__(iface, "_iface", (a.ctypes.data, a.shape, a.strides, a.dtype.str))
    _KEEP[iface] = a  # the memory lives as long as any sealed array over it
    return np.asarray(iface)


def record(dc: Any) -> Any:
    """A (frozen) dataclass the engine reads, as a named tuple of its fields: the same attributes, and no
    object.__setattr__ reaches it (a frozen dataclass refuses only setattr)."""
    if dc is None:
        return None
    kind = _RECORDS.get(type(dc))
    if kind is None:
        kind = _RECORDS[type(dc)] = namedtuple(type(dc).__name__, [f.name for f in dataclasses.fields(dc)])
    return kind(*(getattr(dc, f) for f in kind._fields))


class Frozen:
    """Base of the facades and the view: attribute writes raise."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__}.{name} is read-only: a policy changes the run only through "
                             "the view's actions (dispatch, reject, admit, set_timer, pause)")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)


def frozen(base: type, values: dict[str, Any], props: dict[str, property] | None = None,
           funcs: dict[str, Callable] | None = None) -> Any:
    """The one instance of a new subclass of `base` whose class holds `values` (attributes), `props` (properties)
    and `funcs` (plain functions, no self): no instance state (measured: 40 us a class)."""
    ns: dict[str, Any] = {"__slots__": (), "__module__": base.__module__, "__qualname__": base.__qualname__,
                          "__doc__": base.__doc__, **values, **(props or {})}
    for name, fn in (funcs or {}).items():
        ns[name] = staticmethod(fn)
    return object.__new__(type(base.__name__, (base,), ns))


def live(obj: Any, *names: str) -> dict[str, property]:
    """A property per name reading `obj.NAME` now (the getter's closure holds `obj`, the class does not)."""
    return {n: property(lambda _self, g=attrgetter(n): g(obj), doc=f"the current {n}") for n in names}


def query(bound: Callable) -> Callable:
    """`bound` (an engine object's method) as a plain function of the same signature: no `__self__` to follow. The
    function is compiled once per method with the method's own parameters (a `*args, **kwargs` forwarder cost 1.2 us a
    call, this one 0.03 us over the method)."""
    fn = getattr(bound, "__func__", bound)  # a plain function: tamper_check.py's wrapper of an action
    factory = _FACTORIES.get(fn)
    if factory is None:
        params = list(inspect.signature(bound).parameters.values())
        defaults = [p.default for p in params if p.default is not p.empty]
        names = [p.name for p in params]
        head = ", ".join(n if p.default is p.empty else f"{n}=_d{i}" for i, (n, p) in enumerate(zip(names, params)))
        src = (f"def factory(_bound, {', '.join(f'_d{i}' for i, p in enumerate(params) if p.default is not p.empty)}):\n"
               f"    def {fn.__name__}({head}):\n        return _bound({', '.join(names)})\n    return {fn.__name__}\n")
        ns: dict[str, Any] = {}
        exec(compile(src, f"<view query {fn.__name__}>", "exec"), ns)  # noqa: S102 (our own methods' parameters)
        factory = ns["factory"]
        factory.defaults = defaults
        factory.doc = fn.__doc__
        if fn is not bound:
            _FACTORIES[fn] = factory
    out = factory(bound, *factory.defaults)
    out.__doc__ = factory.doc
    return out


def queries(obj: Any, *names: str) -> dict[str, Callable]:
    return {n: query(getattr(obj, n)) for n in names}


def sealed(cls: type) -> type:
    """Class decorator: the class's own slots are taken off it (kept in `_SLOTS`): a public slot becomes a read-only
    property, a private one has no name on the class. `make` fills them; `hidden` reads a private one."""
    descs = {}
    for name in cls.__dict__.get("__slots__", ()):
        descs[name] = d = cls.__dict__[name]
        if name.startswith("_"):
            delattr(cls, name)
        else:
            setattr(cls, name, property(d.__get__))
    _SLOTS[cls] = descs
    return cls


def make(kind: type, /, **values: Any) -> Any:
    """An instance of the `sealed` class `kind` with its slots set (every slot must be given)."""
    obj = object.__new__(kind)
    descs = _SLOTS[kind]
    for name, v in values.items():
        descs[name].__set__(obj, v)
    return obj


def hidden(cls: type, name: str) -> Callable[[Any], Any]:
    """The reader of a sealed class's private slot `name` (for the class's own methods)."""
    return _SLOTS[cls][name].__get__


@sealed
class SeqView(Frozen, Sequence):
    """A read-only sequence over a list or deque the engine keeps changing."""

    __slots__ = ("_s",)

    def __len__(self) -> int:
        return len(_seq(self))

    def __iter__(self) -> Iterator:
        return iter(_seq(self))

    def __getitem__(self, k):
        return _seq(self)[k]

    def __contains__(self, x) -> bool:
        return x in _seq(self)

    def __repr__(self) -> str:
        return f"SeqView({list(_seq(self))!r})"


_seq = hidden(SeqView, "_s")


@sealed
class SetView(Frozen, Set):
    """A read-only set over a set the engine keeps changing."""

    __slots__ = ("_s",)

    def __len__(self) -> int:
        return len(_set(self))

    def __iter__(self) -> Iterator:
        return iter(_set(self))

    def __contains__(self, x) -> bool:
        return x in _set(self)

    def __repr__(self) -> str:
        return f"SetView({set(_set(self))!r})"


_set = hidden(SetView, "_s")


@sealed
class CostQuery(Frozen):
    """An instance's forward-pass time model as a query: `pass_time` answers and leaves the model as it was
    (the engine reads the model's last-call fields after its own calls)."""

    __slots__ = ("_c", "dp")

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends=None) -> float:
        c = _cost(self)
        unit, idle = c.last_unit, c.last_idle_frac
        try:
            return c.pass_time(prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends)
        finally:
            c.last_unit, c.last_idle_frac = unit, idle


_cost = hidden(CostQuery, "_c")


def cost_query(cost) -> CostQuery:
    return make(CostQuery, _c=cost, dp=cost.dp)


@sealed
class PrefixKeys(Frozen):
    """One DP unit's prefix-key LRU (prefill.PrefixCache), read-only: `key in cache`, `keys` (LRU order)."""

    __slots__ = ("entries", "keys")

    def __contains__(self, key: int) -> bool:
        return key in self.keys


class PrefillFacade(Frozen):
    """A prefill instance (prefill.PrefillInstance) as a policy sees it: `idx`, `dp`, `chunk_tokens`,
    `batch_form_s`, `dp_dispatch`, `blocks`, the token arrays per DP unit (`queued_tokens`, `inflight_tokens`,
    `running_tokens`, `reported`), `caches` (PrefixKeys per unit, or None), `cost` (CostQuery); live: `up`, `busy`,
    `depth`, `pass_start`, `pass_end`, `last_fwd`, `n_passes`; queries: `load_tokens()` (tokens each DP unit still
    has to process, a fresh array), `chain(rid)` (the prefix-block hashes of `rid`'s prompt), `cache_hits(rid)`
    and `cache_matches(rid)` (per unit, or grouped, the prompt tokens the prefix-block caches would serve now),
    `cache_fill()`, `cache_blocks()`, `cache_free_blocks()` (the HBM prefix caches' use), `prefix_hit(rid, dp)`."""

    __slots__ = ()

    @staticmethod
    def of(inst) -> PrefillFacade:
        bc = inst.bcaches

        def cache_blocks() -> list[int] | None:
            """Per DP unit: HBM prefix-cache blocks in use (None without block caches)."""
            return None if bc is None else [len(c.hbm) for c in bc]

        def cache_free_blocks() -> list[int] | None:
            """Per DP unit: HBM prefix-cache blocks not in use (None without block caches)."""
            return None if bc is None else [c.hbm.capacity - len(c.hbm) for c in bc]

        values = {"idx": inst.idx, "dp": inst.dp, "chunk_tokens": inst.chunk_tokens, "batch_form_s": inst.batch_form_s,
                  "dp_dispatch": inst.dp_dispatch, "blocks": record(inst.blocks), "cost": cost_query(inst.cost),
                  "caches": None if inst.caches is None else tuple(
                      make(PrefixKeys, entries=c.entries, keys=MappingProxyType(c.keys)) for c in inst.caches),
                  **{n: seal(getattr(inst, n)) for n in ("queued_tokens", "inflight_tokens", "running_tokens",
                                                         "reported")}}
        return frozen(PrefillFacade, values,
                      live(inst, "up", "busy", "depth", "pass_start", "pass_end", "last_fwd", "n_passes"),
                      {**queries(inst, "load_tokens", "chain", "cache_hits", "cache_matches", "cache_fill",
                                 "prefix_hit"), "cache_blocks": cache_blocks, "cache_free_blocks": cache_free_blocks})


class DecodeFacade(Frozen):
    """A decode instance (decode.DecodeInstance) as a policy sees it: `idx`, `dp`, `batch_limit`, `slots`, the
    arrays per worker `kv_cap`, `batch`, `kv`, `active` (a SetView per worker), `cost`; live: `busy`, `steps`,
    `n_batch`, `n_running`, `step_start`, `step_end`; queries: `free_slots()` (free batch slots per worker, a fresh
    array) and `fits(load)` (the workers that would admit a request holding `load` KV tokens now: the admission
    rule itself, DecodeInstance.fits, which view.admit applies)."""

    __slots__ = ()

    @staticmethod
    def of(inst) -> DecodeFacade:
        values = {"idx": inst.idx, "dp": inst.dp, "batch_limit": inst.batch_limit, "slots": inst.slots,
                  "kv_cap": seal(inst.kv_cap), "batch": seal(inst.batch), "kv": seal(inst.kv),
                  "active": tuple(make(SetView, _s=s) for s in inst.active), "cost": cost_query(inst.cost)}
        return frozen(DecodeFacade, values,
                      live(inst, "busy", "steps", "n_batch", "n_running", "step_start", "step_end"),
                      queries(inst, "free_slots", "fits"))


class UnitFacade(Frozen):
    """A colocated DP unit (colocated.ColocatedUnit) as a policy sees it: `slots`, `kv_cap`, `chunk_tokens`, the
    queues `waiting`, `prefilling` (SeqViews) and `decoding` (a SetView); live: `n_decoding`, `kv_used`,
    `decode_kv`, `n_running`, `steps`; `free_slots()` (slots not held by a running request)."""

    __slots__ = ()

    @staticmethod
    def of(unit) -> UnitFacade:
        values = {"slots": unit.slots, "kv_cap": unit.kv_cap, "chunk_tokens": unit.chunk_tokens,
                  "waiting": make(SeqView, _s=unit.waiting), "prefilling": make(SeqView, _s=unit.prefilling),
                  "decoding": make(SetView, _s=unit.decoding)}
        return frozen(UnitFacade, values, live(unit, "n_decoding", "kv_used", "decode_kv", "n_running", "steps"),
                      queries(unit, "free_slots"))


class ColocatedFacade(Frozen):
    """A colocated instance (colocated.ColocatedInstance) as a policy sees it: `idx`, `dp`, `units` (UnitFacades),
    `cost`; live: `busy`, `iter_start`, `iter_end`, `n_iters`."""

    __slots__ = ()

    @staticmethod
    def of(inst) -> ColocatedFacade:
        values = {"idx": inst.idx, "dp": inst.dp, "units": tuple(UnitFacade.of(u) for u in inst.units),
                  "cost": cost_query(inst.cost)}
        return frozen(ColocatedFacade, values, live(inst, "busy", "iter_start", "iter_end", "n_iters"))
