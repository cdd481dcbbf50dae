"""DecodeRouting's pick formulation (action="pick", envs/decode_pick.py): BR-0's round is a sequence of its actions.

The claim it exists for: BR-0 played through the env, one action at a time from `teacher_action`, makes BR-0's
own run (identical request tables, an independent run of the registered router on the same seed), on a tier
with a pool to choose from (Stage 2 subsets) and at the start (Stage 1)."""

from __future__ import annotations

import numpy as np
import pytest
from pdgym.baselines import make_policy
from pdgym.envs.decode_pick import Picker
from pdgym.envs.decode_routing import AgentPolicy, make_env
from pdgym.envs.sim import ConfigError, SimResult, simulate

# 3.5 x the tier's ~111 req/s: the pool grows to hundreds, so Stage 2 chooses subsets of a full window
SATURATED = ["workload.num_requests=1200", "workload.rate=400", "workload.output.max=512"]


def _play_br0(scenario: str, overrides: list[str], **kwargs):
    env = make_env(scenario=scenario, overrides=overrides, action="pick", trace_split=None, stall_s=None, **kwargs)
    env.reset(seed=3)
    teacher = make_policy("decode", "br0")
    n, done_actions = 0, 0
    while True:
        a = env.teacher_action(teacher)
        assert env.action_masks()[a]
        assert not (env.core.work_conserving and env.action_masks()[env.core.end])
        done_actions += a == env.core.done
        _, _, term, trunc, info = env.step(a)
        n += 1
        if term or trunc:
            return env, n, done_actions, info


@pytest.mark.parametrize("scenario, overrides, kwargs", [("decode_tier_ht_n8", SATURATED, {}),
                                                         ("decode_tier_n8", ["workload.num_requests=300"], {}),
                                                         ("decode_tier_ht_n8", SATURATED, {"work_conserving": True})])
def test_br0_through_the_pick_formulation_is_br0(scenario, overrides, kwargs):
    """BR-0 never ends a boundary while a candidate fits, so masking END (work_conserving) leaves it BR-0."""
    env, n, done_actions, info = _play_br0(scenario, overrides, **kwargs)
    sim = env.sim
    ref = simulate(sim.cfg, {"prefill": make_policy("prefill", env.prefill_spec), "decode": make_policy("decode", "br0")},
                   seed=sim.seed)
    assert SimResult(sim).requests.equals(ref.requests)
    assert info["invalid_actions"] == 0 and n >= sim.req.n  # one pick per request, plus the DONEs


def test_a_saturated_tier_exercises_both_stages_and_subsets():
    env = make_env(scenario="decode_tier_ht_n8", overrides=SATURATED, action="pick", trace_split=None, stall_s=None)
    env.reset(seed=3)
    teacher = make_policy("decode", "br0")
    stages, multi_pick_turns, took = set(), 0, 0
    while True:
        core = env.core
        stages.add(bool(core.stage1))
        a = env.teacher_action(teacher)
        if a == core.done:
            multi_pick_turns += took >= 2
        took = core.took + (a < core.window)
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    assert stages == {True, False} and multi_pick_turns > 0


def test_pick_spaces_mask_and_agent_policy():
    env = make_env(scenario="decode_tier_n8", overrides=["workload.num_requests=100"], action="pick", window=8)
    obs, _ = env.reset(seed=0)
    assert env.action_space.n == 8 + 2 and env.get_action_meanings()[-2:] == ["DONE", "END"]
    assert env.observation_space.contains(obs) and env.obs_layout["n_slots"] == 8
    m = env.action_masks()
    assert m[:8].any() and not m[env.core.done]  # DONE only after the named worker took a request

    def best_then_done(obs, mask):  # the best-scoring candidate that fits; DONE once allowed
        if mask[-2]:
            return len(mask) - 2
        score = obs.reshape(-1)[12:].reshape(8, -1)[:, 3]
        return int(np.argmax(np.where(mask[:8], score, -np.inf)))

    pol = AgentPolicy(best_then_done, action="pick", window=8)
    assert isinstance(pol, Picker)  # the pick formulation's core (envs/specs.py), answered by the agent
    cfg = env.sim_config
    res = simulate(cfg, {"prefill": make_policy("prefill", "round_robin"), "decode": pol}, seed=1)
    assert (res.requests.status == "finished").all() and pol.invalid_actions == 0


