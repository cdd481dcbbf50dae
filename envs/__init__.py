"""pdgym environments: the cluster simulator (`pdgym.envs.sim`) and the Gymnasium envs on top of it.

Importing this package registers the environments, so both of these work:

    import pdgym.envs; gym.make("pdgym/DecodeRouting-v0")
    gym.make("pdgym.envs:pdgym/DecodeRouting-v0")     # gymnasium imports the module itself
"""

from __future__ import annotations

import gymnasium as gym

ENVS = {
    "pdgym/PrefillDispatch-v0": "pdgym.envs.prefill_dispatch:PrefillDispatchEnv",
    "pdgym/DecodeRouting-v0": "pdgym.envs.decode_routing:DecodeRoutingEnv",
    "pdgym/PhaseBatching-v0": "pdgym.envs.phase_batching:PhaseBatchingEnv",
}


def register_envs() -> None:
    """Register every pdgym environment with Gymnasium (idempotent)."""
    for env_id, entry in ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry)


register_envs()
