"""What a policy may see of a run and do to it.

`SimView` is the protocol policies are written against: read-only state plus the action
methods. The engine hands every policy (and observer) a `RunView` of itself, never the
engine: request arrays are read-only NumPy views, the buffer and pool read-only mappings,
the instances read-only facades (facades.py: no public reference to the engine or an
instance), `cfg` a copy the engine never reads, `completed` a read-only sequence, and the
true output length (`req.output`) raises `OracleError` unless `cfg.oracle`. Every write to
the view or what it hands out raises; the run changes only through the action methods.
Public names are the contract (tests/test_view_contract.py walks every one of them); names
starting with an underscore are not, and code that goes looking (gc, `__self__`) is out of it.

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

from .facades import ColocatedFacade, DecodeFacade, Frozen, PrefillFacade, SeqView, read_only

if TYPE_CHECKING:  # pragma: no cover
    from .classes import ClassTable
    from .config import SimConfig
    from .requests import RequestTable

# Request-table arrays a policy may read (output: only under cfg.oracle).
VISIBLE = ("prompt", "prefix_key", "prefix_len", "arrival", "dispatch", "prefill_start", "first_token",
           "decode_admit", "finish", "last_tok", "buf_t", "dev_arrive", "itl_max", "state", "reason", "done", "work",
           "cached", "prefill_inst", "prefill_dp", "decode_inst", "worker", "admit_step", "done_at_admit",
           "finish_step", "preemptions", "sched_wait", "device_wait", "cls")


# Engine attributes a view hands out as they are: immutable values, bound query and action methods.
SHARED = ("disaggregated", "rng", "healthy_prefill", "prefix_hit", "fill_prefill", "dispatch", "reject", "set_timer",
          "admit", "pause", "block_tokens", "seed")
# Prefix-block hashes (flat arrays; None when the workload has none): block_ids[block_off[i]:block_off[i + 1]].
BLOCKS = ("block_ids", "block_off")
# Optional arrays: None when the run has none. predicted: the output length predicted at arrival (prediction.py).
OPTIONAL = BLOCKS + ("predicted",)


class OracleError(RuntimeError):
    """A policy read the true output lengths of a run without `oracle: true`."""


class RequestView(Frozen):
    """The request table as a policy sees it: read-only arrays that follow the run."""

    __slots__ = ("n", "_output", *VISIBLE, *OPTIONAL)

    def __init__(self, table: RequestTable, oracle: bool):
        self._set(n=table.n, _output=read_only(table.output) if oracle else None,
                  **{name: read_only(getattr(table, name)) for name in VISIBLE})
        for name in OPTIONAL:
            a = getattr(table, name)
            self._set(**{name: None if a is None else read_only(a)})

    @property
    def output(self) -> np.ndarray:
        if self._output is None:
            raise OracleError("req.output: true output lengths are hidden from policies; set oracle: true to "
                              "expose them (finished requests' lengths are req.done[sim.completed])")
        return self._output

    def load(self, rid: int) -> int:
        """KV tokens request `rid` holds while decoding: prompt plus tokens produced so far."""
        return int(self.prompt[rid] + self.done[rid])


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


class OrderView:
    """What a queue discipline from outside the tree (queue.order=module:Class, ordering.py) is built on instead of
    the engine: the policies' request view (true output lengths hidden unless oracle: true), copies of the classes
    and the config, and the clock."""

    def __init__(self, engine: Any):
        self._engine = engine
        self.req = RequestView(engine.req, engine.cfg.oracle)
        self.classes = engine.classes.copy()
        self.cfg = copy.deepcopy(engine.cfg)

    @property
    def now(self) -> float:
        return self._engine.now


class RunView(Frozen):
    """The `SimView` of a running engine (built once per run; every attribute follows the run)."""

    __slots__ = ("_engine", "_proxies", "cfg", "req", "completed", "prefill", "decode", "colocated",
                 "prefill_healthy", "classes", *SHARED)

    def __init__(self, engine: Any):
        self._set(_engine=engine, _proxies={},
                  cfg=copy.deepcopy(engine.cfg),  # a copy: a policy that writes to it changes nothing the engine reads
                  req=RequestView(engine.req, engine.cfg.oracle),
                  completed=SeqView(engine.completed),
                  prefill=tuple(PrefillFacade(i) for i in engine.prefill),
                  decode=tuple(DecodeFacade(i) for i in engine.decode),
                  colocated=tuple(ColocatedFacade(i) for i in engine.colocated),
                  prefill_healthy=read_only(engine.prefill_healthy),
                  classes=engine.classes.copy(),  # its own read-only arrays: the engine's stay its own
                  # immutable values and the engine's bound query / action methods
                  **{name: getattr(engine, name) for name in SHARED})

    @property
    def now(self) -> float:
        return self._engine.now

    @property
    def buffer(self) -> Mapping[int, None]:
        return self._proxy("buffer")

    @property
    def pool(self) -> Mapping[int, None]:
        return self._proxy("pool")

    def _proxy(self, name: str) -> Mapping[int, None]:
        """One read-only proxy per engine dict (policies may key caches on the pool object's identity)."""
        src = getattr(self._engine, name)
        cached = self._proxies.get(name)
        if cached is None or cached[0] is not src:
            cached = self._proxies[name] = (src, MappingProxyType(src))
        return cached[1]

    @property
    def tokens_out(self) -> int:
        return self._engine.tokens_out

