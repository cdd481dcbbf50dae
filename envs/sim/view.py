"""What a policy may see of a run and do to it: the `SimView` protocol.

Policies are written against this protocol, not against the engine, so the engine can
be restructured without touching them and a stand-in (a shadow simulator that records
a teacher's decisions instead of acting) can be handed to a policy in its place. The
protocol is read-only state plus the action methods; an implementation must not let a
policy assign state, and must hide `req.output` unless `cfg.oracle`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .config import SimConfig
    from .requests import RequestTable


class SimView(Protocol):
    """Read-only state and the action API of one run, as a policy sees it."""

    cfg: SimConfig
    now: float
    req: RequestTable
    buffer: dict[int, None]  # requests held by the prefill scheduler, arrival order
    pool: dict[int, None]  # prefill-done requests awaiting decode admission
    completed: list[int]  # finished request ids in completion order
    prefill: list[Any]  # PrefillInstance
    decode: list[Any]  # DecodeInstance
    colocated: list[Any]  # ColocatedInstance
    prefill_healthy: np.ndarray  # what health checks report, per prefill (or colocated) instance
    rng: np.random.Generator  # the policies' random generator
    tokens_out: int

    def healthy_prefill(self) -> list[int]: ...

    def prefix_hit(self, rid: int, inst: int, dp: int) -> int: ...

    def fill_prefill(self, inst: int, unit: int, budget: int, admit_new: bool = True,
                     per_request: int | None = None) -> list[tuple[int, int]]: ...

    # actions
    def dispatch(self, rid: int, inst: int, dp: int | None = None) -> None: ...

    def reject(self, rid: int, reason: str) -> None: ...

    def set_timer(self, t: float, owner: str, tag: object = None) -> None: ...

    def admit(self, rid: int, inst: int, worker: int) -> bool: ...

    def pause(self) -> None: ...
