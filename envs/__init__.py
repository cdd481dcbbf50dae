"""pdgym environments: the cluster simulator (`pdgym.envs.sim`) and the Gymnasium envs on top of it.

Importing pdgym (this package's parent, so any pdgym module) registers the environments (pdgym/__init__.py), so
all of these work:

    import pdgym; gym.make("pdgym/DecodeRouting-v0")
    gym.make("pdgym:pdgym/DecodeRouting-v0")          # gymnasium imports pdgym itself (a fresh process)
    gym.make("pdgym.envs:pdgym/DecodeRouting-v0")     # the same, the older spelling

One env per scenario: gym.make(id, scenario=NAME, overrides=[...]); the shared contract (seeding, trace
windows, invalid actions, stalls, rendering) is envs/base.py's PdgymEnv. Each env's entry point and episode
limit are its decision point's (envs/sim/points.py); each formulation of a point's decision has an id of its
own (envs/specs.py's SPECS: PrefillRoute-v0, DecodePick-v0, ...).

Registration does not import gymnasium, nor this package until gymnasium loads (pdgym/__init__.py says how);
`register_envs` below is what it runs.
"""

from __future__ import annotations

from pdgym.envs.sim.points import POINTS
from pdgym.envs.specs import register_specs

# Envs whose decision point is not one of the engine's (POINTS): the capacity decision point runs on the fluid
# model (envs/sim/fluid.py), so it has no pass-level policy protocol; (id, entry point, episode limit).
STANDALONE_ENVS = (("pdgym/CapacityControl-v0", "pdgym.envs.capacity_control:CapacityControlEnv", 600),)


def register_envs() -> None:
    """Register every formulation's id (envs/specs.py) and the env of every decision point with Gymnasium
    (idempotent). Imports gymnasium: `import pdgym` (this package's parent) calls it when gymnasium loads."""
    import gymnasium as gym

    def register(env_id, entry_point, max_episode_steps, kwargs=None):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, max_episode_steps=max_episode_steps, kwargs=kwargs or {})

    register_specs(register)
    for p in POINTS.values():
        register(p.env_id, p.entry_point, p.max_episode_steps)
    for env_id, entry, limit in STANDALONE_ENVS:
        register(env_id, entry, limit)
