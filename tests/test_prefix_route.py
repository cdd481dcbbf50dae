"""PrefillDispatch-v0 route mode (envs/prefix_route.py): one decision per arrival, the action an (instance, unit).

The teacher path must reproduce cache_ttft exactly, and the observation must hold cache_ttft's inputs: its
choice is the unit whose `est_gap` is 0 and whose `hit` row is the true cache's hit (independent reads of the
simulator, not the core's code).
"""

from __future__ import annotations

import numpy as np
import pytest
from pdgym.baselines import make_policy
from pdgym.envs.prefill_dispatch import AgentPolicy, make_env
from pdgym.envs.prefix_route import GLOBAL, ROW, RouteCore
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, simulate

SCEN = "prefix_mooncake"
# 150 rows deep into the trace (its cache is warm by then), at a rate that queues: units reuse and contend
OVER = ["workload.num_requests=150", "workload.trace_offset=4000"]


def _rows(env, obs):
    core = env.core
    lay = core.layout
    return obs[lay.global_dim:].reshape(core.n * core.D, lay.slot_dim)


def _col(name):
    return [f.name for f in ROW].index(name)


def test_spaces_layout_and_mask():
    env = make_env(scenario=SCEN, overrides=OVER, mode="route")
    obs, _ = env.reset(seed=0)
    N, D = len(env.sim.prefill), env.sim.prefill[0].dp
    assert env.action_space.n == N * D == 64
    lay = env.obs_layout
    assert (lay["n_slots"], lay["per_slot_dim"], lay["global_dim"]) == (N * D, len(ROW), len(GLOBAL))
    assert obs.shape == (len(GLOBAL) + N * D * len(ROW),) and env.observation_space.contains(obs)
    assert env.action_masks().all()  # every instance healthy: every unit allowed, nothing else
    assert env.get_action_meanings()[D + 3] == "candidate to instance 1 unit 3"


def test_action_sends_the_candidate_to_that_unit():
    env = make_env(scenario=SCEN, overrides=OVER, mode="route")
    env.reset(seed=1)
    req = env.sim.req
    for a in (0, 13, 63, 42):
        rid = next(iter(env.sim.buffer))
        env.step(a)
        assert rid not in env.sim.buffer
        assert (int(req.prefill_inst[rid]), int(req.prefill_dp[rid])) == divmod(a, 8)


def test_teacher_actions_reproduce_cache_ttft_exactly_and_are_the_zero_est_gap_units():
    env = make_env(scenario=SCEN, overrides=OVER, mode="route")
    teacher = make_policy("prefill", "cache_ttft")
    obs, _ = env.reset(seed=2)
    done, n, checked_hits, same = False, 0, 0, 0
    while not done:
        a = env.teacher_action(teacher)
        rows = _rows(env, obs)
        assert rows[a, _col("est_gap")] == pytest.approx(0.0, abs=1e-6)  # its choice minimises the row estimate
        p = int(np.argmax(rows[:, _col("pick")]))  # the flagged unit is its choice, up to its rotating tie-break
        assert p == a or (rows[p, _col("est_gap")] == 0.0 and rows[p, _col("hit")] == rows[a, _col("hit")])
        same += p == a
        rid = next(iter(env.sim.buffer))
        inst, d = divmod(a, 8)
        hit = env.sim.prefix_hit(rid, inst, d)  # the simulator's own read of that unit's cache
        assert rows[a, _col("hit")] == pytest.approx(min(hit / 8192, 16.0), rel=1e-6)
        checked_hits += hit > 0
        obs, _, term, trunc, info = env.step(a)
        done, n = term or trunc, n + 1
    assert n == 150 and checked_hits > 10  # one decision per request; warm caches do hit
    assert same > 0.8 * n  # rotation ties are the exception
    ref = simulate(load_scenario(SCEN, OVER).sim, {"prefill": make_policy("prefill", "cache_ttft")}, env.sim.seed)
    got, want = info["summary"], ref.summary()
    assert got["ttft_mean"] == want["ttft_mean"] and got["prefix_hit_ratio"] == want["prefix_hit_ratio"]


def test_agent_policy_runs_route_mode_through_simulate():
    kwargs = {"scenario": SCEN, "overrides": OVER, "mode": "route"}

    def predict(obs, mask):  # the smallest estimate: cache_ttft's rule up to its tie-break
        rows = obs[len(GLOBAL):].reshape(-1, len(ROW))
        return int(np.argmin(np.where(mask, rows[:, _col("est_gap")], np.inf)))

    env = make_env(**kwargs)
    obs, _ = env.reset(seed=3)
    done = False
    while not done:
        obs, _, term, trunc, info = env.step(predict(obs, env.action_masks()))
        done = term or trunc
    pol = AgentPolicy(predict, **kwargs)
    assert isinstance(pol, RouteCore)  # the route formulation's core (envs/specs.py), answered by the agent
    res = simulate(load_scenario(SCEN, OVER).sim, {"prefill": pol}, env.sim.seed).summary()
    assert res["finished"] == 150 and pol.invalid_actions == 0
    assert res["ttft_mean"] == pytest.approx(info["summary"]["ttft_mean"], rel=1e-12)


def test_route_mode_takes_no_other_core_option():
    with pytest.raises(ConfigError, match="env.tick_s"):
        make_env(scenario=SCEN, overrides=OVER, mode="route", tick_s=0.05)
