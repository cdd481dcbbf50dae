"""The environments a run trains in: one env per trace segment cycled per vector-env worker, vector envs
(dummy or subprocess) and the probe that tells the network builder the observation layout.

Shared by training (train.py) and behaviour cloning (imitation.py), which both need the exact envs of
the training split.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
from pdgym.agents.evaluation import candidates
from pdgym.envs.splits import segment, segment_overrides, split_rows


class SegmentCycle(gym.Env):
    """One env per training segment of a trace; each reset moves to the next, so a vector env's worker
    sees several disjoint stretches of traffic instead of replaying one (action masks pass through)."""

    def __init__(self, factories: list, start: int = 0):
        self._factories = factories
        self._envs: dict[int, gym.Env] = {}
        self._i = start % len(factories)
        self._first = True
        env = self._env()
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.metadata = getattr(env, "metadata", {})
        self.obs_layout = getattr(env.unwrapped, "obs_layout", None)

    def _env(self) -> gym.Env:
        if self._i not in self._envs:
            self._envs[self._i] = self._factories[self._i]()
        return self._envs[self._i]

    def reset(self, *, seed=None, options=None):
        if not self._first:
            self._i = (self._i + 1) % len(self._factories)
        self._first = False
        super().reset(seed=seed)
        if seed is None:  # each segment env keeps its own stream after the first seeded reset
            seed = int(self.np_random.integers(2**31)) if len(self._envs) < len(self._factories) else None
        return self._env().reset(seed=seed, options=options)

    def step(self, action):
        return self._env().step(action)

    @property
    def unwrapped(self) -> gym.Env:
        """The current segment's env (its teacher_action, obs_layout, ...)."""
        return self._env().unwrapped

    def action_masks(self) -> np.ndarray:
        return self._env().unwrapped.action_masks()

    def close(self):
        for e in self._envs.values():
            e.close()


def _make(env_id: str, kwargs: dict) -> gym.Env:
    return candidates.make_env(env_id, **kwargs)


def env_kwargs(env, overrides: list[str]) -> dict:
    """What make_env (and AgentPolicy, which ignores the scenario-level keys) gets: scenario, Hydra-style
    overrides, the baselines at the other decision points (kwargs named after the point), the env options."""
    return {"scenario": env.scenario, "overrides": list(overrides), **env.policies, **env.kwargs}


def scenario_raw(env) -> dict:
    """The composed scenario the env trains on (the same composition the env does itself)."""
    from pdgym.envs.scenario import load_scenario

    raw = load_scenario(env.scenario, list(env.overrides)).raw
    pol = dict(raw.get("policy") or {})
    pol.update(env.policies)
    return dict(raw, policy=pol)


def env_factories(env, raw: dict, split: dict, n_envs: int, max_segments: int) -> list:
    """n_envs picklable callables building the training envs (trace workloads: a SegmentCycle each)."""
    if not segment(raw["workload"], split, 0):
        return [partial(_make, env.id, env_kwargs(env, env.overrides)) for _ in range(n_envs)]
    lo, hi, n = split_rows(str(raw["workload"]["trace"]), split, int(raw["workload"]["num_requests"]))
    k = int(max(1, min(max_segments * n_envs, (hi - lo) // n)))
    segs = [partial(_make, env.id, env_kwargs(env, [*env.overrides, *segment_overrides(raw, split, j)]))
            for j in range(k)]
    return [partial(SegmentCycle, segs, start=i * max(1, k // n_envs)) for i in range(n_envs)]


def make_vec_env(app, env, raw: dict, split: dict):
    """DummyVecEnv (one process) or SubprocVecEnv (one process per env) under a VecMonitor, seeded from
    the split's seed base so two runs' seeds never share traffic."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

    fns = env_factories(env, raw, split, app.n_envs, app.max_segments)
    venv = SubprocVecEnv(fns) if app.vec_env == "subproc" else DummyVecEnv(fns)
    venv = VecMonitor(venv)
    venv.seed(int(split["seed_base"]) + 1000 * app.seed)
    return venv


def probe(venv) -> SimpleNamespace:
    """What the network builder reads from an env (observation layout, spaces), for any vector env: a
    subprocess worker's env is not reachable as an object, so its `obs_layout` is fetched by get_attr."""
    try:
        layout = venv.get_attr("obs_layout", [0])[0]
    except AttributeError:
        layout = None
    return SimpleNamespace(obs_layout=layout, observation_space=venv.observation_space,
                           action_space=venv.action_space)
