"""PrefillDispatch-v0: Gymnasium / SB3 compliance, seeding, masks, reward, AgentPolicy and teacher actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the envs)
import pytest
from gymnasium.utils.env_checker import check_env
from pdgym.baselines import make_policy
from pdgym.envs.base import AgentDecider
from pdgym.envs.prefill_dispatch import ENV_ID, AgentPolicy, PrefillDispatchEnv, make_env
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, simulate
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.vec_env import DummyVecEnv

SMALL = ["workload.num_requests=120", "workload.rate=150"]


def play(env, pick, seed=0, limit=100_000):
    """Run one episode with pick(env, obs, mask) -> action; returns (return, steps, last info)."""
    obs, info = env.reset(seed=seed)
    ret, n, done = 0.0, 0, False
    while not done and n < limit:
        a = pick(env, obs, env.action_masks())
        obs, r, term, trunc, info = env.step(a)
        assert env.observation_space.contains(obs)
        ret += r
        n += 1
        done = term or trunc
    return ret, n, info


def random_masked(seed):
    rng = np.random.default_rng(seed)
    return lambda env, obs, mask: int(rng.choice(np.flatnonzero(mask)))


@pytest.mark.parametrize("mode", ["timing", "allocation", "composition", "route"])
def test_passes_the_gymnasium_and_sb3_checkers(mode):
    env = make_env(overrides=SMALL, mode=mode)
    check_env(env, skip_render_check=True)
    sb3_check_env(env, warn=False)
    lay = env.obs_layout
    assert lay["global_dim"] + lay["n_slots"] * lay["per_slot_dim"] == env.observation_space.shape[0]
    n, d = 3, 8
    assert env.action_space.n == {"timing": 1 + n, "allocation": 2 + n * d, "composition": 3, "route": n * d}[mode]


def test_registered_id_make_vec_and_dummy_vec_env():
    env = gym.make(ENV_ID, overrides=SMALL)
    assert isinstance(env.unwrapped, PrefillDispatchEnv)
    vec = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", overrides=SMALL)
    obs, _ = vec.reset(seed=3)
    assert obs.shape == (2, env.observation_space.shape[0])
    for _ in range(5):
        obs, *_ = vec.step(np.zeros(2, dtype=np.int64))
    vec.close()
    dv = DummyVecEnv([lambda: make_env(overrides=SMALL, mode="allocation")] * 2)
    dv.seed(1)
    dv.reset()
    for _ in range(5):
        dv.step(np.zeros(2, dtype=np.int64))
    assert np.asarray(dv.env_method("action_masks")).shape == (2, dv.action_space.n)


def test_seeding_is_reproducible():
    env = make_env(overrides=SMALL, mode="allocation")
    a = play(env, random_masked(0), seed=5)
    b = play(env, random_masked(0), seed=5)
    c = play(env, random_masked(0), seed=6)
    assert a[0] == b[0] and a[1] == b[1]
    assert a[0] != c[0]


@pytest.mark.parametrize("mode", ["timing", "allocation", "composition"])
def test_return_is_minus_the_total_time_to_first_token(mode):
    env = make_env(overrides=SMALL, mode=mode)
    ret, _, info = play(env, random_masked(1), seed=2)
    s = info["summary"]
    assert s["rejected"] == 0 and s["finished"] == 120
    assert ret == pytest.approx(-s["ttft_mean"] * s["finished"], rel=1e-9)


def test_holding_costs_waiting_time_and_flow_control_is_penalised():
    env = make_env(overrides=["workload.num_requests=200", "workload.rate=200"], n_limit=0, reject_penalty_s=7.0)
    env.reset(seed=0)
    # Release to instance 0 only while it has room: with n_limit 0 every request left over is rejected.
    ret, done = 0.0, False
    while not done:
        m = env.action_masks()
        _, r, done, _, info = env.step(1 if m[1] else 0)
        ret += r
    s = info["summary"]
    rej = s["rejected"]
    req = env.sim.req
    fin = req.first_token[~np.isnan(req.first_token)] - req.arrival[~np.isnan(req.first_token)]
    waited = np.nansum(np.where(np.isnan(req.first_token), req.finish - req.arrival, 0.0))
    assert rej > 0
    assert ret == pytest.approx(-(fin.sum() + waited + 7.0 * rej), rel=1e-9)


def test_masks_follow_health_and_capacity():
    over = [*SMALL, "+faults.down=[{instance: 2, at: 0.0}]", "faults.detect_s=0.0"]
    env = make_env(overrides=over, mode="timing")
    env.reset(seed=0)
    for _ in range(30):
        m = env.action_masks()
        assert m[0] and not m[3], "hold always allowed, the dead instance never"
        env.step(0)
    env = make_env(overrides=SMALL, mode="allocation")
    env.reset(seed=0)
    ag = env.core
    cap = ag.cap
    cap.r_queued[0, :4] = 10**6  # the scheduler believes units 0-3 of instance 0 are full
    env.step(0)  # a decision's mask is fixed when the decision is presented (info["action_mask"]): hold, then the next
    m = env.action_masks()
    assert not m[1:5].any() and m[5:9].all()
    cand = env.core.candidate(env.sim)
    info = env.step(1)[4]  # forbidden: replaced by the default action (hold), nothing dispatched, counted
    assert info["invalid_actions"] == 1
    assert cand in env.sim.buffer and env.sim.req.prefill_inst[cand] == -1


@pytest.mark.parametrize("mode", ["timing", "allocation"])
def test_the_mask_is_computed_once_per_decision_and_is_the_fresh_one(mode):
    """action_masks() keeps the decision's mask (the caller and step() both ask for it): at every decision it
    equals the core's mask computed afresh, and a caller that writes into its copy changes nothing."""
    env = make_env(overrides=SMALL, mode=mode)
    env.reset(seed=1)
    rng = np.random.default_rng(1)
    for _ in range(300):
        m = env.action_masks()
        assert np.array_equal(m, env.core.mask(env.sim))
        m[:] = False
        assert env.action_masks().any()
        _, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        if term or trunc:
            break


