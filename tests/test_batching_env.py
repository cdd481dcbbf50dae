"""PhaseBatching-v0: Gymnasium / SB3 compliance, masks, seeding, vector envs and the AgentPolicy adapter."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the ids)
import pytest
from gymnasium.utils.env_checker import check_env
from pdgym.envs.phase_batching import ENV_ID, AgentPolicy, PhaseBatchingEnv, make_env
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, simulate
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.vec_env import DummyVecEnv

SMALL = ["workload.num_requests=120", "workload.concurrency=48"]


def rollout(env, seed, pick=None):
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    total, n, done, info = 0.0, 0, False, {}
    while not done:
        m = env.action_masks()
        assert m.dtype == np.bool_ and m.any()
        a = pick(obs, m) if pick else int(rng.choice(np.flatnonzero(m)))
        obs, r, term, trunc, info = env.step(a)
        assert env.observation_space.contains(obs)
        total, n, done = total + r, n + 1, term or trunc
    return total, n, info


@pytest.mark.parametrize("kw", [{"mode": "phase"}, {"mode": "threshold", "choose_mode": True},
                                {"mode": "threshold", "continuous": True}])
def test_checkers_pass(kw):
    """Gymnasium's and SB3's checkers find nothing: an error raises, and so does any warning they give (SB3's
    advice included: a non-normalised Box action, bounds it cannot use, ...)."""
    env = make_env(overrides=SMALL, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
        sb3_check_env(env, warn=True)
    assert not [f"{w.category.__name__}: {w.message}" for w in caught]
    obs, _ = env.reset(seed=0)  # and the env the checkers passed still plays: an allowed action steps it
    m = env.action_masks()
    assert env.observation_space.contains(obs) and m.any()
    action = np.zeros(1, dtype=np.float32) if kw.get("continuous") else int(np.flatnonzero(m)[0])
    assert env.observation_space.contains(env.step(action)[0])


def test_seeded_episodes_are_reproducible_and_finish_every_request():
    env = make_env(overrides=SMALL)
    a = rollout(env, 3)
    b = rollout(env, 3)
    for run in (a, b):
        del run[2]["summary"]["wall_time_s"]
    assert np.array_equal(a[2].pop("action_mask"), b[2].pop("action_mask"))  # an array: compared apart
    assert a == b
    assert a[2]["completed"] == 120 and a[1] > 0


def test_phase_masks_are_feasible_and_enforced():
    env = make_env(overrides=SMALL, skip_forced=False)
    env.reset(seed=0)
    m = env.action_masks()
    assert m.tolist() == [True, False, False]  # at t=0 nothing decodes yet
    info = env.step(1)[4]  # masked: replaced by the default action (prefill, the only one allowed), counted
    assert info["invalid_actions"] == 1 and env.core.unit_state(0, 0).last == 0
    u = env.sim.colocated[0].units[0]
    assert env.action_masks()[1] == (u.n_decoding > 0)
    forced = make_env(overrides=SMALL)  # skip_forced: only real choices reach the agent
    forced.reset(seed=0)
    assert forced.action_masks().sum() >= 2


def test_phase_always_decode_when_possible_is_slower_than_mixed():
    """Sanity of the action semantics: an agent that starves prefill loses to decode-maximal mixing."""
    env = make_env(overrides=SMALL)

    def mixed_first(obs, m):
        return 2 if m[2] else int(np.flatnonzero(m)[0])

    def decode_first(obs, m):
        return 1 if m[1] else int(np.flatnonzero(m)[0])

    assert rollout(env, 0, mixed_first)[2]["rps"] > rollout(env, 0, decode_first)[2]["rps"]


def test_threshold_mode_mb_choice_matches_mb_baseline():
    env = make_env(overrides=SMALL, mode="threshold", choose_mode=True, theta_grid=[0.1, 0.3])
    _, n, _info = rollout(env, 0, lambda obs, m: 2)  # action >= len(grid): MB, every cycle
    sc = load_scenario("coloc_h200_qwen3_8b", SMALL)
    agent_res = simulate(sc.sim, {"batching": AgentPolicy(lambda o, m: 2, mode="threshold", choose_mode=True,
                                                            theta_grid=[0.1, 0.3])}, seed=0)
    from pdgym.baselines import make_policy

    mb = simulate(sc.sim, {"batching": make_policy("batching", "mb")}, seed=0)
    assert agent_res.summary()["rps"] == pytest.approx(mb.summary()["rps"])
    assert n >= 1


def test_agent_policy_replays_the_env_decisions():
    """The same deterministic agent through simulate() and through the env: the same run up to the order of
    same-instant events (the env replays a paused iteration after them)."""
    kw = {"mode": "phase"}

    def agent(obs, m):
        return int(np.flatnonzero(m)[-1])

    env = make_env(overrides=SMALL, **kw)
    env.reset(seed=5)
    sim_seed = env.sim.seed
    _, _, info = rollout(env, 5, agent)
    sc = load_scenario("coloc_h200_qwen3_8b", SMALL)
    res = simulate(sc.sim, {"batching": AgentPolicy(agent, scenario="coloc_h200_qwen3_8b", overrides=SMALL, **kw)},
                   seed=sim_seed)
    assert res.summary()["finished"] == info["completed"]
    assert env.sim.now == pytest.approx(float(res.requests.finish.max()), rel=0.02)


def test_dp2_asks_each_unit():
    env = make_env(overrides=SMALL + ["cluster.colocated.dp=2"], max_dp=4)
    env.reset(seed=1)
    units = set()
    done = False
    while not done:
        units.add(env._unit)
        m = env.action_masks()
        _obs, _, term, trunc, _ = env.step(int(np.flatnonzero(m)[0]))
        done = term or trunc
    assert units == {0, 1}


def test_make_vec_and_dummy_vec_env():
    vec = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", overrides=SMALL)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (2, vec.single_observation_space.shape[0])
    obs, _r, _term, _trunc, _ = vec.step(np.zeros(2, dtype=int))  # prefill is feasible at t=0
    vec.close()
    dv = DummyVecEnv([lambda: make_env(overrides=SMALL, mode="threshold")] * 2)
    dv.seed(0)
    assert dv.reset().shape[0] == 2
    dv.step(np.array([1, 2]))


@pytest.mark.parametrize("kw,key", [({"mode": "chaos"}, "env.mode"), ({"theta_grid": [0.0, 2]}, "env.theta_grid"),
                                    ({"reward": "joy"}, "env.reward"), ({"max_dp": 0}, "env.max_dp"),
                                    ({"batching": "nope"}, "policy.batching.name")])
def test_bad_kwargs_fail_with_one_line(kw, key):
    with pytest.raises(ConfigError) as exc:
        PhaseBatchingEnv(overrides=SMALL, **kw)
    assert key in str(exc.value) and "\n" not in str(exc.value)
