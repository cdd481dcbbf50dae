"""The decision points of a cluster, each defined once: name, protocol, engine default, env id.

The simulator (which policy slot exists and what it defaults to), the baseline registry
(which protocol a registered class must subclass), evaluation (which points exist) and
the Gymnasium envs (their ids) all read this table. Adding a fourth point (KV eviction,
autoscaling, ...) starts here: see docs/architecture.md, "Adding a decision point".
"""

from __future__ import annotations

from dataclasses import dataclass

from .policy import (
    BatchingPolicy,
    DecodeRouter,
    LeastLoadedAdmission,
    MixedBatching,
    PrefillScheduler,
    RoundRobinDispatch,
)


@dataclass(frozen=True)
class DecisionPoint:
    """One place where a policy decides: `policies[name]` in `simulate()`, `policy/<name>` in configs."""

    name: str
    protocol: type  # what a policy of this point subclasses (policy.py)
    default: type  # the engine's own behaviour when no policy is given
    default_name: str  # the registry name of `default` (a baseline like any other)
    env_id: str  # the Gymnasium env in which an agent takes this decision
    doc: str


POINTS: dict[str, DecisionPoint] = {p.name: p for p in (
    DecisionPoint("prefill", PrefillScheduler, RoundRobinDispatch, "round_robin", "pdgym/PrefillDispatch-v0",
                  "global prefill scheduler: when and where buffered requests are dispatched"),
    DecisionPoint("decode", DecodeRouter, LeastLoadedAdmission, "least_kv", "pdgym/DecodeRouting-v0",
                  "decode router: which worker each pooled request joins at a step boundary"),
    DecisionPoint("batching", BatchingPolicy, MixedBatching, "mixed", "pdgym/PhaseBatching-v0",
                  "batching policy of a colocated instance: each iteration's batch per unit"),
)}