def test_allocation_mode_places_skips_and_holds_within_one_epoch():
    env = make_env(overrides=["workload.num_requests=60", "workload.rate=5000"], mode="allocation",
                   tick_s=0.5)
    env.reset(seed=0)
    while len(env.sim.buffer) < 3:
        env.step(0)
    t0, buf = env.sim.now, list(env.sim.buffer)
    env.step(env.core.skip)  # skip the oldest
    assert env.sim.now == t0 and env.core.candidate(env.sim) == buf[1]
    env.step(1 + 1 * 8 + 5)  # place the second on instance 1, unit 5
    assert env.sim.now == t0 and env.sim.req.prefill_inst[buf[1]] == 1 and env.sim.req.prefill_dp[buf[1]] == 5
    assert buf[0] in env.sim.buffer


def test_agent_policy_replays_the_env_decisions_through_simulate():
    def predict(obs, mask):  # a fixed rule on the observation: release to the first allowed instance
        allowed = np.flatnonzero(mask[1:])
        return int(1 + allowed[0]) if len(allowed) else 0

    kwargs = {"scenario": "ds_v3_h800_3p1d", "overrides": SMALL, "decode": "least_kv", "mode": "timing"}
    env = make_env(**kwargs)
    _, _, info = play(env, lambda e, obs, mask: predict(obs, mask), seed=4)
    sim_cfg = load_scenario("ds_v3_h800_3p1d", SMALL).sim
    res = simulate(sim_cfg, {"prefill": AgentPolicy(predict, **kwargs)}, env.sim.seed)
    assert res.summary()["ttft_mean"] == pytest.approx(info["summary"]["ttft_mean"], rel=1e-12)
    assert res.summary()["finished"] == 120


