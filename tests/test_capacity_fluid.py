"""The capacity env's fluid model (envs/sim/fluid.py) against the pass-level engine at stationary points.

Each point is one P:D split of the capacity scenario under Poisson arrivals at a fixed rate, 6,000 requests, one
trace's lengths (Azure conversation: P:D ~ 1:1 regime; Azure code: long prompts, short outputs), the fluid model at
the env's sub-step (5 s). Regimes were chosen from the fluid model's capacity (prefill: 35 conv / 19 code requests/s
per H100 instance; decode: 256 conv requests per instance at ~25 ms a step, ~47 requests/s), and the engine's result
confirms each (under: attainment 1; over: < 0.5).

Bounds, and why:
- throughput (requests finished while arrivals last, per s) within 5% of the engine's where the prefill pool or the
  offered load sets it: both serve min(offered, capacity); 6,000 Poisson arrivals are uncertain by 1/sqrt(6000) =
  1.3%, three of those is 3.9%, and the fluid capacity is the roofline's full-chunk rate, which a saturated engine
  reaches (its passes are full when the queue is long). Where the decode pool sets it, within 8%: the fluid pool keeps
  every slot busy at the full batch's step time, the engine's batch dips while a finished request's slot waits for
  the next KV transfer to land (2 ms + 170 MB / 50 GB/s = 5.4 ms per admitted conv request, against ~5 s a slot is
  held, times the admissions queued behind one another at a step boundary): a known gap of this model, measured 6%.
- SLO attainment within 0.1 away from the knee (offered / capacity <= 0.8 or >= 1.2): there both models are
  deterministic in effect (no queue, or a queue that grows at a rate set by the capacity above, whose error moves
  the met share by at most that error over the run); within 0.2 near it (0.8 < rho < 1.2): the fluid model ignores
  arrival variance, and at rho ~ 1 a Poisson stream's backlog wanders by ~sqrt(N) = 77 requests, i.e. 2-4 s of
  prefill work, the size of the TTFT SLO (2 s), so the share that misses it differs by up to the share of the run
  spent in such excursions.
"""

from __future__ import annotations

import pytest
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import simulate
from pdgym.envs.sim.fluid import ClassLengths, FluidRates, stationary

N = 6000
# (trace, prefill count, decode count, rate, regime): regime "under" / "over" (|rho - 1| >= 0.2) or "knee"
POINTS = [
    ("azure_conv", 2, 2, 50, "under"),
    ("azure_conv", 1, 3, 45, "over"),  # prefill-bound: 1 instance serves ~35/s
    ("azure_conv", 3, 1, 60, "over-decode"),  # decode-bound: one instance holds 256 requests, ~47/s
    ("azure_code", 2, 1, 30, "under"),
    ("azure_code", 2, 1, 40, "knee"),  # 2 x 19 = 38/s
]


@pytest.mark.parametrize("trace,p,d,rate,regime", POINTS)
def test_fluid_matches_engine_at_stationary_points(trace, p, d, rate, regime):
    ov = [f"workload.rate={rate}", f"workload.prompt.source={trace}", f"workload.output.source={trace}",
          f"cluster.prefill.count={p}", f"cluster.decode.count={d}", f"workload.num_requests={N}"]
    sim = load_scenario("capacity_h100_qwen3_8b", ov).sim
    run = simulate(sim, seed=0)
    s = run.summary()
    T = N / rate
    engine_tput = float((run.requests["finish"] <= T).sum()) / T
    if regime == "under":
        assert s["slo_attainment"] >= 0.99
    if regime.startswith("over"):
        assert s["slo_attainment"] < 0.5
    fluid = stationary(FluidRates(sim, [ClassLengths.from_trace(trace, trace)]), [rate], p, d, T, dt=5.0)
    assert abs(fluid["throughput_rps"] - engine_tput) <= (0.08 if regime == "over-decode" else 0.05) * engine_tput
    bound = 0.2 if regime == "knee" else 0.1
    assert abs(fluid["slo_attainment"] - s["slo_attainment"]) <= bound


def test_fluid_rates_follow_the_hardware():
    """The same split on a faster GPU serves more: the rates come from the configured profile, not constants."""
    classes = [ClassLengths.from_trace("conv", "azure_conv")]
    h100 = FluidRates(load_scenario("capacity_h100_qwen3_8b").sim, classes)
    h200 = FluidRates(load_scenario("capacity_h100_qwen3_8b", ["hardware=h200"]).sim, classes)
    assert h200.kv_tokens > h100.kv_tokens  # 141 GB vs 80 GB of HBM
    assert h200.decode_step_s(128, 1000.0) < h100.decode_step_s(128, 1000.0)  # 4.8 vs 3.35 TB/s


def test_scalar_path_matches_the_batched_one():
    """The env's scalar step (Python floats) and the batched step (the DP's table) are the same model."""
    import numpy as np
    from pdgym.envs.sim.fluid import FluidCluster

    sim = load_scenario("capacity_h100_qwen3_8b").sim
    rates = FluidRates(sim, [ClassLengths.from_trace("conv", "azure_conv"), ClassLengths.from_trace("code", "azure_code")])
    one, many = FluidCluster(rates), FluidCluster(rates, (1,))
    rng = np.random.default_rng(0)
    for k in range(300):  # through underload, overload (shedding), a decode pool that shrinks, and back
        a = rng.poisson([30.0, 15.0] if k < 150 else [60.0, 40.0]) * 1.0
        n_p, n_d = (3, 3) if k % 50 < 40 else (1, 1)
        g1 = one.step(a, n_p, n_d, 5.0)
        g2 = many.step(a[None], np.array([n_p]), np.array([n_d]), 5.0)
        assert np.allclose(g1, g2[0], rtol=1e-9, atol=1e-9)
    for name in ("pq_req", "dq", "dr", "dr_ok"):
        assert np.allclose(getattr(one, name), getattr(many, name)[0], rtol=1e-9, atol=1e-9)
    for f in ("arrived", "finished", "good", "rejected"):
        assert np.allclose(getattr(one.totals, f), getattr(many.totals, f)[0], rtol=1e-9)
