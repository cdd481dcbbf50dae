"""Fault and scale events (`faults` config): dropped EndForward signals, prefill instances down / up,
scale events that change the active prefill instance count.

A failed instance loses its pass and queues; its requests come back to the scheduler when
health checks notice (`detect_s` later), or at once for a planned scale-down. Requests
dispatched to a dead instance bounce back on arrival. `sim.prefill_healthy` is what the
scheduler is told; `on_topology_change` fires whenever it changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ConfigError
from .events import EventKind, Fault

if TYPE_CHECKING:  # pragma: no cover
    from .host import Host

FAULT = int(EventKind.FAULT)


class FaultInjector:
    """Turns the fault config into FAULT events and applies them to the prefill instances."""

    def __init__(self, sim: Host):
        self.sim = sim
        self.cfg = sim.cfg.faults

    def schedule(self) -> None:
        """Queue the configured down / up / scale events (called when the run starts)."""
        push = self.sim.push
        for d in self.cfg.down:
            push(float(d["at"]), FAULT, Fault("down", int(d["instance"])))
            if d.get("until") is not None:
                push(float(d["until"]), FAULT, Fault("up", int(d["instance"])))
        for s in self.cfg.scale:
            push(float(s["at"]), FAULT, Fault("scale", int(s["count"])))

    def drop_signal(self) -> bool:
        """Whether this EndForward signal is lost on its way to the scheduler (counted)."""
        drop = self.cfg.drop_end_forward
        if drop > 0 and self.sim.fault_rng.random() < drop:
            self.sim.dropped_signals += 1
            return True
        return False

    def handle(self, what: str, arg: Any) -> None:
        """FAULT event handler: `what` is down / up / detect (arg: instance) or scale (arg: count)."""
        sim = self.sim
        if not sim.disaggregated:
            raise ConfigError("faults: down/scale events need cluster.topology=disaggregated")
        if what == "down":
            self._take_down(arg, notify_after=self.cfg.detect_s)
        elif what == "up":
            self._bring_up(arg)
        elif what == "detect":
            P = sim.prefill[arg]
            if not P.up:
                sim.set_healthy(arg, False)
                lost, P.lost = P.lost, []
                for rid in lost:
                    sim.bounce(rid)
                sim.call("prefill", "on_topology_change")
        elif what == "scale":
            for i, P in enumerate(sim.prefill):
                if i < arg and not P.up:
                    self._bring_up(i, notify=False)
                elif i >= arg and P.up:
                    self._take_down(i, notify_after=None)
            sim.call("prefill", "on_topology_change")

    def _take_down(self, inst: int, notify_after: float | None) -> None:
        """Instance fails (or is scaled away): its pass and queues are lost; requests come back later."""
        sim = self.sim
        P = sim.prefill[inst]
        if not P.up:
            return
        stranded = P.take_down()
        if notify_after is None:  # planned scale-down: drained back to the scheduler at once
            sim.set_healthy(inst, False)
            for rid in stranded:
                sim.bounce(rid)
        else:
            P.lost.extend(stranded)
            sim.push(sim.now + notify_after, FAULT, Fault("detect", inst))

    def _bring_up(self, inst: int, notify: bool = True) -> None:
        sim = self.sim
        P = sim.prefill[inst]
        lost, P.lost = P.lost, []
        for rid in lost:  # came back before anyone noticed: its requests are resubmitted
            sim.bounce(rid)
        P.up = True
        sim.set_healthy(inst, True)
        if notify:
            sim.call("prefill", "on_topology_change")
