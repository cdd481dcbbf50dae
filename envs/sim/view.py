"""What a policy may see of a run and do to it.

`SimView` is the protocol policies are written against: read-only state plus the action
methods. The engine hands each policy (and its observers) a `RunView` of its own, never the
engine: request arrays are sealed read-only arrays (facades.seal: the flag cannot be reopened,
`.base` leads nowhere), the buffer and pool read-only mappings, the instances read-only facades
(facades.py), `cfg` a copy the engine never reads, `completed` a read-only sequence whose slices
are sealed, and the true output length (`req.output`) raises `OracleError` unless `cfg.oracle`.
A view, like a facade, is the one instance of a class made for it (facades.frozen): it holds no
state, its actions and queries are plain functions (no `__self__`, no `_engine`), so no attribute
of the view leads to the engine and neither setattr nor object.__setattr__ changes it. Each policy
has its own view (its own `cfg` copy); the facades and request view inside are immutable and shared. Every write to
the view or what it hands out raises; the run changes only through the action methods, which the
engine checks (policy_errors.py). What Python still allows is listed in docs/architecture.md,
"What a policy cannot do"; tests/test_view_contract.py walks every public name and tries the tampers.

A stand-in for the engine (a shadow simulator that records a teacher's decisions instead
of acting: envs/shadow.py) implements `SimView` too: the state attributes it reads from
the real view, the five action methods its own way.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .classes import ClassTable
from .facades import (
    ColocatedFacade,
    DecodeFacade,
    Frozen,
    PrefillFacade,
    frozen,
    hidden,
    live,
    make,
    queries,
    seal,
    sealed,
)

if TYPE_CHECKING:  # pragma: no cover
    from .config import SimConfig
    from .requests import IdLog, RequestTable

# Request-table arrays a policy may read (output: only under cfg.oracle).
VISIBLE = ("prompt", "prefix_key", "prefix_len", "arrival", "dispatch", "prefill_start", "first_token",
           "decode_admit", "finish", "last_tok", "buf_t", "dev_arrive", "itl_max", "state", "reason", "done", "work",
           "cached", "prefill_inst", "prefill_dp", "decode_inst", "worker", "admit_step", "done_at_admit",
           "finish_step", "preemptions", "sched_wait", "device_wait", "cls")


# Engine values a view hands out as they are (immutable, or the policies' own random stream).
VALUES = ("disaggregated", "rng", "block_tokens", "seed")
# The engine's queries and actions a view hands out as plain functions (facades.query).
QUERIES = ("healthy_prefill", "prefix_hit", "fill_prefill")
ACTIONS = ("dispatch", "reject", "set_timer", "admit", "pause")
# Prefix-block hashes (flat arrays; None when the workload has none): block_ids[block_off[i]:block_off[i + 1]].
BLOCKS = ("block_ids", "block_off")
# Optional arrays: None when the run has none. predicted: the output length predicted at arrival (prediction.py).
OPTIONAL = BLOCKS + ("predicted",)


class OracleError(RuntimeError):
    """A policy read the true output lengths of a run without `oracle: true`."""


class RequestView(Frozen):
    """The request table as a policy sees it: sealed arrays that follow the run (`RequestView.of`)."""

    __slots__ = ()

    @staticmethod
    def of(table: RequestTable, oracle: bool) -> RequestView:
        values = {"n": table.n, **{name: seal(getattr(table, name)) for name in VISIBLE}}
        for name in OPTIONAL:
            a = getattr(table, name)
            values[name] = None if a is None else seal(a)
        if oracle:
            values["output"] = seal(table.output)
        return frozen(RequestView, values)

    @property
    def output(self) -> np.ndarray:
        raise OracleError("req.output: true output lengths are hidden from policies; set oracle: true to "
                          "expose them (finished requests' lengths are req.done[sim.completed])")

    def load(self, rid: int) -> int:
        """KV tokens request `rid` holds while decoding: prompt plus tokens produced so far."""
        return int(self.prompt[rid] + self.done[rid])


@sealed
class Completed(Frozen, Sequence):
    """Finished request ids in completion order (requests.IdLog as a policy sees it): an item is an int, a slice a
    sealed id array (`req.done[sim.completed[k:]]` indexes with it directly)."""

    __slots__ = ("_log", "_ids")

    @staticmethod
    def of(log: IdLog) -> Completed:
        return make(Completed, _log=log, _ids=seal(log._ids))  # preallocated for every request: the seal follows it

    def _done(self) -> np.ndarray:
        return _ids(self)[:len(_log(self))]

    def __len__(self) -> int:
        return len(_log(self))

    def __getitem__(self, key):
        return self._done()[key] if isinstance(key, slice) else int(self._done()[key])

    def __iter__(self):
        return iter(self._done().tolist())

    def __contains__(self, x) -> bool:
        return bool((self._done() == x).any())

    def __repr__(self) -> str:
        return f"Completed({self._done().tolist()})"


_log, _ids = hidden(Completed, "_log"), hidden(Completed, "_ids")


class SimView(Protocol):
    """Read-only state and the action API of one run, as a policy sees it."""

    cfg: SimConfig
    now: float
    req: RequestView
    buffer: Mapping[int, None]  # requests held by the prefill scheduler, arrival order
    pool: Mapping[int, None]  # prefill-done requests awaiting decode admission
    completed: Sequence[int]  # finished request ids in completion order (requests.IdLog: a slice is an id array)
    prefill: tuple  # PrefillFacade (facades.py) of each PrefillInstance (prefill.py)
    decode: tuple  # DecodeFacade of each DecodeInstance (decode.py)
    colocated: tuple  # ColocatedFacade of each ColocatedInstance (colocated.py)
    prefill_healthy: np.ndarray  # what health checks report, per prefill (or colocated) instance
    disaggregated: bool
    rng: np.random.Generator  # the policies' random generator
    tokens_out: int
    block_tokens: int  # tokens per prefix block of req.block_ids (0: the workload has no block hashes)
    classes: ClassTable  # the run's SLO classes (classes.py): req.cls indexes names, ttft_s, tpot_s, weight
    seed: int  # the run's seed (with cfg it replays the same traffic: a hindsight row, baselines/slo_hindsight.py)

    def healthy_prefill(self) -> tuple[int, ...]: ...

    def prefix_hit(self, rid: int, inst: int, dp: int) -> int: ...

    def fill_prefill(self, inst: int, unit: int, budget: int, admit_new: bool = True,
                     per_request: int | None = None) -> list[tuple[int, int]]: ...

    # actions
    def dispatch(self, rid: int, inst: int, dp: int | None = None) -> None: ...

    def reject(self, rid: int, reason: str) -> None: ...

    def set_timer(self, t: float, owner: str, tag: object = None) -> None: ...

    def admit(self, rid: int, inst: int, worker: int) -> bool: ...

    def pause(self) -> None: ...


class OrderView(Frozen):
    """What a queue discipline from outside the tree (queue.order=module:Class, ordering.py) is built on instead of
    the engine: the policies' request view (true output lengths hidden unless oracle: true), copies of the classes
    and the config, and the clock (a live property: like RunView, no engine reference to follow)."""

    __slots__ = ()

    def __new__(cls, engine: Any) -> OrderView:
        values = {"req": RequestView.of(engine.req, engine.cfg.oracle), "classes": engine.classes.copy(),
                  "cfg": copy.deepcopy(engine.cfg)}
        return frozen(OrderView, values, live(engine, "now"))


class RunView(Frozen):
    """The `SimView` of a running engine: `RunView.of(engine, parts)`, one per policy and one for the observers, built
    once per run; every attribute follows the run. `parts(engine)`: what views share (immutable, built once)."""

    __slots__ = ()

    @staticmethod
    def parts(engine: Any) -> dict[str, Any]:
        c = engine.classes
        return {"req": RequestView.of(engine.req, engine.cfg.oracle), "completed": Completed.of(engine.completed),
                "prefill": tuple(PrefillFacade.of(i) for i in engine.prefill),
                "decode": tuple(DecodeFacade.of(i) for i in engine.decode),
                "colocated": tuple(ColocatedFacade.of(i) for i in engine.colocated),
                "prefill_healthy": seal(engine.prefill_healthy),
                "classes": ClassTable(c.names, seal(c.ttft_s), seal(c.tpot_s), seal(c.weight)),
                **{name: getattr(engine, name) for name in VALUES}}

    @staticmethod
    def of(engine: Any, parts: dict[str, Any]) -> RunView:
        proxies: dict[str, tuple] = {}

        def proxy(name: str) -> property:
            """One read-only proxy per engine dict (policies may key caches on the pool object's identity)."""
            def get(_self) -> Mapping[int, None]:
                src = getattr(engine, name)
                cached = proxies.get(name)
                if cached is None or cached[0] is not src:
                    cached = proxies[name] = (src, MappingProxyType(src))
                return cached[1]
            return property(get)

        values = {"cfg": copy.deepcopy(engine.cfg), **parts}  # its own copy: a write changes nothing the engine reads
        props = {**live(engine, "now", "tokens_out"), "buffer": proxy("buffer"), "pool": proxy("pool")}
        return frozen(RunView, values, props, queries(engine, *QUERIES, *ACTIONS))
