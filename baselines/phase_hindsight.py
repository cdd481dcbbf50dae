"""The hindsight row of a time-varying batching mix: a fixed batching choice per workload phase.

EB runs one threshold for the whole run, set from one constant output-length hazard (ALGORITHMS.md s5);
EB* re-estimates it from completions with a lag, EB+ also picks MB or EB*. When the workload is a sequence
of phases (`workload.phases`: conversation, code, ...), the best a non-adaptive EB could do is the best
fixed choice *per phase*, switched exactly at the phase boundary. `PhaseHindsight` is that policy: it
knows which phase generated the newest arrival (the workload's phase label, which a real scheduler does
not have, hence `oracle: true`), and runs that phase's choice, an EB threshold or MB. The choices come
from a per-phase sweep on the evaluated seeds (pdgym-repro eb_phase_headroom), so the row is a bound
chosen with hindsight, not a policy. Not registered: a board names it `pdgym.baselines.phase_hindsight:PhaseHindsight`
as a headroom row.
"""

from __future__ import annotations

import numpy as np
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import BatchingPolicy

from .exclusive_batching import EB, MB


def parse_choice(c, key: str) -> float | None:
    """'mb' -> None (mixed batching); a number in (0, 1) -> that EB threshold."""
    if isinstance(c, str) and c.lower() == "mb":
        return None
    if isinstance(c, (int, float)) and not isinstance(c, bool) and 0 < float(c) < 1:
        return float(c)
    raise ConfigError(f"{key}: got {c!r}; each choice is an EB threshold in (0, 1) or 'mb'")


class PhaseHindsight(BatchingPolicy):
    """Per workload phase, EB(theta_i) or MB (`choices[i]`, one per phase of `workload.phases`)."""

    name = "phase_hindsight"

    def __init__(self, choices: list | tuple = (0.1,), N: int | None = None, prefill_budget: int | None = None):
        if not isinstance(choices, (list, tuple)) or not choices:
            raise ConfigError(f"policy.batching.choices: got {choices!r}; must be a non-empty list, one per phase")
        self.choices = [parse_choice(c, f"policy.batching.choices[{i}]") for i, c in enumerate(choices)]
        self.eb = EB(theta=0.1, N=N, prefill_budget=prefill_budget)
        self.mb = MB()

    def reset(self, sim):
        if not sim.cfg.oracle:
            raise ConfigError("policy.batching: phase_hindsight knows each request's workload phase, a label a "
                              "scheduler does not have; it runs only as a headroom row (oracle: true)")
        phases = sim.cfg.workload.phases or []
        if len(phases) != len(self.choices):
            raise ConfigError(f"policy.batching.choices: got {len(self.choices)} choices; the workload has "
                              f"{max(len(phases), 1)} phase(s)")
        self.first = np.cumsum([0] + [int(p.num_requests) for p in phases[:-1]])  # each phase's first request id
        self.arrived = 0  # requests arrived so far (open loop: in id order; future arrival times are NaN)
        self.eb.reset(sim)
        self.mb.reset(sim)
        self.phase = -1

    def current_phase(self, sim) -> int:
        """The phase of the newest arrival (phases arrive in order)."""
        arrival = sim.req.arrival
        while self.arrived < len(arrival) and not np.isnan(arrival[self.arrived]):
            self.arrived += 1
        return max(int(np.searchsorted(self.first, self.arrived - 1, side="right")) - 1, 0)

    def next_batch(self, sim, inst, unit):
        ph = self.current_phase(sim)
        if ph != self.phase:
            was_mb = self.phase >= 0 and self.choices[self.phase] is None
            self.phase = ph
            if was_mb and self.choices[ph] is not None:  # EB resumes by finishing chunks in flight (as EB+ does)
                for i, C in enumerate(sim.colocated):
                    for u in range(C.dp):
                        self.eb.resume(i, u, refill=True)
        c = self.choices[ph]
        if c is None:
            return self.mb.next_batch(sim, inst, unit)
        self.eb.theta = c
        return self.eb.next_batch(sim, inst, unit)
