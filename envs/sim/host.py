"""What an instance module (prefill.py, decode.py, colocated.py, faults.py) may use of the engine.

The instance modules own their state and transitions; the engine (engine.Simulator) owns
the clock, the heap, the buffer and pool, the policies and the request resolutions. This
protocol is the whole interface between the two, so the instance modules do not import
the engine (no import cycle) and a new instance type knows exactly what it can call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .config import SimConfig
    from .ordering import QueueOrder
    from .requests import RequestTable
    from .view import RunView


class Host(Protocol):
    cfg: SimConfig
    now: float
    req: RequestTable
    pool: dict[int, None]
    tokens_out: int
    dropped_signals: int
    disaggregated: bool
    fault_rng: np.random.Generator
    view: RunView  # what observers are handed
    views: dict[str, RunView]  # decision point name -> the view its policy is handed
    policies: dict[str, Any]  # decision point name (points.POINTS) -> its policy: sim.policies["decode"].route(...)
    prefill: list
    decode: list
    colocated: list
    prefill_healthy: np.ndarray
    queue_order: QueueOrder | None  # the queue discipline (ordering.py); None: arrival order

    def push(self, t: float, kind: int, payload: Any) -> None: ...

    def call(self, point: str, method: str, *args: Any) -> Any:
        """The policy of `point` is called: `method(view, *args)` (its errors one PolicyError line)."""

    def ask(self, point: str, replay: Any, method: str, *args: Any) -> Any:
        """The policy of `point` decides (`method(view, *args)`), or events.PAUSED after `replay()` re-queued
        the asking event (an agent decides in its env)."""

    def record_pass(self, kind: int, inst: Any, dur: float, tokens: float, reqs: float, kv_max: int, kv_min: int,
                    util: float, unit_tokens: np.ndarray, unit_reqs: np.ndarray, unit_kv: np.ndarray) -> None: ...

    def pass_ended(self, kind: int, inst: int) -> None: ...

    def token(self, rid: int) -> None: ...

    def prefill_done(self, rid: int) -> None: ...

    def end_forward(self, inst: int, fwd: float) -> None: ...

    def finish_request(self, rid: int) -> None: ...

    def reject_request(self, rid: int, code: int, release: bool = True) -> None: ...

    def buffer_request(self, rid: int) -> None: ...

    def bounce(self, rid: int) -> None: ...

    def set_healthy(self, inst: int, value: bool) -> None: ...
