"""EB closed forms (baselines/eb_theory.py) against hand-computed values and against each other."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pdgym.baselines import eb_theory as T
from pdgym.baselines.exclusive_batching import fit_hazard

H200 = {"a_p": 1.279e-3, "b_p": 2.485e-5, "a_d": 8.921e-3, "b_d": 4.586e-5, "a_mb": 2e-3,
        "c0": 2.494e-5, "c1": 5.193e-5, "c2": 1.478e-5}


def test_theta0_hits_hand_computed_roots():
    # theta = 0.5: 0.5/0.5 + ln 0.5 = 1 - 0.693147 = 0.306853 -> a_p / (mu_O a_d) = 0.306853
    assert T.theta0(0.306853, 1.0, 1.0) == pytest.approx(0.5, abs=1e-5)
    # theta = 0.2: 0.25 + ln 0.8 = 0.0268564
    assert T.theta0(0.0268564 * 128 * 2.0, 2.0, 128) == pytest.approx(0.2, abs=1e-5)
    # small right side c: theta0 ~ sqrt(2 c)
    c = 1e-4
    assert T.theta0(c, 1.0, 1.0) == pytest.approx(math.sqrt(2 * c), rel=0.02)
    # clamps
    assert T.theta0(1e-9, 1.0, 1.0) == 0.01 and T.theta0(100.0, 1.0, 1.0) == 0.99


def test_theta0_published_h200_and_falls_with_mean_output():
    th = [T.theta0(H200["a_p"], H200["a_d"], mu) for mu in (64, 128, 256, 512)]
    assert th[1] == pytest.approx(0.04587, abs=2e-4)  # c = 1.279e-3 / (128 * 8.921e-3) = 1.1201e-3
    assert all(a > b for a, b in itertools.pairwise(th))


@settings(max_examples=40, deadline=None)
@given(a_p=st.floats(1e-4, 1e-1), a_d=st.floats(1e-3, 1e-1), mu=st.floats(2, 4096))
def test_theta0_solves_its_equation(a_p, a_d, mu):
    th = T.theta0(a_p, a_d, mu)
    c = a_p / (mu * a_d)
    if 0.01 < th < 0.99:
        assert T.theta0_rhs(th) == pytest.approx(c, rel=1e-6, abs=1e-12)


def test_theta0_maximises_the_fluid_throughput():
    mu, n = 128, 256
    th0 = T.theta0(H200["a_p"], H200["a_d"], mu)
    grid = np.linspace(0.01, 0.9, 400)
    tp = [T.eb_throughput(t, n, H200, 1024, mu) for t in grid]
    assert grid[int(np.argmax(tp))] == pytest.approx(th0, abs=0.005)
    assert T.fluid_optimum(1 / mu, 0.0, n, H200["a_p"], H200["a_d"], H200["b_d"]) == pytest.approx(th0, abs=1e-4)


def test_eb_throughput_by_hand():
    c = {"a_p": 0.01, "b_p": 1e-4, "a_d": 0.02, "b_d": 1e-3}
    # theta 0.5, N 100, mu_L 100, mu_O 10: cycle = 0.01 + 0.02*10*ln2 + 50*110*bw, bw = (0.01 + 0.01)/110
    cycle = 0.01 + 0.2 * math.log(2) + 50 * 110 * (0.02 / 110)
    assert T.eb_throughput(0.5, 100, c, 100, 10) == pytest.approx(50 / cycle)


def test_mixed_cost_and_mb_throughput_by_hand():
    assert T.b_mb(0.5, H200) == pytest.approx(2.494e-5 + 5.193e-5 * 0.5 + 1.478e-5 * 0.25)
    lam, r = 4.0, 0.3
    assert T.mb_throughput(lam, r, H200, 1000, 100) == pytest.approx(
        lam / (2e-3 + T.b_mb(r, H200) * lam * 1100))


def test_exact_k_by_hand():
    # N = 2, p = 0.5: tau(1) = (1 + 0) / 0.5 = 2, tau(2) = 1 / 0.75 = 4/3 (a_d = 1, b_d = 0);
    # k = 1: 1 * tau(1) - tau(2) = 2/3
    assert T.exact_k(2, 0.5, 0.5, 1.0, 0.0) == 1
    assert T.exact_k(2, 0.5, 0.7, 1.0, 0.0) == 1  # no k < N qualifies: N - 1
    # sparse completions (N p << 1): the discrete rule lands near the continuous theta0
    n, mu = 64, 2048
    a_p, a_d = 0.2, 0.01
    assert T.exact_k(n, 1 / mu, a_p, a_d, 0.0) / n == pytest.approx(T.theta0(a_p, a_d, mu), abs=0.05)


def test_ifr_correction_matches_fluid_optimum_to_first_order():
    p, n = 1 / 128, 256
    th0 = T.theta0(H200["a_p"], H200["a_d"], 128)
    base = T.fluid_optimum(p, 0.0, n, H200["a_p"], H200["a_d"], H200["b_d"])
    for eta in (1e-7, 1e-6):
        num = T.fluid_optimum(p, eta, n, H200["a_p"], H200["a_d"], H200["b_d"]) - base
        assert T.ifr_correction(th0, p, eta, n, H200["a_d"], H200["b_d"]) == pytest.approx(num, rel=0.05)
    assert T.ifr_correction(th0, p, 0.0, n, H200["a_d"], H200["b_d"]) == 0.0
    assert T.ifr_correction(th0, p, 1.0, n, H200["a_d"], H200["b_d"]) == pytest.approx(5 * th0)  # cap


def test_memory_bounds_by_hand_and_ordered():
    # theta 0.5, p 0.01, mu_L 100: D = 100 + (0.5 / 0.005) ln 2 = 169.31; nu = 1 / (1e-4 * 100) = 100
    b = T.memory_bounds(10000, 0.5, 0.01, 100, eps=0.01)
    d = 100 + 100 * math.log(2)
    assert b["static"] == int(10000 // d)
    assert b["expected_peak"] == int((10000 - 100) // d)
    assert b["probabilistic"] == int((10000 - 100 * math.log(100)) // d)
    assert b["static"] >= b["expected_peak"] >= b["probabilistic"]


def test_safe_batch_falls_back_when_the_headroom_exceeds_the_capacity():
    # L40S, mu_O 4608, mu_L 512, theta 0.02: nu = 4608^2 / 512 = 41472, nu ln 100 = 190,990 > C = 181,884
    b = T.memory_bounds(181884, 0.02, 1 / 4608, 512, eps=0.01)
    assert b["probabilistic"] == 0 and b["expected_peak"] > 0
    assert T.safe_batch(b, "probabilistic") == b["expected_peak"]
    assert T.safe_batch(b, "static") == b["static"]
    assert T.safe_batch({"static": 0, "expected_peak": 0, "probabilistic": 0}, "probabilistic") == 1
    ok = T.memory_bounds(10000, 0.5, 0.01, 100)
    assert T.safe_batch(ok, "probabilistic") == ok["probabilistic"]


def test_crossover_by_hand_and_direction():
    mu_l, mu_o, n, r = 1000.0, 200.0, 128, 200 / 1200
    th0 = T.theta0(H200["a_p"], H200["a_d"], mu_o)
    lhs, rhs = T.crossover(r, n, H200, mu_l, mu_o, th0)
    bw = (H200["b_p"] * mu_l + H200["b_d"] * mu_o) / (mu_l + mu_o)
    assert lhs == pytest.approx(T.b_mb(r, H200) - bw)
    assert rhs == pytest.approx(((H200["a_p"] - H200["a_d"] * mu_o * math.log(1 - th0)) / (th0 * n)
                                 - H200["a_mb"] * (1 + mu_o) / n) / (mu_l + mu_o))
    # MB's side shrinks with N: small occupancy favours MB
    assert T.mb_better(r, 4, H200, mu_l, mu_o, th0)
    assert T.crossover(r, 4, H200, mu_l, mu_o, th0)[1] > rhs


def test_fit_mixed_cost_recovers_coefficients():
    rng = np.random.default_rng(0)
    t = rng.uniform(256, 4096, 200)
    r = rng.uniform(0.05, 0.95, 200)
    true = {"a_mb": 3e-3, "c0": 2e-5, "c1": 4e-5, "c2": 1e-5}
    dur = true["a_mb"] + (true["c0"] + true["c1"] * r + true["c2"] * r * r) * t
    fit = T.fit_mixed_cost(t, r * t, dur)
    for k, v in true.items():
        assert fit[k] == pytest.approx(v, rel=1e-6)
    with pytest.raises(ValueError):
        T.fit_mixed_cost([1, 2], [1, 1], [1, 1])


def _colocated(**extra):
    from pdgym.envs.sim import sim_config

    return sim_config({"hardware": "h200", "model": "qwen3_8b",
                       "cluster": {"topology": "colocated", "colocated": {"batch_limit": 64, "chunk_tokens": 1024}},
                       "workload": {"arrival": "closed", "concurrency": 64,
                                    "prompt": {"dist": "gamma", "mean": 512, "cv": 0.5, "max": 4096}}, **extra})


def test_calibrate_mixed_from_mb_runs_recovers_the_cost_model():
    """Bound by the cost model itself: cost.kind=linear *is* the EB mixed form a_mb + (c0 + c1 r + c2 r^2) T, so the
    fit of its MB runs must return the coefficients it was given (the H200 values above), to rounding."""
    fit = T.calibrate_mixed(_colocated(cost={"kind": "linear", "params": H200}), output_means=(16, 64, 256),
                            num_requests=200)
    for k in ("a_mb", "c0", "c1", "c2"):
        assert fit[k] == pytest.approx(H200[k], rel=1e-6), k


def test_calibrate_mixed_under_the_roofline_prices_a_token_at_its_compute():
    """Bound by theory: under the roofline a large mixed batch is compute bound, so the fit's per-token cost at
    r = 0 (c0) is the time of 2 x active parameters FLOPs at flops_bf16 x mfu, plus attention (prompts of ~512
    tokens: about 1% more for Qwen3-8B). 15% leaves room for the fit's r terms absorbing part of it."""
    from pdgym.envs.sim.hardware import load_hardware
    from pdgym.envs.sim.models import load_model

    fit = T.calibrate_mixed(_colocated(), output_means=(16, 64, 256), num_requests=200)
    hw, model = load_hardware("h200"), load_model("qwen3_8b")
    per_token = 2 * model.params_active / (hw.flops_bf16 * hw.mfu)
    assert fit["c0"] == pytest.approx(per_token, rel=0.15)
    assert fit["a_mb"] > 0 and all(T.b_mb(r, fit) > 0 for r in (0.0, 0.5, 1.0))


def test_hazard_fit_geometric_and_increasing():
    rng = np.random.default_rng(1)
    geo = rng.geometric(1 / 100, 500)
    p0, eta = fit_hazard(geo)
    assert p0 == pytest.approx(1 / 100, rel=0.35) and eta < 2e-5
    gam = np.maximum(1, np.round(rng.gamma(16, 100 / 16, 500))).astype(int)
    p0g, etag = fit_hazard(gam)
    assert etag > 1e-5 and p0g >= 1 / gam.mean()
