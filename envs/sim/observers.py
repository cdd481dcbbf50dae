"""Observers: code that watches a run (rewards, recorders, trace exporters, invariant checks) without
wrapping the cost model or subclassing the engine.

Attach with `sim.observe(obs)` before or during a run. Observers only read: they must not
change state or draw from the run's random generators, so attaching one never changes a
result. With no observer attached the engine builds no records (the hot loop pays one
truthiness test per pass and per resolved request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .events import PassKind

if TYPE_CHECKING:  # pragma: no cover
    from .view import SimView


@dataclass(slots=True)
class PassStart:
    """A pass that just started on one instance (its duration is known at its start).

    The vectors have one entry per DP unit and are the engine's live arrays: valid during
    the callback only; copy what you keep. `unit_time` is each unit's compute time from
    the cost model before the barrier max (fixed costs and communication excluded), so
    `unit_time.max() - unit_time` is each unit's wait at the barrier.
    """

    kind: PassKind
    inst: int
    t: float
    dur: float
    unit_time: np.ndarray
    prefill_tokens: np.ndarray
    decode_reqs: np.ndarray
    decode_kv: np.ndarray  # KV tokens the decodes read (decode instances: worker KV at step start)


class Observer:
    """Base class: override what you need. `sim` is the run's read-only view."""

    def on_pass_start(self, sim: SimView, p: PassStart) -> None:
        """A pass started (and was recorded in the step table)."""

    def on_pass_end(self, sim: SimView, kind: PassKind, inst: int) -> None:
        """A pass ended and the engine settled its effects (tokens, finishes, the next pass queued)."""

    def on_finish(self, sim: SimView, rid: int) -> None:
        """Request `rid` finished (its output is complete)."""

    def on_reject(self, sim: SimView, rid: int) -> None:
        """Request `rid` was rejected (`sim.req.reason[rid]` says why)."""