def test_work_conserving_stops_an_agent_holding_requests_back():
    """An agent that ends every boundary it can holds pooled requests back from free slots (END allowed while a
    candidate fits), so its first 60 admissions take longer; with work_conserving END is masked at every decision
    and the same agent admits as fast as requests arrive."""
    now, ends = {}, {}
    for wc in (False, True):
        env = make_env(scenario="decode_tier_ht_n8", overrides=SATURATED, action="pick", trace_split=None,
                       stall_s=None, work_conserving=wc)
        env.reset(seed=3)
        admitted, ends[wc] = 0, 0
        while admitted < 60:
            m = env.action_masks()
            hold = m[env.core.end] and m[: env.core.window].any()
            a = env.core.end if m[env.core.end] else int(np.flatnonzero(m)[0])
            ends[wc] += bool(hold)
            admitted += a < env.core.window
            env.step(a)
        now[wc] = env.sim.now
    assert ends[True] == 0 and ends[False] > 0
    assert now[False] > 2 * now[True]


def test_imbalance_reward_sums_to_the_runs_imbalance():
    """reward="imbalance": the episode's rewards add up to minus the run's imbalance_mean (the simulator's summary,
    computed apart from the env's meters) times its decode steps, over S = batch_limit x token_scale."""
    env = make_env(scenario="decode_tier_ht_n8", overrides=["workload.num_requests=200", "workload.rate=400"],
                   action="pick", trace_split=None, stall_s=None, work_conserving=True, reward="imbalance")
    env.reset(seed=1)
    teacher, total = make_policy("decode", "br0"), 0.0
    while True:
        _, r, term, trunc, info = env.step(env.teacher_action(teacher))
        total += r
        if term or trunc:
            break
    d = env.sim.decode[0]
    S = d.batch_limit * env.core.token_scale
    assert total < 0
    assert -total * S / info["decode_steps"] == pytest.approx(env.summary()["imbalance_mean"], rel=1e-9)


def test_forecast_features_count_what_the_training_outputs_say():
    """horizon_features=survival: the named worker's expected margin in H steps and its expected departures,
    recomputed here from the running requests' ages and the training outputs by direct counting
    (P(O <= a + H | O > a)), not through the predictor's tables."""
    H = 48
    env = make_env(scenario="decode_tier_ht_n8", overrides=SATURATED, action="pick", trace_split=None, stall_s=None,
                   work_conserving=True, horizon_features="survival", horizon=H)
    obs, _ = env.reset(seed=3)
    teacher = make_policy("decode", "br0")
    for _ in range(400):  # into the saturated tier
        obs, *_ = env.step(env.teacher_action(teacher))
    core, sim = env.core, env.sim
    assert core.took == 0 and env.observation_space.contains(obs)
    _, out = core.forecaster.train.resolve(sim.cfg.workload)
    d = sim.decode[core.inst]
    exp_kv, leave = np.zeros(d.dp), np.zeros(d.dp)
    for w, active in enumerate(d.active):
        for rid in active:
            age = int(sim.req.done_at_admit[rid] + d.steps - sim.req.admit_step[rid])
            alive = out[out > age]
            p = float(np.mean(alive <= age + H)) if len(alive) else 0.0
            exp_kv[w] += (1 - p) * (sim.req.prompt[rid] + age + H)
            leave[w] += p
    S, B = d.batch_limit * core.token_scale, d.batch_limit
    g = obs[12:15]  # the three forecast entries follow the 12 base global features
    assert g == pytest.approx([(exp_kv.max() - exp_kv[core.w]) / S, leave[core.w] / B, leave.mean() / B], rel=1e-4)
    assert 0 < leave.sum() < sum(len(a) for a in d.active)  # a forecast, neither certain nor empty
    with pytest.raises(ConfigError, match=r"env\.horizon_features: got 'oracle'; allowed: survival, memo"):
        make_env(action="pick", horizon_features="oracle")


def test_bad_pick_options_are_one_line():
    with pytest.raises(ConfigError, match=r"env\.action: got 'pointer'; allowed: worker, pick"):
        make_env(action="pointer")
    with pytest.raises(ConfigError, match=r"env\.order: unknown option"):
        make_env(action="pick", order="length")
    with pytest.raises(ConfigError, match=r"env\.window: "):
        make_env(action="pick", window=0)
    with pytest.raises(ConfigError, match=r"env\.work_conserving: "):
        make_env(action="pick", work_conserving="yes")
    env = make_env(scenario="decode_tier_n8", overrides=["workload.num_requests=50"], action="pick")
    env.reset(seed=0)
    with pytest.raises(ConfigError, match="clones br0"):
        env.teacher_action(make_policy("decode", "least_kv"))
