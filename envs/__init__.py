"""pdgym environments: the cluster simulator (`pdgym.envs.sim`) and the Gymnasium envs on top of it.

Importing this package registers the environments, so both of these work:

    import pdgym.envs; gym.make("pdgym/DecodeRouting-v0")
    gym.make("pdgym.envs:pdgym/DecodeRouting-v0")     # gymnasium imports the module itself

One env per scenario: gym.make(id, scenario=NAME, overrides=[...]); the shared contract (seeding, trace
windows, invalid actions, stalls, rendering) is envs/base.py's PdgymEnv.
"""

from __future__ import annotations

import gymnasium as gym

ENVS = {
    "pdgym/PrefillDispatch-v0": "pdgym.envs.prefill_dispatch:PrefillDispatchEnv",
    "pdgym/DecodeRouting-v0": "pdgym.envs.decode_routing:DecodeRoutingEnv",
    "pdgym/PhaseBatching-v0": "pdgym.envs.phase_batching:PhaseBatchingEnv",
}


# Registered truncation (gym.make wraps the env in TimeLimit): about twice the decisions of an episode of
# the env's default scenario, so a default episode ends on its own and a runaway one is cut. Measured
# (seed 0, random masked agent; PhaseBatching: a decode-first agent): PrefillDispatch 2,149 (timing) and
# 2,082 (allocation) decisions for 2,000 requests, DecodeRouting 13,411 for 10,000 requests (trace rows
# 0-9,999; episodes now replay at most the train split's 8,714 rows), PhaseBatching 268,267 for 2,000
# requests (one decision per unit-iteration).
# An agent that stalls is cut earlier by the envs' stall detection (`stall_s`).
MAX_EPISODE_STEPS = {
    "pdgym/PrefillDispatch-v0": 5_000,
    "pdgym/DecodeRouting-v0": 30_000,
    "pdgym/PhaseBatching-v0": 600_000,
}


def register_envs() -> None:
    """Register every pdgym environment with Gymnasium (idempotent)."""
    for env_id, entry in ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry, max_episode_steps=MAX_EPISODE_STEPS[env_id])


register_envs()
