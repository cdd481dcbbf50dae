"""The Gymnasium ids of pdgym, one per formulation: the table that names each id's decision point.

A decision point's env (envs/sim/points.py: its id, entry point and episode limit) may pose its decision in
several ways (formulations): PrefillDispatch's timing, allocation, composition and route modes, DecodeRouting's
worker and pick actions, PhaseBatching's phase and threshold modes. Each formulation is an id of its own,
registered with the options that select it, at its point's entry point and episode limit:

    gym.make("pdgym/PrefillRoute-v0", scenario="prefix_mooncake")   # = PrefillDispatch-v0 with mode="route"

The point's own id with a formulation's options (gym.make("pdgym/PrefillDispatch-v0", mode="route")) still
works, as an alias that warns (EnvWarning) and names the id to use. The same formulation's options given to
its id are redundant; contradicting ones are a ConfigError.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pdgym.envs.sim.points import POINTS
from pdgym.envs.sim.validation import ConfigError


@dataclass(frozen=True)
class EnvSpec:
    """One registered id: the decision point whose env runs it and the options that select its formulation."""

    id: str
    point: str
    core: str  # "module:Class" of its policy core (envs/base.py's PolicyCore), as an entry point
    options: Mapping[str, object] = field(default_factory=dict)
    doc: str = ""


SPECS: Mapping[str, EnvSpec] = MappingProxyType({s.id: s for s in (
    EnvSpec("pdgym/PrefillDispatch-v0", "prefill", "pdgym.envs.prefill_dispatch:DispatchCore",
            {}, "timing: hold, or release the buffer to an instance"),
    EnvSpec("pdgym/PrefillAllocation-v0", "prefill", "pdgym.envs.prefill_dispatch:DispatchCore",
            {"mode": "allocation"},
            "allocation: the oldest buffered request to an (instance, DP unit), skip or hold"),
    EnvSpec("pdgym/PrefillComposition-v0", "prefill", "pdgym.envs.prefill_compose:ComposeCore",
            {"mode": "composition"},
            "composition: SBS times the releases, the agent sends the whole buffer, its short or its long half"),
    EnvSpec("pdgym/PrefillRoute-v0", "prefill", "pdgym.envs.prefix_route:RouteCore",
            {"mode": "route"}, "route: each arrival to an (instance, DP unit), cache-aware (envs/prefix_route.py)"),
    EnvSpec("pdgym/PrefillAdmit-v0", "prefill", "pdgym.envs.slo_admit:AdmitCore",
            {"mode": "admit"}, "admit: each arrival admitted or rejected, SLO admission on class tiers (envs/slo_admit.py)"),
    EnvSpec("pdgym/DecodeRouting-v0", "decode", "pdgym.envs.decode_routing:RouterCore",
            {}, "worker: the offered pooled request to a worker, or skip / end"),
    EnvSpec("pdgym/DecodePick-v0", "decode", "pdgym.envs.decode_pick:Picker",
            {"action": "pick"}, "pick: the env names the worker, the agent picks its requests (envs/decode_pick.py)"),
    EnvSpec("pdgym/PhaseBatching-v0", "batching", "pdgym.envs.phase_batching:BatchingCore",
            {}, "phase: each unit-iteration prefill, decode or mixed"),
    EnvSpec("pdgym/BatchingThreshold-v0", "batching", "pdgym.envs.phase_batching:BatchingCore",
            {"mode": "threshold"}, "threshold: EB's phase machine, the agent sets each cycle's theta from a grid"),
    EnvSpec("pdgym/BatchingThresholdContinuous-v0", "batching", "pdgym.envs.phase_batching:BatchingCore",
            {"mode": "threshold", "continuous": True},
            "threshold with a Box action: theta in [theta_min, theta_max] (and MB or EB with choose_mode)"),
)})


def formulation(point: str, options: Mapping) -> EnvSpec | None:
    """The spec of `point` whose options `options` select (the most specific one), or None for a point without specs."""
    fits = [s for s in SPECS.values()
            if s.point == point and all(options.get(k, _MISSING) == v for k, v in s.options.items())]
    return max(fits, key=lambda s: len(s.options), default=None)


def option_values(point: str, key: str, default: object) -> tuple:
    """The values option `key` takes over the formulations of `point` (`default` where a spec leaves it unset), in
    SPECS order: what a core's check of its formulation option allows, so a new row is all it takes."""
    return tuple(dict.fromkeys(s.options.get(key, default) for s in SPECS.values() if s.point == point))


def core_class(point: str, options: Mapping) -> type:
    """The policy-core class of the formulation `options` select at `point` (imports its module)."""
    spec = formulation(point, options)
    if spec is None:
        raise ConfigError(f"env: decision point {point!r} has no formulation in envs/specs.py's SPECS")
    module, name = spec.core.split(":")
    return getattr(importlib.import_module(module), name)


def check_formulation(registered_as: str, point: str, options: Mapping) -> str | None:
    """For an env made as `registered_as` with `options`: a ConfigError if the options contradict that id's
    formulation; the id to name in an alias warning if the point's own id was given another formulation's
    options; else None."""
    spec = SPECS.get(registered_as)
    if spec is None:
        return None
    chosen = formulation(point, options)
    for k, v in spec.options.items():
        if options.get(k, v) != v:
            other = f"; make {chosen.id}" if chosen is not None else ""
            raise ConfigError(f"env.{k}: {registered_as} is {k}={v!r}; got {options[k]!r}{other}")
    if registered_as == POINTS[point].env_id and chosen is not None and chosen.id != registered_as:
        return chosen.id
    return None


_MISSING = object()


def register_specs(register) -> None:
    """Register every spec with `register(id, entry_point, max_episode_steps, kwargs)` at its point's entry."""
    for s in SPECS.values():
        p = POINTS[s.point]
        register(s.id, p.entry_point, p.max_episode_steps, {**s.options, "registered_as": s.id})
