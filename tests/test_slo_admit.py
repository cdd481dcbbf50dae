"""PrefillAdmit-v0 (issue 33 item 8; envs/slo_admit.py): the features against an independent recomputation from the
engine's state, the return equal to the run's weighted SLO attainment, Conductor's rule cloned through the flag
reproducing the conductor baseline's run exactly, the mask, and bad input."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the ids)
import pytest
from pdgym.baselines import make_policy
from pdgym.envs.prefill_dispatch import AgentPolicy
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim import ConfigError, simulate
from pdgym.envs.sim.ordering import seconds_per_prefill_token

OVER = ["workload.num_requests=300", "workload.rate=300.0", "queue.order=edf"]


def make(**kw):
    return gym.make("pdgym/PrefillAdmit-v0", scenario="slo_pd_tiers", overrides=OVER, **kw).unwrapped


def test_features_match_a_recomputation_and_the_return_is_the_weighted_attainment():
    env = make()
    names = env.core.layout.names
    at = {n: i for i, n in enumerate(names)}
    obs, _ = env.reset(seed=1)
    sim, s_tok, ret, checked, done = env.sim, None, 0.0, 0, False
    while not done:
        s_tok = s_tok or seconds_per_prefill_token(sim)
        rid, t, req = env.core.cand, sim.classes, sim.req
        k = int(req.cls[rid])
        slo = t.ttft_s[k]
        # Conductor's estimate, recomputed: least-loaded unit + buffer spread over the units + own work, x s/token
        units = sum(p.dp for p in sim.prefill)
        ahead = min(int(p.load_tokens().min()) for p in sim.prefill)
        buffered = sum(int(req.work[r]) for r in sim.buffer if r != rid) // units
        est = (ahead + buffered + int(req.work[rid])) * s_tok + sim.cfg.cluster.net_latency_s
        assert obs[at[f"cls[{k}]"]] == 1 and obs[at[f"cls[{1 - k}]"]] == 0
        assert obs[at["slack"]] == pytest.approx(np.clip(1 - est / slo, -20, 1), rel=1e-5, abs=1e-6)
        assert obs[at["conductor_rejects"]] == float(est > slo)
        assert obs[at["pred"]] == pytest.approx(np.log1p(req.predicted[rid]) / np.log1p(65536), rel=1e-6)
        rows = [r for r in sim.buffer if r != rid][:8]
        for j, r in enumerate(rows):  # the buffered requests in the queue's (EDF) order
            kr = int(req.cls[r])
            left = (req.arrival[r] + t.ttft_s[kr] - sim.now) / t.ttft_s[kr]
            assert obs[at[f"left@slot{j}"]] == pytest.approx(np.clip(left, -20, 1), rel=1e-5, abs=1e-6)
            assert obs[at[f"cls[{kr}]@slot{j}"]] == 1
        assert obs[at[f"present@slot{len(rows)}"]] == 0 if len(rows) < 8 else True
        checked += len(rows) > 0
        assert env.action_masks().tolist() == [True, True]
        obs, r, term, trunc, _ = env.step(int(obs[at["conductor_rejects"]]))  # Conductor's rule
        ret += r
        done = term or trunc
    m = env.summary()
    assert checked > 20 and m["early_rejections"] > 0
    assert ret == pytest.approx(m["slo_attainment"], abs=1e-12)


def test_cloning_the_flag_through_agent_policy_is_the_conductor_run():
    sc = load_scenario("slo_pd_tiers", OVER)
    cfg = merge_sim_config(sc.sim, {})
    ref = simulate(cfg, {"prefill": make_policy("prefill", {"name": "conductor", "base": "sbs"}),
                         "decode": make_policy("decode", "least_kv")}, seed=4)
    layout = make().core.layout
    flag = layout.names.index("conductor_rejects")
    agent = AgentPolicy(lambda obs, mask: int(obs[flag]), mode="admit")
    got = simulate(cfg, {"prefill": agent, "decode": make_policy("decode", "least_kv")}, seed=4)
    a, b = ref.metrics(), got.metrics()
    assert a["early_rejections"] > 0
    for key in ("slo_attainment", "early_rejections", "ttft_mean", "finished"):
        assert a[key] == b[key], key


def test_use_prediction_needs_a_predictor():
    with pytest.raises(ConfigError, match=r"^env\.use_prediction: .*no predictor"):
        gym.make("pdgym/PrefillAdmit-v0", scenario="slo_pd_tiers",
                 overrides=[*OVER, "workload.predictor.kind=none"], use_prediction=True)
    env = make(use_prediction=False)
    assert not any(n.startswith("pred") for n in env.core.layout.names)
