"""Shadow simulators: `SimView`s of a live run through which a baseline policy plans without acting.

Behaviour cloning asks a baseline what it would do now. The baseline is handed a shadow instead of
the simulator: every state attribute of the `SimView` protocol (envs/sim/view.py) reads through to
the run, and the action methods are the shadow's own, so the teacher's decisions are recorded (or
applied to private copies) and the run itself is untouched. Each attribute is spelled out, not
forwarded wholesale, so a teacher that reaches past the protocol fails loudly.
"""

from __future__ import annotations

import copy

from pdgym.baselines.routers import feasible


class ShadowView:
    """Read-through SimView of `sim`; subclasses define what the actions do."""

    def __init__(self, sim):
        self._sim = sim

    # -------------------------------------------------------------- state (read-through)
    @property
    def cfg(self):
        return self._sim.cfg

    @property
    def now(self) -> float:
        return self._sim.now

    @property
    def req(self):
        return self._sim.req

    @property
    def buffer(self):
        return self._sim.buffer

    @property
    def pool(self):
        return self._sim.pool

    @property
    def completed(self):
        return self._sim.completed

    @property
    def prefill(self):
        return self._sim.prefill

    @property
    def decode(self):
        return self._sim.decode

    @property
    def colocated(self):
        return self._sim.colocated

    @property
    def prefill_healthy(self):
        return self._sim.prefill_healthy

    @property
    def rng(self):
        return self._sim.rng

    @property
    def tokens_out(self) -> int:
        return self._sim.tokens_out

    @property
    def disaggregated(self) -> bool:
        return self._sim.disaggregated

    @property
    def block_tokens(self) -> int:
        return self._sim.block_tokens

    @property
    def classes(self):
        return self._sim.classes

    @property
    def seed(self) -> int:
        return self._sim.seed

    def healthy_prefill(self) -> list[int]:
        return self._sim.healthy_prefill()

    def prefix_hit(self, rid: int, inst: int, dp: int) -> int:
        return self._sim.prefix_hit(rid, inst, dp)

    def fill_prefill(self, inst, unit, budget, admit_new=True, per_request=None):
        raise RuntimeError("a shadow simulator cannot plan colocated batches (fill_prefill admits requests)")

    # -------------------------------------------------------------- actions (the shadow's own)
    def dispatch(self, rid: int, inst: int, dp: int | None = None) -> None:
        raise RuntimeError(f"{type(self).__name__}: dispatch is not a decision of this teacher")

    def reject(self, rid: int, reason: str) -> None:
        raise RuntimeError(f"{type(self).__name__}: reject is not a decision of this teacher")

    def set_timer(self, t: float, owner: str, tag: object = None) -> None:
        """Timers are dropped: a teacher plans for the instant it is asked."""

    def admit(self, rid: int, inst: int, worker: int) -> bool:
        raise RuntimeError(f"{type(self).__name__}: admit is not a decision of this teacher")

    def pause(self) -> None:
        """A teacher never pauses the run."""


class DispatchRecorder(ShadowView):
    """A prefill scheduler's shadow: dispatches are noted in `intents` ({rid: (inst, dp)}), not done;
    rejections are left to the env's own flow control; timers run on the live simulator under the
    tag ("teacher", tag) so the env can hand them back to the teacher."""

    def __init__(self, sim, intents: dict):
        super().__init__(sim)
        self.intents = intents

    def dispatch(self, rid: int, inst: int, dp: int | None = None) -> None:
        self.intents[rid] = (inst, dp)

    def reject(self, rid: int, reason: str) -> None:
        """The env applies its own flow control."""

    def set_timer(self, t: float, owner: str, tag: object = None) -> None:
        self._sim.set_timer(t, "prefill", ("teacher", tag))


class AdmissionDryRun(ShadowView):
    """A decode router's shadow for one step boundary of instance `inst`: admissions update private
    copies of that instance's batch / KV and of the pool, and are recorded in `plan` ({rid: worker}),
    so the router's plan can be read without acting. A worker takes a request when it has a free slot
    and KV room (`feasible`, the engine's admission test)."""

    def __init__(self, sim, inst: int):
        super().__init__(sim)
        d = copy.copy(sim.decode[inst])
        d.batch, d.kv, d.active = d.batch.copy(), d.kv.copy(), [set(a) for a in d.active]
        self._decode = list(sim.decode)
        self._decode[inst] = d
        self._pool = dict(sim.pool)
        self.plan: dict[int, int] = {}

    @property
    def decode(self):
        return self._decode

    @property
    def pool(self):
        return self._pool

    def admit(self, rid: int, inst: int, worker: int) -> bool:
        d = self._decode[inst]
        load = self._sim.req.load(rid)
        if rid not in self._pool or not feasible(d, load)[worker]:
            return False
        del self._pool[rid]
        d.batch[worker] += 1
        d.kv[worker] += load
        d.active[worker].add(rid)
        self.plan[rid] = worker
        return True

    def reject(self, rid: int, reason: str) -> None:
        self._pool.pop(rid, None)


def shadow_teacher(core, sim, teacher) -> None:
    """Make `teacher` the prefill baseline `core` shadows, unless it already is: a DispatchRecorder over the
    core's `intents` (cleared), the teacher reset on it and told of every request already buffered."""
    if core.teacher is teacher:
        return
    core.teacher = teacher
    core.intents.clear()
    core._proxy = DispatchRecorder(sim, core.intents)
    teacher.reset(core._proxy)
    for rid in list(sim.buffer):
        teacher.on_arrival(core._proxy, rid)
