"""pdgym environments: the cluster simulator (`pdgym.envs.sim`) and the Gymnasium envs on top of it.

Importing this package registers the environments, so both of these work:

    import pdgym.envs; gym.make("pdgym/DecodeRouting-v0")
    gym.make("pdgym.envs:pdgym/DecodeRouting-v0")     # gymnasium imports the module itself

One env per scenario: gym.make(id, scenario=NAME, overrides=[...]); the shared contract (seeding, trace
windows, invalid actions, stalls, rendering) is envs/base.py's PdgymEnv. Each env's entry point and episode
limit are its decision point's (envs/sim/points.py); each formulation of a point's decision has an id of its
own (envs/specs.py's SPECS: PrefillRoute-v0, DecodePick-v0, ...).

Registration does not import gymnasium (issue 36 item 2): the simulator is this package's `sim` subpackage, so
`pdgym-sim` and everything else that only simulates pass through here, and gymnasium's import was a tenth
of pdgym-sim's import time for envs it never makes. When gymnasium is loaded already the ids are registered
now; otherwise as soon as gymnasium's import completes (a post-import hook on `sys.meta_path`). Entry points
are strings, so no env module is imported until gym.make builds its env.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from pdgym.envs.sim.points import POINTS
from pdgym.envs.specs import register_specs

# Envs whose decision point is not one of the engine's (POINTS): the capacity decision point runs on the fluid
# model (envs/sim/fluid.py), so it has no pass-level policy protocol; (id, entry point, episode limit).
STANDALONE_ENVS = (("pdgym/CapacityControl-v0", "pdgym.envs.capacity_control:CapacityControlEnv", 600),)


def register_envs() -> None:
    """Register every formulation's id (envs/specs.py) and the env of every decision point with Gymnasium
    (idempotent). Imports gymnasium: for registration without it, see `_register_once_gymnasium_loads`."""
    import gymnasium as gym

    def register(env_id, entry_point, max_episode_steps, kwargs=None):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, max_episode_steps=max_episode_steps, kwargs=kwargs or {})

    register_specs(register)
    for p in POINTS.values():
        register(p.env_id, p.entry_point, p.max_episode_steps)
    for env_id, entry, limit in STANDALONE_ENVS:
        register(env_id, entry, limit)


class _RegisterAfterGymnasium(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `gymnasium` through the other finders, runs its module as they would, then `register_envs()`;
    removes itself from `sys.meta_path` at the first import of gymnasium."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "gymnasium":
            return None
        sys.meta_path.remove(self)  # the other finders find the real spec; this one is done after this import
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._real = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        register_envs()


def _register_once_gymnasium_loads() -> None:
    if "gymnasium" in sys.modules:
        register_envs()
    elif not any(isinstance(f, _RegisterAfterGymnasium) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterGymnasium())


_register_once_gymnasium_loads()
