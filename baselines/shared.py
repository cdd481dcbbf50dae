"""The read API of the baselines' shared machinery: what an env (or another policy) may use of it.

Some baselines are built from parts that are not policies themselves: SBS's capacity model
(`pbaa.CapacityModel`), PBAA's allocation state (`pbaa.PBAA`), the short / long prompt split
(`length_classes.LengthClasses`), EB's phase machine (`exclusive_batching.EB` and its
`UnitState`), BR-H's load projection (`balance_route.BRH`) and the output-length forecast under it
(`predictors.Predictor`) and Conductor's pass estimates (`cache_routing.UnitDispatch`). The Gymnasium envs compose the
same parts, so that an agent sees what the baseline reads and acts through what the baseline
does. They never subclass a registered policy and never read a part's internals: only the
members these protocols list. A baseline may change anything else without changing an env's
observations; changing a member listed here changes the envs too, and says so by being here.
tests/test_shared_api.py checks that the envs' code touches no other member of these parts, and
that the parts implement their protocol.

Hooks instead of overrides: where an env takes a decision a baseline would take, the baseline
offers a hook (`SBS.hook_release`: SBS keeps its timing and calls the hook where it would release;
`EB.set_theta`: the phase machine runs a unit's own theta) rather than a method to override.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Capacity(Protocol):
    """SBS's capacity model (pbaa.CapacityModel): what a prefill scheduler knows of its instances.

    Arrays are (instances,) or (instances, DP units): fresh arrays, or read-only views of the model's own state
    (`reported`, `last_forward`: read on every env step, so not copied); reading never changes the model.
    """

    n: int  # prefill instances (including ones not yet up)
    dp: int  # DP units per instance
    t_full: float  # offline profile: a full-chunk pass (s)

    @property
    def t_fwd(self) -> float:
        """Mean of the recent EndForward pass times (the offline estimate until the first)."""

    @property
    def chunk_tokens(self) -> int:
        """Per-unit token budget of a pass (C_chunk)."""

    def c_avail(self, inst: int) -> np.ndarray:
        """C_avail per DP unit of `inst`: chunk - U_flight - R_queued (may be negative)."""

    def avail(self) -> np.ndarray:
        """C_avail of every unit, (instances, units)."""

    def busy(self) -> np.ndarray:
        """Per instance: a dispatch of ours has no EndForward yet (the scheduler believes it busy)."""

    def reported(self) -> np.ndarray:
        """R_queued: tokens per unit the last EndForward reported still to process, (instances, units)."""

    def last_forward(self) -> np.ndarray:
        """The last reported pass time per instance (NaN before the first)."""

    def expected_free(self, inst: int, now: float) -> float:
        """Seconds until `inst` is expected to report its pass end (0 if it already did)."""

    # updates (the owner's bookkeeping, called on the scheduler's events)
    def reset(self, sim) -> None: ...

    def dispatched(self, inst: int, dp: int, tokens: int, now: float) -> None: ...

    def end_forward(self, sim, inst: int, fwd: float) -> None: ...

    def poll(self, sim, inst: int) -> bool:
        """Quiescence poll: True (and the instance's state is cleared) if it answers with depth zero."""

    def clear(self, inst: int) -> None: ...


@runtime_checkable
class Allocator(Protocol):
    """PBAA's state (pbaa.PBAA): requests left over from earlier cycles and their wait counters."""

    n_limit: int  # cycles a request may be left over before flow control

    def wait_cycles(self, rid: int) -> int:
        """Cycles `rid` has been left over (0 if it never was)."""

    def n_left_over(self, buffer: Iterable[int]) -> int:
        """How many of the requests in `buffer` were left over by an earlier cycle."""

    def reset(self) -> None: ...

    def release(self, sim, inst: int, cap: Capacity, only: list[int] | None = None) -> int:
        """Allocate the buffer (or its requests `only`) over the DP units of `inst` and dispatch; placed count."""


@runtime_checkable
class Releaser(Protocol):
    """SBS (sbs.SBS) as a part: its timing, with each release handed to a hook."""

    cap: Capacity
    pbaa: Allocator

    # the PrefillScheduler protocol (its owner forwards the scheduler's events)
    def reset(self, sim) -> None: ...

    def on_arrival(self, sim, rid: int) -> None: ...

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None: ...

    def on_timer(self, sim, tag) -> None: ...

    def on_topology_change(self, sim) -> None: ...

    def hook_release(self, hook: Callable[[Any, int], None] | None) -> None:
        """Where SBS would release to `target`, call `hook(sim, target)` instead (None: release itself)."""

    def release(self, sim, target: int, only: list[int] | None = None) -> int:
        """Send the buffer (or `only`) to `target`: one SBS cycle (pacing, watchdog, stats)."""


@runtime_checkable
class PassEstimates(Protocol):
    """Conductor's view of the prefill instances (cache_routing.UnitDispatch, the cache-aware routers' base): the
    offline full-chunk pass time, the recent pass time (EndForward average) and the units' backlog."""

    def reset(self, sim) -> None: ...

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None: ...

    def t_full(self, sim, inst: int) -> float:
        """Seconds of a pass whose every unit runs a full chunk (the offline profile)."""

    def t_pass(self, sim, inst: int) -> float:
        """The instance's recent pass time (t_full until its first EndForward)."""

    def backlog(self, sim, inst: int) -> np.ndarray:
        """Tokens each unit of `inst` still has to start (on the wire and queued)."""


@runtime_checkable
class LengthSplit(Protocol):
    """The short / long prompt split (length_classes.LengthClasses)."""

    passed_over: set[int]  # long requests a short release left behind (read only)

    @property
    def median(self) -> float:
        """The split: median prefill tokens of recent fresh arrivals (inf before the first)."""

    def reset(self) -> None: ...

    def arrived(self, work: int) -> None: ...

    def split(self, sim) -> tuple[list[int], list[int]]:
        """(short, long) buffered request ids, each in arrival order."""

    def members(self, sim, cls: int) -> list[int] | None:
        """The ids a release of class `cls` sends (None: the whole buffer)."""

    def rule(self, sim) -> int:
        """The scripted class choice (SBS's compose="length")."""


@runtime_checkable
class PhaseMachine(Protocol):
    """EB's phase machine (exclusive_batching.EB) per DP unit of a colocated instance."""

    def unit_state(self, inst: int, unit: int) -> Any:
        """The unit's `UnitState`: `phase` (REFILL / DECODE) and `target` (admissions left, -1: up to N)."""

    def set_theta(self, inst: int, unit: int, theta: float) -> None:
        """The unit's threshold from now on (instead of the policy's)."""

    def resume(self, inst: int, unit: int, refill: bool) -> None:
        """Restart the unit's cycle: finish the prompt chunks in flight (refill) or decode, no new admissions."""

    def reset(self, sim) -> None: ...

    def next_batch(self, sim, inst: int, unit: int) -> Any: ...


@runtime_checkable
class Projector(Protocol):
    """BR-H's load projection (balance_route.BRH) as a part: the DecodeRouting env's horizon features."""

    def reset(self, sim) -> None: ...

    def projection(self, sim, inst: int) -> np.ndarray:
        """Projected KV load per worker of `inst` over the horizon, (workers, H); the caller may add to it."""

    def admitted(self, sim, rid: int) -> None:
        """`rid` was admitted (its projected output joins the worker's load)."""


@runtime_checkable
class Forecaster(Protocol):
    """BR-H's output-length forecast (predictors.Predictor: survival, memo) as a part: the pick formulation's
    forecast features (envs/decode_pick.py)."""

    def bind(self, sim, horizon: int) -> None:
        """At the router's reset: fit on the training split, for windows of `horizon` decode steps."""

    def window(self, sim, rids: np.ndarray, age: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P(finish within the window), mean steps to finish if so) of requests `rids` at their ages."""


__all__ = ["Allocator", "Capacity", "Forecaster", "LengthSplit", "PhaseMachine", "Projector", "Releaser"]