@pytest.mark.parametrize("mode", ["timing", "allocation", "composition"])
def test_teacher_actions_reproduce_sbs_exactly(mode):
    over = ["workload.num_requests=600", "workload.rate=170"]
    env = make_env(overrides=over, mode=mode)
    teacher = make_policy("prefill", "sbs")
    _, _, info = play(env, lambda e, obs, mask: e.teacher_action(teacher), seed=1)
    ref = simulate(load_scenario("ds_v3_h800_3p1d", over).sim, {"prefill": make_policy("prefill", "sbs")},
                   env.sim.seed).summary()
    assert info["summary"]["ttft_mean"] == pytest.approx(ref["ttft_mean"], rel=1e-9)


def test_teacher_actions_follow_immediate_dispatch_in_allocation_mode():
    over = ["workload.num_requests=300", "workload.rate=150"]
    env = make_env(overrides=over, mode="allocation", mask_full=False)
    teacher = make_policy("prefill", "jsq")
    _, _, info = play(env, lambda e, obs, mask: e.teacher_action(teacher), seed=2)
    ref = simulate(load_scenario("ds_v3_h800_3p1d", over).sim, {"prefill": make_policy("prefill", "jsq")},
                   env.sim.seed).summary()
    assert info["summary"]["ttft_mean"] == pytest.approx(ref["ttft_mean"], rel=0.05)


@pytest.mark.parametrize("kwargs,key", [
    ({"mode": "both"}, "env.mode"),
    ({"tick_s": 0}, "env.tick_s"),
    ({"obs_requests": 0}, "env.obs_requests"),
    ({"reward_scale": 0}, "env.reward_scale"),
    ({"n_limit": -1}, "env.n_limit"),  # the SBS core checks it as policy.prefill.n_limit; here it is an env option
    ({"decode": "nope"}, "policy.decode.name"),
])
def test_bad_kwargs_fail_with_one_line(kwargs, key):
    with pytest.raises(ConfigError) as exc:
        make_env(overrides=SMALL, **kwargs)
    assert str(exc.value).startswith(key) and "\n" not in str(exc.value)


def test_composition_mode_keeps_sbs_timing_and_its_scripted_rule_is_sbs_compose_length():
    """Composition: a decision at each SBS release, one of {whole buffer, short half, long half}; choosing
    by LengthClasses.rule replays SBS(compose=length) exactly, in the env and through AgentPolicy."""
    over = ["workload.num_requests=600", "workload.rate=150"]
    kwargs = {"overrides": over, "decode": "least_kv", "mode": "composition"}
    env = make_env(**kwargs)
    seen = []

    def rule(e, obs, mask):
        a = e.core.classes.rule(e.sim)
        short, long = e.core.classes.split(e.sim)
        assert list(mask) == [True, bool(short), bool(long)]
        seen.append(a)
        return a

    _, steps, info = play(env, rule, seed=2)
    assert {1, 2} <= set(seen) and steps == len(seen)
    cfg = load_scenario("ds_v3_h800_3p1d", over).sim
    ref = simulate(cfg, {"prefill": make_policy("prefill", {"name": "sbs", "compose": "length"}),
                         "decode": make_policy("decode", "least_kv")}, env.sim.seed).summary()
    assert info["summary"]["ttft_mean"] == pytest.approx(ref["ttft_mean"], rel=1e-12)
    box = {}

    class Replay(AgentDecider):
        def decide(self, core, sim):
            box["sim"] = sim
            return super().decide(core, sim)

    pol = AgentPolicy(None, **kwargs)
    pol.decider = Replay(lambda obs, mask: pol.classes.rule(box["sim"]))
    res = simulate(cfg, {"prefill": pol, "decode": make_policy("decode", "least_kv")}, env.sim.seed).summary()
    assert res["ttft_mean"] == pytest.approx(ref["ttft_mean"], rel=1e-12)
