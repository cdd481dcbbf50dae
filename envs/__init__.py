"""pdgym environments: the cluster simulator (`pdgym.envs.sim`) and the Gymnasium envs on top of it.

Importing this package registers the environments, so both of these work:

    import pdgym.envs; gym.make("pdgym/DecodeRouting-v0")
    gym.make("pdgym.envs:pdgym/DecodeRouting-v0")     # gymnasium imports the module itself

One env per scenario: gym.make(id, scenario=NAME, overrides=[...]); the shared contract (seeding, trace
windows, invalid actions, stalls, rendering) is envs/base.py's PdgymEnv. Each env's id, entry point and
episode limit are its decision point's (envs/sim/points.py).
"""

from __future__ import annotations

import gymnasium as gym
from pdgym.envs.sim.points import POINTS


def register_envs() -> None:
    """Register the env of every decision point with Gymnasium (idempotent)."""
    for p in POINTS.values():
        if p.env_id not in gym.registry:
            gym.register(id=p.env_id, entry_point=p.entry_point, max_episode_steps=p.max_episode_steps)


register_envs()
