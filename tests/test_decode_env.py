"""DecodeRouting-v0: API compliance, seeding, masks, rewards, AgentPolicy and teacher parity."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the envs)
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdgym.baselines import make_policy
from pdgym.envs.decode_routing import ENV_ID, N_GLOBAL, N_WORKER, AgentPolicy, make_env
from pdgym.envs.sim import ConfigError, simulate

SMALL = {"scenario": "decode_tier_n8", "overrides": ["workload.num_requests=150", "workload.rate=400"]}


def least_kv_predict(n_slots: int, per: int = N_WORKER):
    """An agent that puts the head on the feasible worker with the least KV (never ends early)."""

    def predict(obs, mask):
        w = obs[N_GLOBAL:].reshape(n_slots, per)
        loads = np.where(mask[:n_slots], w[:, 1], np.inf)
        return int(np.argmin(loads)) if np.isfinite(loads).any() else n_slots

    return predict


def run_episode(env, policy, seed):
    obs, _ = env.reset(seed=seed)
    trace, total = [obs], 0.0
    while True:
        obs, r, term, trunc, info = env.step(policy(obs, env.action_masks()))
        trace.append(obs)
        total += r
        if term or trunc:
            return np.asarray(trace), total, info


def test_gymnasium_and_sb3_checkers_pass():
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    check_env(make_env(**SMALL), skip_render_check=True)
    sb3_check_env(make_env(**SMALL))


def test_seeding_is_reproducible():
    env = make_env(scenario="decode_tier_ht_n8", overrides=["workload.num_requests=150", "workload.rate=300"])
    pol = least_kv_predict(8)
    a, ra, _ = run_episode(env, pol, seed=5)
    b, rb, _ = run_episode(env, pol, seed=5)
    c, _, _ = run_episode(env, pol, seed=6)
    assert a.shape == b.shape and np.array_equal(a, b) and ra == rb
    assert a.shape != c.shape or not np.array_equal(a, c)


def test_vector_envs():
    venv = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", **SMALL)
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (2, N_GLOBAL + 8 * N_WORKER)
    for _ in range(5):
        obs, r, _term, _trunc, _ = venv.step(np.array([0, 1]))
    venv.close()
    from stable_baselines3.common.vec_env import DummyVecEnv

    dv = DummyVecEnv([lambda: make_env(**SMALL)] * 2)
    dv.seed(3)
    o = dv.reset()
    o, r, _d, _ = dv.step(np.array([8, 9]))
    assert o.shape == (2, N_GLOBAL + 8 * N_WORKER) and r.shape == (2,)


def test_masks_match_capacity_and_episode_resolves_everything():
    env = make_env(scenario="decode_tier_n8", overrides=["workload.num_requests=200", "workload.rate=600",
                                                          "cluster.decode.batch_limit=8"], max_workers=12)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=1)
    assert env.obs_layout == {"n_slots": 12, "per_slot_dim": N_WORKER, "global_dim": N_GLOBAL,
                              "slots_first": False, "mask_index": 0}
    ends = 0
    while True:
        m = env.action_masks()
        d = env.sim.decode[0]
        head = env.core.head
        load = int(env.sim.req.prompt[head] + env.sim.req.done[head])
        ok = (d.batch < d.batch_limit) & (d.kv + load <= d.kv_cap)
        assert np.array_equal(m[:8], ok) and not m[8:12].any()
        assert m[12] == m[13] == bool(d.batch.any())
        assert obs[N_GLOBAL:].reshape(12, N_WORKER)[:8, 0].all() and not obs[N_GLOBAL + 8 * N_WORKER:].any()
        a = int(rng.choice(np.flatnonzero(m)))
        ends += a == 12
        obs, r, term, _trunc, info = env.step(a)
        assert r <= 0.0
        if term:
            break
    assert ends > 0
    s = info["summary"]
    assert s["finished"] + s["rejected"] == 200 and not env.sim.stalled and info["invalid_actions"] == 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), n=st.integers(1, 6), limit=st.integers(1, 8), kv=st.integers(9000, 60000),
       order=st.sampled_from(["length", "arrival"]), skip=st.booleans(), p_end=st.floats(0.0, 0.9))
def test_random_agents_never_strand_a_request(seed, n, limit, kv, order, skip, p_end):
    env = make_env(scenario="decode_tier_ht_n8", order=order, skip=skip,
                   overrides=["workload.num_requests=60", "workload.rate=300", f"cluster.decode.dp={n}",
                              f"cluster.decode.ep={n}", f"cluster.decode.batch_limit={limit}",
                              f"cluster.decode.kv_capacity_tokens={kv}", "workload.prompt.max=8000"])
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    while True:
        m = env.action_masks()
        ends = np.flatnonzero(m[n:])
        a = n + int(rng.choice(ends)) if len(ends) and rng.random() < p_end else int(rng.choice(np.flatnonzero(m)))
        _, _, term, _, info = env.step(a)
        if term:
            break
    assert not env.sim.stalled and info["invalid_actions"] == 0
    assert info["summary"]["finished"] + info["summary"]["rejected"] == 60


def test_agent_policy_through_simulate_matches_the_least_kv_baseline():
    cfg = make_env(**SMALL).sim_config
    agent = AgentPolicy(least_kv_predict(8), order="arrival", **SMALL, prefill="round_robin", reward="idle")
    a = simulate(cfg, {"decode": agent}, seed=4).requests
    b = simulate(cfg, {"decode": make_policy("decode", "least_kv")}, seed=4).requests
    assert a[["worker", "finish"]].equals(b[["worker", "finish"]])
    assert agent.invalid_actions == 0


def test_teacher_actions_reproduce_the_teacher():
    env = make_env(**SMALL, order="arrival")
    teacher = make_policy("decode", "least_kv")
    env.reset(seed=2)
    while True:
        _, _, term, _, info = env.step(env.teacher_action(teacher))
        if term:
            break
    ref = simulate(env.sim.cfg, {"decode": make_policy("decode", "least_kv")}, seed=env.sim.seed)
    assert info["summary"]["imbalance_mean"] == pytest.approx(ref.summary()["imbalance_mean"])


@pytest.mark.parametrize("spec", ["br0", {"name": "br0", "order": "arrival"}, "iqr", "power_of_two"])
def test_teachers_are_exact_through_the_env_with_skip(spec):
    env = make_env(scenario="decode_tier_n8", overrides=["workload.num_requests=300", "workload.rate=900"])
    env.reset(seed=0)
    teacher = make_policy("decode", spec)
    while True:
        _, _, term, _, info = env.step(env.teacher_action(teacher))
        if term:
            break
    ref = simulate(env.sim.cfg, {"decode": make_policy("decode", spec)}, seed=env.sim.seed).summary()
    assert info["summary"]["imbalance_mean"] == pytest.approx(ref["imbalance_mean"])
    assert info["summary"]["tpot_p95"] == pytest.approx(ref["tpot_p95"])


def test_throughput_reward_and_horizon_features():
    env = make_env(scenario="decode_tier_n8", overrides=["workload.num_requests=150", "workload.rate=400",
                                                          "oracle=true"],
                   reward="throughput", horizon_features="oracle", horizon=16)
    assert env.obs_layout["per_slot_dim"] == N_WORKER + 3
    _, total, info = run_episode(env, least_kv_predict(8, N_WORKER + 3), seed=0)
    assert total > 0 and info["decode_steps"] > 0


@pytest.mark.parametrize("kw,key", [({"order": "shortest"}, "env.order"), ({"reward": "tokens"}, "env.reward"),
                                    ({"max_workers": 4}, "env.max_workers"),
                                    ({"horizon_features": "oracle", "horizon": 0}, "env.horizon")])
def test_bad_env_options_fail_with_one_line(kw, key):
    with pytest.raises(ConfigError) as exc:
        make_env(**SMALL, **kw)
    assert str(exc.value).startswith(key) and "\n" not in str(exc.value)


def test_maskable_ppo_trains_a_few_steps():
    import torch
    from sb3_contrib import MaskablePPO

    torch.set_num_threads(1)
    env = make_env(**SMALL)
    model = MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, seed=0, verbose=0)
    model.learn(128)
    obs, _ = env.reset(seed=0)
    a, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=True)
    assert env.action_masks()[int(a)]


def test_instance_summary_features_equal_numpy_float64_formulas():
    """The observation's KV and slot summaries (computed on Python ints for speed) equal NumPy's float64 reductions
    of the instance's state, cast to float32, bit for bit, along an episode of random valid actions."""
    env = make_env(scenario="decode_tier_n8", overrides=["workload.num_requests=200", "workload.rate=600",
                                                          "cluster.decode.batch_limit=8"], max_workers=12)
    rng = np.random.default_rng(3)
    obs, _ = env.reset(seed=2)
    names = env.core.layout.names
    at = {n: names.index(n) for n in ("l_max", "l_mean", "free_slots")}
    checked = 0
    while True:
        if env.core.head is not None:
            d, ts = env.sim.decode[env.core.inst], env.core.token_scale
            kv, S = d.kv.astype(np.float64), d.batch_limit * ts
            want = {"l_max": float(kv.max()) / S, "l_mean": float(kv.mean()) / S,
                    "free_slots": float((d.batch_limit - d.batch).sum()) / (d.dp * d.batch_limit)}
            for name, i in at.items():
                assert obs[i] == np.float32(min(max(want[name], 0.0), 8.0)), name
            rows = obs[N_GLOBAL:].reshape(12, N_WORKER)
            assert np.array_equal(rows[:d.dp, 0], np.ones(d.dp)) and not rows[d.dp:].any()
            checked += 1
        obs, _r, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        if term or trunc:
            break
    assert checked > 100
