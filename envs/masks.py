"""The action mask where RL clients look for it: in a Dict observation and in info["action_mask"].

pdgym's envs mask through `action_masks()` (sb3-contrib's MaskablePPO calls it); other clients read the mask from the
observation (RLlib's action-masking modules, TorchRL's ActionMask transform, Tianshou's `obs.mask`) under keys of
their own. Two ways to get it there, the same observation either way:

    gym.make("pdgym/DecodeRouting-v0", mask_in_obs=True)                 # the env option (any client, RLlib's env_config)
    ActionMaskObservation(gym.make("pdgym/DecodeRouting-v0"), obs_key="obs", mask_key="mask")   # the wrapper

Both give Dict({obs_key: the env's own observation space, mask_key: MultiBinary(n)}); the mask is the env's
`action_masks()` at the decision the observation is for (a 0/1 int8 vector of the Discrete action space's size, at
least one 1). Every env also puts it in info["action_mask"] (bool) at reset and step, option or not.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pdgym.envs.sim.validation import check

OBS_KEY = "observation"
MASK_KEY = "action_mask"


def check_keys(obs_key, mask_key) -> None:
    """Two different non-empty strings (env.obs_key / env.mask_key): a Dict observation's keys."""
    for key, v in (("env.obs_key", obs_key), ("env.mask_key", mask_key)):
        check(isinstance(v, str) and v != "", key, f"got {v!r}; must be a non-empty string")
    check(obs_key != mask_key, "env.mask_key", f"got {mask_key!r}, the same as obs_key; the two keys must differ")


def masked_space(obs_space: spaces.Space, action_space: spaces.Space, obs_key: str = OBS_KEY,
                 mask_key: str = MASK_KEY) -> spaces.Dict:
    """The Dict observation space: the env's observation under `obs_key`, the mask of a Discrete action space under
    `mask_key`. A Box action has no mask to give (ConfigError naming env.mask_in_obs)."""
    check(isinstance(action_space, spaces.Discrete), "env.mask_in_obs",
          f"needs a Discrete action space; this formulation's is {type(action_space).__name__} (no action to mask)")
    return spaces.Dict({obs_key: obs_space, mask_key: spaces.MultiBinary(int(action_space.n))})


def masked_obs(obs, mask: np.ndarray, obs_key: str = OBS_KEY, mask_key: str = MASK_KEY) -> dict:
    return {obs_key: obs, mask_key: np.asarray(mask, dtype=np.int8)}


class ActionMaskObservation(gym.ObservationWrapper):
    """Any env with `action_masks()` (pdgym's, or another's sb3-contrib masks) with the mask in a Dict observation
    (module docstring); `action_masks()` stays callable through the wrapper."""

    def __init__(self, env: gym.Env, obs_key: str = OBS_KEY, mask_key: str = MASK_KEY):
        super().__init__(env)
        check_keys(obs_key, mask_key)
        self.obs_key, self.mask_key = obs_key, mask_key
        self.observation_space = masked_space(env.observation_space, env.action_space, obs_key, mask_key)

    def observation(self, observation):
        return masked_obs(observation, self.env.unwrapped.action_masks(), self.obs_key, self.mask_key)

    def action_masks(self) -> np.ndarray:
        return self.env.unwrapped.action_masks()
