"""What a run is made of: the kinds of event the engine dispatches, their payloads, and the kinds of pass it records.

A heap event is `(t, seq, kind, payload)`: `kind` an `EventKind` (an IntEnum, so heap entries stay plain integers
and cheap to compare) and one typed payload, the handler's argument. An event of one instance carries the
instance itself (its handler is that class's method, declared in the class's HANDLERS); an event of one
request carries its id; the others carry a NamedTuple below, whose fields the handler takes as arguments.

| kind            | payload                                          | pushed by -> handled by                       |
|-----------------|--------------------------------------------------|-----------------------------------------------|
| DECODE_END      | DecodeInstance (its step ended)                  | DecodeInstance.start_step -> end_step         |
| DECODE_START    | DecodeInstance (it may start a step)             | DecodeInstance.wake -> start_step             |
| PREFILL_END     | PrefillEnd(inst, epoch) (a pass ended)           | PrefillInstance.start_pass -> end_pass        |
| DEVICE_ARRIVE   | DeviceArrive(rid, inst) (a dispatch arrived)     | Simulator.dispatch -> _device_arrive          |
| KV_READY        | request id (its KV transfer finished)            | Simulator.prefill_done -> _kv_ready           |
| COLOCATED_START | ColocatedInstance (it may start an iteration)    | ColocatedInstance.wake -> start_iteration     |
| COLOCATED_END   | ColocatedInstance (its iteration ended)          | ColocatedInstance.start_iteration -> end_iteration |
| TIMER           | Timer(owner, tag) (a policy timer)               | Simulator.set_timer -> _timer                 |
| ARRIVE          | request id (closed-loop release)                 | Simulator._release_closed_loop -> _arrive     |
| FAULT           | Fault(what, arg) (a fault or scale event)        | FaultInjector.schedule / _take_down -> handle |
| PREFILL_START   | PrefillInstance (it may start a pass)            | PrefillInstance (arrival, pass end, batch forming) -> kick |

PrefillEnd.epoch is the instance's epoch when the pass started (a failure bumps it, so a lost pass's end is
ignored); DeviceArrive comes L_net after the dispatch; Timer.owner is a decision point (points.POINTS) and its
tag the policy's own; Fault.what is down / up / detect (arg: instance) or scale (arg: instance count). Open-loop
arrivals come from an array, not the heap.

Measured (issue 28; bench_sim's two scenarios, 4,000 / 1,000 requests, the two versions advanced in alternating
slices of simulated time in one process, best of 5 rounds per slice): a NamedTuple on every event ran at 0.968
(disaggregated) and 0.975 (colocated) of the untyped (a, b) events/s, a cost near the 3% bound; this form, where
the numerous instance and request events carry the instance or the id itself, ran at 0.994 and 1.022 of it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

PAUSED = object()  # Simulator.ask's answer when the policy paused the run instead of deciding (the event is replayed)


class EventKind(IntEnum):
    """A heap event `(t, seq, kind, payload)`; the engine's handler table is indexed by kind (payloads: above)."""

    DECODE_END = 0
    DECODE_START = 1
    PREFILL_END = 2
    DEVICE_ARRIVE = 3
    KV_READY = 4
    COLOCATED_START = 5
    COLOCATED_END = 6
    TIMER = 7
    ARRIVE = 8
    FAULT = 9
    PREFILL_START = 10


class PrefillEnd(NamedTuple):
    inst: Any  # the PrefillInstance
    epoch: int  # the instance's epoch when the pass started


class DeviceArrive(NamedTuple):
    rid: int
    inst: int  # index of the front instance (prefill, or colocated)


class Timer(NamedTuple):
    owner: str  # the decision point whose policy set it
    tag: Any  # the policy's own


class Fault(NamedTuple):
    what: str  # down | up | detect | scale
    arg: int  # instance (down, up, detect) or instance count (scale)


SPREAD = {EventKind.PREFILL_END: PrefillEnd, EventKind.DEVICE_ARRIVE: DeviceArrive, EventKind.TIMER: Timer,
          EventKind.FAULT: Fault}  # kinds whose NamedTuple payload the handler takes field by field


class PassKind(IntEnum):
    """The `kind` column of the step table (steplog.COLUMNS): which engine ran the pass."""

    PREFILL = 0
    DECODE = 1
    COLOCATED = 2
