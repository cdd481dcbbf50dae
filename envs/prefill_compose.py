"""PrefillComposition-v0's policy core: SBS times the releases, the agent composes each one.

`ComposeCore` is DispatchCore (envs/prefill_dispatch.py: its observation, with the composition features on) with
SBS (baselines/sbs.py) owning the events: SBS keeps its interval, readiness and watchdog, and where it would release
to an instance it calls the core instead (`SBS.hook_release`), whose decision sends the whole buffer, its short or
its long prompts (split at the median prompt of the last 256 arrivals: baselines/length_classes.py). The env's
docstring (PrefillDispatchEnv, mode="composition") documents the actions and features.
"""

from __future__ import annotations

import numpy as np
from pdgym.baselines.length_classes import LengthClasses
from pdgym.baselines.sbs import SBS
from pdgym.baselines.shared import LengthSplit, Releaser
from pdgym.envs.prefill_dispatch import DispatchCore
from pdgym.envs.sim.policy import PrefillScheduler


class ComposeCore(DispatchCore):
    """The composition formulation's policy core (envs/base.py's PolicyCore)."""

    composition = True

    def __init__(self, mode: str = "composition", tick_s: float = 0.02, obs_requests: int = 16, window: int = 32,
                 n_limit: int = 3, overload: str = "reject", cache_aware: bool = False, mask_full: bool = True):
        super().__init__(mode, tick_s, obs_requests, window, n_limit, overload, cache_aware, mask_full)

    def _models(self, window: int, n_limit: int, overload: str, cache_aware: bool) -> None:
        self.sbs: Releaser = SBS(allocation="pbaa_cache" if cache_aware else "pbaa", window=window, n_limit=n_limit,
                                 overload=overload)
        self.sbs.hook_release(self._release_due)
        self.cap, self.pbaa = self.sbs.cap, self.sbs.pbaa
        self.classes: LengthSplit = LengthClasses()

    def set_dims(self, n: int, dp: int) -> None:
        super().set_dims(n, dp)
        self.n_actions, self.skip = 3, None

    def action_meanings(self) -> list[str]:
        return ["release the whole buffer", "release the short prompts (<= the median)",
                "release the long prompts (> the median)"]

    def describe(self, sim, a: int) -> str:
        nb = len(sim.buffer)
        to = f" -> prefill {self._target}" if self._target is not None else ""
        if a == 0:
            return f"release the whole buffer ({nb} request{'s' if nb != 1 else ''}){to}"
        med, work = self.classes.median, sim.req.work
        n = sum((work[r] <= med) == (a == 1) for r in sim.buffer)
        half = "short half (<=" if a == 1 else "long half (>"
        return f"release the {half} {med:.0f} tok: {n} of {nb} requests){to}"

    # -------------------------------------------------------------- SBS owns the events
    def reset(self, sim) -> None:
        super().reset(sim)
        self.sbs.reset(sim)
        self.classes.reset()

    def on_arrival(self, sim, rid: int) -> None:
        if self._arrivals.note(sim, rid):
            self.classes.arrived(int(sim.req.work[rid]))
        self.sbs.on_arrival(sim, rid)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self.sbs.on_end_forward(sim, inst, fwd_time)

    def on_topology_change(self, sim) -> None:
        self._healthy = sim.prefill_healthy[: self.n].copy()
        self.sbs.on_topology_change(sim)

    def on_timer(self, sim, tag) -> None:
        self.sbs.on_timer(sim, tag)

    def poll(self, sim) -> None:
        """SBS polls for itself."""

    def _release_due(self, sim, target: int) -> None:
        """SBS's release hook: SBS would release to `target` now; the agent composes it (`apply`)."""
        self._target = target
        self.decide(sim)

    # -------------------------------------------------------------- the decision
    def context(self, sim):
        o = super().context(sim)
        if o.nb:
            o.short, o.long = self.classes.split(sim)
        return o

    def mask(self, sim) -> np.ndarray:
        m = np.zeros(self.n_actions, dtype=bool)
        m[0] = True
        if sim.buffer:
            short, long = self.classes.split(sim)
            m[1], m[2] = bool(short), bool(long)
        return m

    def apply(self, sim, a: int) -> bool:
        target, self._target = self._target, None
        if target is not None and sim.buffer:
            self.sbs.release(sim, target, self.classes.members(sim, a))
            self.last_release = sim.now
        return False

    def teacher_action(self, sim, teacher: PrefillScheduler) -> int:
        """SBS(compose="length") composes by its rule; any other teacher releases the whole buffer."""
        return self.classes.rule(sim) if getattr(teacher, "classes", None) is not None else 0
