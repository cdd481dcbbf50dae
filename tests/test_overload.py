"""Overload admission (issue 42): the upper bound on weighted attainment against an independent linear program and an
analytic case, above every policy's run; the overload rules conserve requests and reject what they say; bad input
(a board's load, an upper-bound row without classes, a tuning budget) is one line."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim import ConfigError, Simulator, simulate
from pdgym.envs.sim.slo_bound import attainment_bound, front_rate, knapsack_bound, windows_bound
from scipy.optimize import linprog


def test_knapsack_bound_is_the_linear_program_it_relaxes():
    """Dantzig's greedy against scipy's LP with the one capacity constraint (an independent solver)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 40))
        w, p = rng.uniform(0.5, 3.0, n), rng.uniform(1.0, 100.0, n)
        cap = float(rng.uniform(0.0, 1.2) * p.sum())
        lp = linprog(-w, A_ub=p[None, :], b_ub=[cap], bounds=(0, 1), method="highs")
        assert knapsack_bound(w, p, cap) == pytest.approx(-lp.fun / w.sum(), abs=1e-9)


def test_windows_bound_sees_a_burst_the_single_span_does_not():
    """Two requests (weights 2 and 1, one second of work each) due within a second of their common arrival, a
    third five seconds later: the whole span holds all three (knapsack 1.0), the first window holds one of the
    two (the weight-2 one): (2 + 1) / 4."""
    a, d = np.array([0.0, 0.0, 5.0]), np.array([1.0, 1.0, 6.0])
    w, p = np.array([2.0, 1.0, 1.0]), np.ones(3)
    assert knapsack_bound(w, p, 1.0 * (d.max() - a.min())) == 1.0
    assert windows_bound(a, d, w, p, rate=1.0) == pytest.approx(0.75)
    rng = np.random.default_rng(1)
    for _ in range(10):  # never above the single span's bound (its widest window is one of the grid's)
        n = 60
        a = np.sort(rng.uniform(0, 10, n))
        d = a + rng.choice([0.5, 5.0], n)
        w, p = rng.choice([1.0, 2.0], n), rng.uniform(1, 10, n)
        rate = float(rng.uniform(1, 20))
        assert windows_bound(a, d, w, p, rate) <= knapsack_bound(w, p, rate * (d.max() - a.min())) + 1e-9


TIERS = [{"name": "chat", "share": 0.7, "ttft_s": 0.3, "tpot_s": 0.1, "weight": 2.0},
         {"name": "batch", "share": 0.3, "ttft_s": 3.0, "tpot_s": 0.3, "weight": 1.0}]
ROWS = {"fcfs": ("fcfs", "sbs"), "edf": ("edf", "sbs"),
        "conductor": ("edf", {"name": "conductor", "base": "sbs"}),
        "value_density": ("edf", {"name": "value_density", "base": "sbs", "backlog_s": 0.0, "quantile": 0.5}),
        "conductor_predictive": ("edf", {"name": "conductor_predictive", "base": "sbs", "tpot_slack": 0.5,
                                         "drop_late": True}),
        "hindsight": ("edf", {"name": "slo_hindsight", "base": {"name": "conductor", "base": "sbs"}, "passes": 3})}


def overload_cfg(order: str, oracle: bool = False):
    return merge_sim_config(load_scenario("slo_pd_overload").sim, {
        "workload": {"num_requests": 300, "rate": 400.0, "classes": TIERS}, "queue": {"order": order},
        "oracle": oracle})


@pytest.mark.parametrize("seed", [0, 1])
def test_bound_is_above_every_policy_and_requests_are_conserved(seed):
    got = {}
    for label, (order, spec) in ROWS.items():
        res = simulate(overload_cfg(order, oracle=label == "hindsight"), {"prefill": make_policy("prefill", spec)},
                       seed=seed)
        m = res.metrics()
        assert m["finished"] + m["rejected"] == 300  # no request lost
        got[label] = m["slo_attainment"]
    sim = Simulator(overload_cfg("fcfs"), {}, seed=seed)
    sim.run()
    ub = attainment_bound(sim, "windows")
    assert max(got.values()) <= ub <= attainment_bound(sim, "knapsack") <= 1.0
    assert got["hindsight"] >= got["conductor"]  # the row wraps conductor and scores its best replay
    # the front tier's rate is the cost model's full-chunk pass over its units: 3 instances x DP 8 x chunk 3K
    inst = sim.prefill[0]
    z = np.zeros(inst.dp)
    one = inst.dp * inst.chunk_tokens / inst.cost.pass_time(np.full(inst.dp, float(inst.chunk_tokens)), z, z, z)
    assert front_rate(sim) == pytest.approx(len(sim.prefill) * one)


