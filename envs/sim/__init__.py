"""The discrete-event P/D cluster simulator (no Gymnasium in here).

    from pdgym.envs.sim import simulate
    result = simulate(config, policies={"prefill": ..., "decode": ..., "batching": ...}, seed=0)
    result.summary(); result.requests; result.steps
"""

from __future__ import annotations

from .config import ConfigError, SimConfig, sim_config
from .engine import Simulator
from .events import EventKind, PassKind
from .metrics import SUMMARY_KEYS, SimResult
from .policy import Batch, BatchingPolicy, DecodeRouter, PrefillScheduler
from .policy_errors import ActionError, PolicyError


def simulate(config, policies: dict | None = None, seed: int = 0) -> SimResult:
    """Run one simulation to completion and return its result.

    `config` is a SimConfig, a dict or an OmegaConf node with the SimConfig fields;
    `policies` maps 'prefill' / 'decode' / 'batching' to policy objects (missing ones get
    the engine defaults of pdgym.envs.sim.policy).
    """
    sim = Simulator(config, policies, seed)
    sim.run()
    return SimResult(sim)


__all__ = [
    "SUMMARY_KEYS",
    "ActionError",
    "Batch",
    "BatchingPolicy",
    "ConfigError",
    "DecodeRouter",
    "EventKind",
    "PassKind",
    "PolicyError",
    "PrefillScheduler",
    "SimConfig",
    "SimResult",
    "Simulator",
    "sim_config",
    "simulate",
]
