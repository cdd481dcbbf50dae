"""pdgym from other RL clients (issue 45): Python's keyword convention, registration in fresh processes, the mask
where clients look, and TorchRL's GymEnv. RLlib and Tianshou run in side environments (`make clients-check`:
tests/test_rllib.py, tests/test_tianshou.py); everything here runs in `make test`."""

from __future__ import annotations

import functools
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pdgym  # noqa: F401  (registers the envs)
import pytest
from conftest import doc_example
from gymnasium.vector import AsyncVectorEnv
from pdgym.envs.masks import ActionMaskObservation
from pdgym.envs.sim import ConfigError

SMALL = ["workload.num_requests=40"]
DISCRETE = {  # every Discrete formulation's id, small
    "pdgym/DecodeRouting-v0": {"scenario": "decode_tier_n8", "overrides": SMALL},
    "pdgym/DecodePick-v0": {"scenario": "decode_tier_n8", "overrides": SMALL},
    "pdgym/PrefillDispatch-v0": {"overrides": SMALL},
    "pdgym/PrefillAllocation-v0": {"overrides": SMALL},
    "pdgym/PrefillComposition-v0": {"overrides": SMALL},
    "pdgym/PhaseBatching-v0": {"overrides": [*SMALL, "workload.concurrency=16"]},
}


def fresh(code: str) -> str:
    """stdout of `code` in a new interpreter (this process has imported pdgym already)."""
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


# ------------------------------------------------------------------ item 1: Python's and Gymnasium's conventions
@pytest.mark.parametrize("env_id", ["pdgym/DecodeRouting-v0", "pdgym/PrefillDispatch-v0", "pdgym/PhaseBatching-v0"])
def test_an_unknown_keyword_is_a_type_error(env_id):
    """TorchRL's GymEnv passes frameskip and retries without it only on Python's TypeError; the apps' one line
    (a ConfigError naming env.KEY) stays."""
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'frameskip'") as info:
        gym.make(env_id, frameskip=1)
    assert isinstance(info.value, ConfigError) and str(info.value).startswith("env.frameskip: unknown option")


def test_the_env_constructor_follows_the_same_convention():
    from pdgym.envs.decode_routing import DecodeRoutingEnv

    with pytest.raises(TypeError, match=r"DecodeRoutingEnv\(\) got an unexpected keyword argument 'frameskip'"):
        DecodeRoutingEnv(frameskip=1)


def test_a_bad_value_of_a_known_keyword_stays_a_config_error():
    with pytest.raises(ConfigError, match=r"env\.action: got 'pointer'") as info:
        gym.make("pdgym/DecodeRouting-v0", action="pointer")
    assert not isinstance(info.value, TypeError)


def test_import_pdgym_registers_and_the_module_prefix_works_in_a_fresh_process():
    """`import pdgym` registers (it was a namespace package: nothing); "pdgym:pdgym/..." makes gymnasium import it."""
    assert fresh("import pdgym, gymnasium as gym; print('pdgym/DecodeRouting-v0' in gym.registry)") == "True"
    code = ("import sys, gymnasium as gym; e = gym.make('pdgym:pdgym/DecodeRouting-v0'); "
            "print(type(e.unwrapped).__name__, 'pdgym' in sys.modules)")
    assert fresh(code) == "DecodeRoutingEnv True"


def test_a_library_probing_for_gymnasium_does_not_lose_the_registration():
    """TorchRL asks importlib.util.find_spec('gymnasium') at import, before importing it: the post-import hook must
    survive a find_spec that imports nothing (it removed itself there, and the envs were never registered)."""
    code = ("import pdgym, importlib.util; importlib.util.find_spec('gymnasium'); import gymnasium as gym; "
            "print('pdgym/DecodeRouting-v0' in gym.registry)")
    assert fresh(code) == "True"


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_spawned_async_vector_env_steps(context):
    """Spawned workers run none of this process's imports: `pdgym:` makes each worker register (RLlib's env runners
    are the same case). Two workers step twice with allowed actions."""
    make = functools.partial(gym.make, "pdgym:pdgym/DecodeRouting-v0", **DISCRETE["pdgym/DecodeRouting-v0"])
    venv = AsyncVectorEnv([make, make], context=context)
    try:
        obs, info = venv.reset(seed=[0, 1])
        assert obs.shape[0] == 2 and info["action_mask"].shape == (2, venv.single_action_space.n)
        for _ in range(2):
            actions = np.array([int(np.flatnonzero(m)[0]) for m in info["action_mask"]])
            obs, _, _, _, info = venv.step(actions)
            assert venv.observation_space.contains(obs)
    finally:
        venv.close()


# ------------------------------------------------------------------ item 2: the mask where clients look
def play(env, steps: int, mask_of) -> int:
    """Step `env` with random allowed actions; at every observation (the last of an episode too) the mask in obs
    and info is action_masks(). Returns the episodes ended."""
    obs, info = env.reset(seed=0)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(steps):
        mask = env.unwrapped.action_masks()
        assert env.observation_space.contains(obs)
        assert np.array_equal(info["action_mask"], mask) and info["action_mask"].dtype == bool and mask.any()
        if mask_of is not None:
            assert np.array_equal(mask_of(obs).astype(bool), mask)
        obs, _, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        if term or trunc:
            assert env.observation_space.contains(obs) and np.array_equal(info["action_mask"], env.unwrapped.action_masks())
            if mask_of is not None:
                assert np.array_equal(mask_of(obs).astype(bool), info["action_mask"])
            obs, info = env.reset()
            ended += 1
    return ended


@pytest.mark.parametrize("env_id", sorted(DISCRETE))
def test_the_mask_option_puts_the_mask_in_obs_and_info(env_id):
    env = gym.make(env_id, mask_in_obs=True, obs_key="obs", mask_key="mask", **DISCRETE[env_id])
    assert set(env.observation_space.spaces) == {"obs", "mask"}
    assert play(env, 400, lambda o: o["mask"]) >= 1  # an episode's last observation is masked too


def test_the_wrapper_and_the_plain_env():
    env = gym.make("pdgym/DecodeRouting-v0", **DISCRETE["pdgym/DecodeRouting-v0"])
    play(env, 30, None)  # info["action_mask"] without the option
    wrapped = ActionMaskObservation(gym.make("pdgym/DecodeRouting-v0", **DISCRETE["pdgym/DecodeRouting-v0"]))
    assert set(wrapped.observation_space.spaces) == {"observation", "action_mask"}
    play(wrapped, 30, lambda o: o["action_mask"])
    assert np.array_equal(wrapped.action_masks(), wrapped.unwrapped.action_masks())  # SB3's call, through the wrapper


def test_bad_mask_options_are_one_line():
    with pytest.raises(ConfigError, match=r"env\.mask_in_obs: needs a Discrete action space"):
        gym.make("pdgym/BatchingThresholdContinuous-v0", mask_in_obs=True)
    with pytest.raises(ConfigError, match=r"env\.mask_key: got 'x', the same as obs_key"):
        gym.make("pdgym/DecodeRouting-v0", mask_in_obs=True, obs_key="x", mask_key="x")


# ------------------------------------------------------------------ TorchRL (a dev dependency)
def test_torchrl_example():
    """docs/clients.md's TorchRL example: GymEnv builds a pdgym env (it passes frameskip, which raised ConfigError)
    and rolls out with the mask (ActionMask), every action drawn allowed (the example asserts it)."""
    pytest.importorskip("torchrl.envs")
    td = doc_example("torchrl")["td"]
    assert td.batch_size[0] == 20 and td["action_mask"].shape[-1] == td["action"].shape[-1]
