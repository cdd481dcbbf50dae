"""What a run is made of: the kinds of event the engine dispatches and the kinds of pass it records.

Both are IntEnums so heap entries and the `kind` column of the step table stay plain
integers (cheap to compare) while code names them; steps.csv spells pass kinds out
(metrics.SimResult.step_table).
"""

from __future__ import annotations

from enum import IntEnum


class EventKind(IntEnum):
    """A heap event `(t, seq, kind, a, b)`; the engine's handler table is indexed by kind."""

    DECODE_END = 0  # a decode step ended (a = instance)
    DECODE_START = 1  # a decode instance may start a step (a = instance)
    PREFILL_END = 2  # a prefill pass ended (a = instance, b = its epoch when the pass started)
    DEVICE_ARRIVE = 3  # a dispatched request reached its instance (a = request, b = instance)
    KV_READY = 4  # a KV transfer finished; the request joins the decode pool (a = request)
    COLOCATED_START = 5  # a colocated instance may start an iteration (a = instance)
    COLOCATED_END = 6  # a colocated iteration ended (a = instance)
    TIMER = 7  # a policy timer (a = owner decision point, b = tag)
    ARRIVE = 8  # closed-loop release of a request (a = request); open-loop arrivals come from an array
    FAULT = 9  # a fault or scale event (a = what, b = argument)
    PREFILL_START = 10  # a prefill instance may start a pass (a = instance)


class PassKind(IntEnum):
    """The `kind` column of the step table (steplog.COLUMNS): which engine ran the pass."""

    PREFILL = 0
    DECODE = 1
    COLOCATED = 2
