"""The decision points of a cluster, each defined once: the table the engine, the registry and the envs read.

A `DecisionPoint` carries everything that differs from one point to another outside the code that
asks it: its name (`policies[name]` in `simulate()`, `policy/<name>` in configs, the owner of its
timers), the protocol a policy subclasses, the engine's default, the Gymnasium env in which an agent
takes it (id, entry point, episode limit) and its wake-up (what the engine re-checks after one of
its policy's timers fired). The engine builds, checks, resets and times policies from this table;
the baseline registry takes the protocols; `pdgym.envs` registers the envs. Adding a fourth point
(KV eviction, autoscaling, ...) is an entry here plus the call site that asks it: see
docs/architecture.md, "Adding a decision point" (tests/test_decision_points.py adds a toy one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .policy import (
    BatchingPolicy,
    DecodeRouter,
    LeastLoadedAdmission,
    MixedBatching,
    PrefillScheduler,
    RoundRobinDispatch,
)
from .validation import ConfigError, did_you_mean

if TYPE_CHECKING:  # pragma: no cover
    from .host import Host


@dataclass(frozen=True)
class DecisionPoint:
    """One place where a policy decides."""

    name: str
    protocol: type  # what a policy of this point subclasses (policy.py)
    default: type  # the engine's own behaviour when no policy is given
    default_name: str  # the registry name of `default` (a baseline like any other)
    env_id: str  # the Gymnasium env in which an agent takes this decision
    entry_point: str  # "module:Class" of that env (registered by pdgym.envs, imported only by gym.make)
    max_episode_steps: int  # the env's registered truncation (gym.make's TimeLimit)
    wake: Callable[[Host], None] | None  # after a timer of this point's policy: what may now go on
    doc: str
    # an agent's decisions in one simulate() run, per request of the run (envs/base.py's DecisionBudget); None: no
    # bound (each decision moves simulated time, so the simulated-time horizon bounds the run)
    decisions_per_request: float | None = None


def wake_decode(sim: Host) -> None:
    """A router's timer may end a hold on the pool: idle decode instances look at it again."""
    if sim.pool:
        for d in sim.decode:
            d.wake()


def wake_colocated(sim: Host) -> None:
    """A batching policy's timer may end a hold: idle colocated instances ask for a batch again."""
    for C in sim.colocated:
        C.wake()


# Episode limits: about twice the decisions of an episode of the env's default scenario, so a default episode
# ends on its own and a runaway one is cut. Measured (seed 0, random masked agent; PhaseBatching: a decode-first
# agent): PrefillDispatch 2,149 (timing) and 2,082 (allocation) decisions for 2,000 requests, DecodeRouting 13,411
# for 10,000 requests (trace rows 0-9,999; episodes now replay at most the train split's 8,714 rows), PhaseBatching
# 268,267 for 2,000 requests (one decision per unit-iteration). An agent that stalls is cut earlier by the envs'
# stall detection (`stall_s`).
POINTS: dict[str, DecisionPoint] = {p.name: p for p in (
    DecisionPoint("prefill", PrefillScheduler, RoundRobinDispatch, "round_robin", "pdgym/PrefillDispatch-v0",
                  "pdgym.envs.prefill_dispatch:PrefillDispatchEnv", 5_000, None,
                  "global prefill scheduler: when and where buffered requests are dispatched", 10.0),
    DecisionPoint("decode", DecodeRouter, LeastLoadedAdmission, "least_kv", "pdgym/DecodeRouting-v0",
                  "pdgym.envs.decode_routing:DecodeRoutingEnv", 30_000, wake_decode,
                  "decode router: which worker each pooled request joins at a step boundary", 10.0),
    DecisionPoint("batching", BatchingPolicy, MixedBatching, "mixed", "pdgym/PhaseBatching-v0",
                  "pdgym.envs.phase_batching:PhaseBatchingEnv", 600_000, wake_colocated,
                  "batching policy of a colocated instance: each iteration's batch per unit"),
)}


def check_points(given, values: str, key: str = "policies", point_key: str = "policies") -> None:
    """The one check of a mapping decision point -> policy: a ConfigError line unless `given` is a mapping (named
    `key`) whose keys are decision points (each named `point_key.<key>`); `values` says what each maps to."""
    if not isinstance(given, Mapping):
        raise ConfigError(f"{key}: got {given!r} ({type(given).__name__}); must be a mapping decision point "
                          f"({', '.join(POINTS)}) -> {values}")
    for k in given:
        if k not in POINTS:
            raise ConfigError(f"{point_key}.{k}: unknown decision point; {did_you_mean(k, POINTS)}allowed: "
                              f"{', '.join(POINTS)}")


def resolve_policies(given) -> dict:
    """The run's policy at every point: `given[name]` (an object, or a class of the point's protocol, built with no
    arguments), or the point's default; checked against its protocol."""
    out = {}
    check_points(given, "policy object, e.g. {'decode': make_policy('decode', 'least_kv')} (from "
                 "pdgym.baselines import make_policy), or None for the defaults")
    for k, point in POINTS.items():
        pol = given.get(k)
        if pol is None:
            pol = point.default()
        elif isinstance(pol, type) and issubclass(pol, point.protocol):  # a class, as make_policies takes one
            pol = pol()
        if not isinstance(pol, point.protocol):
            hint = (f"; a name becomes one with make_policy({k!r}, {pol!r}) (from pdgym.baselines import "
                    "make_policy)" if isinstance(pol, (str, Mapping)) else "")
            what = f"class {pol.__name__}" if isinstance(pol, type) else type(pol).__name__
            raise ConfigError(f"policies.{k}: {what} is not a {point.protocol.__name__}{hint}")
        out[k] = pol
    return out