def test_value_density_rejects_the_lowest_density_and_drop_late_only_the_lost():
    cfg = overload_cfg("edf")
    cond = simulate(cfg, {"prefill": make_policy("prefill", ROWS["conductor"][1])}, seed=0).requests
    vd = simulate(cfg, {"prefill": make_policy("prefill", ROWS["value_density"][1])}, seed=0).requests
    rej_c, rej_v = (cond.status == "rejected").to_numpy(), (vd.status == "rejected").to_numpy()
    assert rej_v.sum() > rej_c.sum()  # the density cut rejects more under a backlog
    dens = vd["class"].map({"chat": 2.0, "batch": 1.0}).astype(float).to_numpy() / vd.prompt.to_numpy()
    assert np.median(dens[rej_v]) < np.median(dens[~rej_v])  # and what it rejects has less weight per token
    pol = make_policy("prefill", {"name": "conductor_predictive", "base": "sbs", "tpot_slack": 100.0,
                                  "drop_late": True})
    sim = Simulator(cfg, {"prefill": pol}, seed=0)
    sim.run()
    r = sim.req
    later = np.flatnonzero((r.state == 9) & (r.finish > r.arrival))  # rejected after arriving: dropped as lost
    ttft = sim.classes.ttft_s[r.cls[later]]
    assert (r.finish[later] + r.work[later] * pol.s_tok > r.arrival[later] + ttft).all()


def test_bound_refuses_a_run_without_classes():
    sim = Simulator(merge_sim_config(load_scenario("ds_v3_h800_3p1d").sim, {"workload": {"num_requests": 20}}), {},
                    seed=0)
    sim.run()
    with pytest.raises(ConfigError, match="workload.classes"):
        attainment_bound(sim)


def board(**kw):
    from pdgym.agents.evaluation.leaderboard_run import board_scenarios

    spec = {"scenario": "slo_pd_overload", "point": "prefill", "primary": "slo_attainment", **kw}
    return board_scenarios({"b": spec})


@pytest.mark.parametrize("load", [0, -1.3, math.nan, math.inf, "x", True])
def test_a_board_load_that_is_no_finite_positive_number_is_refused(load):
    with pytest.raises(ConfigError, match=r"scenarios\.b\.load: got .*finite positive"):
        board(load=load)


def test_an_upper_bound_row_on_a_board_without_classes_is_refused():
    board(headroom=[{"label": "ub", "name": "slo_bound"}])  # with classes: fine
    with pytest.raises(ConfigError, match=r"scenarios\.b\.headroom: the slo_bound row .* no SLO classes"):
        board(scenario="ds_v3_h800_3p1d", headroom=[{"label": "ub", "name": "slo_bound"}])
    with pytest.raises(ConfigError, match=r"headroom\.bound: got 'lp'; allowed: knapsack, windows"):
        board(headroom=[{"label": "ub", "name": "slo_bound", "bound": "lp"}])


@pytest.mark.parametrize("budget", [0, -3])
def test_a_tuning_budget_below_one_is_one_line_and_exit_2(budget, tmp_path):
    out = tmp_path / "tune"
    p = subprocess.run([sys.executable, "-m", "pdgym.agents.apps.repro", "overload_tune", f"repro.budget={budget}",
                        f"hydra.run.dir={out}"], check=False, capture_output=True, text=True)
    assert p.returncode == 2 and not out.exists()
    assert p.stderr.strip().count("\n") == 0 and f"repro.budget: got {budget}" in p.stderr
    from pdgym.agents.experiments.overload_tune import check_block

    with pytest.raises(ConfigError, match="repro.split"):
        check_block(OmegaConf.create({"budget": 3, "rules": ["conductor"], "split": "test"}))


def test_revised_hindsight_scores_its_best_replay_and_is_never_below_either_search():
    """revise adds a search that can take the rule's own rejections back; the row keeps the best of both."""
    base = ROWS["value_density"][1]
    add = make_policy("prefill", {"name": "slo_hindsight", "base": base, "passes": 3})
    rev = make_policy("prefill", {"name": "slo_hindsight", "base": base, "passes": 3, "revise": True})
    got = {}
    for label, pol in (("add", add), ("rev", rev)):
        got[label] = simulate(overload_cfg("edf", oracle=True), {"prefill": pol}, seed=0).metrics()["slo_attainment"]
    assert got["rev"] == max(a for _, a in rev.trace) >= got["add"] == max(a for _, a in add.trace)
    assert len(rev.trace) > len(add.trace)  # the revise passes ran
    # a rule on its default dispatcher (auto: SBS on this P/D cluster) revises the same: the replays and the real run
    # resolve auto per cluster (they built the gate's unresolved dispatcher, None, and the run stopped)
    auto = make_policy("prefill", {"name": "slo_hindsight", "base": {**base, "base": "auto"}, "passes": 3, "revise": True})
    cfg = overload_cfg("edf", oracle=True)
    assert simulate(cfg, {"prefill": auto}, seed=0).metrics()["slo_attainment"] == got["rev"]
    with pytest.raises(ConfigError, match="policy.prefill.revise"):
        make_policy("prefill", {"name": "slo_hindsight", "base": "sbs", "revise": True})
