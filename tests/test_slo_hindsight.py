"""The SLO hindsight row (issue 33 item 6; baselines/slo_hindsight.py): a replay of the seeded run is the run
itself, the row scores its best replay exactly and is never below the heuristic it wraps, what it rejects ends
rejected at arrival as a miss, and it refuses to run without oracle: true."""

from __future__ import annotations

import numpy as np
import pytest
from pdgym.baselines import make_policy
from pdgym.baselines.slo_hindsight import missed
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim import ConfigError, simulate

TIERS = [{"name": "chat", "share": 0.6, "ttft_s": 0.4, "tpot_s": 0.03, "weight": 3.0},
         {"name": "batch", "share": 0.4, "ttft_s": 5.0, "tpot_s": 0.2, "weight": 1.0}]
CONDUCTOR = {"name": "conductor", "base": "sbs"}


def cfg(oracle: bool):
    return merge_sim_config(load_scenario("ds_v3_h800_3p1d").sim, {
        "workload": {"num_requests": 300, "rate": 300.0, "classes": TIERS}, "queue": {"order": "edf"},
        "oracle": oracle})


def test_hindsight_scores_its_best_replay_and_beats_the_heuristic_it_wraps():
    heur = simulate(cfg(False), {"prefill": make_policy("prefill", CONDUCTOR)}, seed=0)
    fcfs = simulate(merge_sim_config(cfg(False), {"queue": {"order": "fcfs"}}),
                    {"prefill": make_policy("prefill", "sbs")}, seed=0).metrics()["slo_attainment"]
    pol = make_policy("prefill", {"name": "slo_hindsight", "base": CONDUCTOR, "passes": 4})
    res = simulate(cfg(True), {"prefill": pol}, seed=0)
    m, r = res.metrics(), res.requests
    h = heur.metrics()["slo_attainment"]
    assert pol.trace[0] == (0, h)  # the first replay is the heuristic's own run (same seed, same traffic)
    assert m["slo_attainment"] == max(a for _, a in pol.trace)  # the real run is its best replay, exactly
    assert m["slo_attainment"] > h > fcfs  # rejecting (part of) what missed frees time for the rest
    rej = np.flatnonzero((r.reason == "slo").to_numpy())
    assert set(pol.reject_set) <= set(rej.tolist())  # every one of the set rejected, at arrival, as a miss
    assert (r.finish.to_numpy()[list(pol.reject_set)] == r.arrival.to_numpy()[list(pol.reject_set)]).all()
    assert set(missed(res).tolist()) >= set(rej.tolist())  # and counted a miss by the metric


def test_hindsight_needs_the_oracle():
    pol = make_policy("prefill", {"name": "slo_hindsight", "base": CONDUCTOR})
    with pytest.raises(ConfigError, match=r"^policy\.prefill: slo_hindsight .* needs oracle: true$"):
        simulate(cfg(False), {"prefill": pol}, seed=0)


@pytest.mark.parametrize("spec, key", [({"passes": 0}, "policy.prefill.passes"),
                                       ({"frac": 0.0}, "policy.prefill.frac"),
                                       ({"others": {"prefill": "sbs"}}, "policy.prefill.others")])
def test_bad_parameters_name_the_key(spec, key):
    with pytest.raises(ConfigError, match=rf"^{key}:"):
        make_policy("prefill", {"name": "slo_hindsight", **spec})
