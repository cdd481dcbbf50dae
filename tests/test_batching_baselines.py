"""Batching baselines (batching_study.py, exclusive_batching.py): invariants, phase machine, directions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdgym.baselines import make_policy, registered
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, SimResult, Simulator
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.observers import Observer

OURS = ("fcfs", "prefill_first", "fixed", "dynamic", "chunked", "v0", "mb", "eb", "eb_star", "eb_plus")
LINEAR = {"kind": "linear", "params": {"a_p": 0.002, "b_p": 3e-5, "a_d": 0.008, "b_d": 5e-5}}


def coloc(slots=32, kv=40000, dp=1, chunk=1024, wl=None, cost=LINEAR):
    return {"hardware": "h200", "model": "qwen3_8b", "cost": cost,
            "cluster": {"topology": "colocated", "colocated": {"dp": dp, "batch_limit": slots, "chunk_tokens": chunk,
                                                               "kv_capacity_tokens": kv}},
            "workload": wl or {"num_requests": 200, "arrival": "poisson", "rate": 30.0,
                               "prompt": {"dist": "uniform", "low": 16, "high": 1500},
                               "output": {"dist": "geometric", "mean": 40, "max": 400}}}


class Checked(Observer):
    """Asserts slot and KV capacities after every colocated iteration (at most `max_running` running)."""

    def __init__(self, max_running: int | None = None):
        self.max_running = max_running

    def on_pass_end(self, sim, kind, inst):
        for u in sim.colocated[inst].units:
            assert u.n_running <= u.slots and u.kv_used <= u.kv_cap
            if self.max_running is not None:
                assert u.n_running <= self.max_running


def run(cfg, policy, seed=0, max_running=None):
    sim = Simulator(cfg, {"batching": make_policy("batching", policy)}, seed)
    sim.observe(Checked(max_running))
    assert sim.run()
    return sim


def assert_resolved(sim):
    st_ = sim.req.state
    assert np.isin(st_, [R.FINISHED, R.REJECTED]).all() and not sim.stalled
    assert sim.tokens_out == int(sim.req.done.sum())


def test_all_policies_registered():
    assert set(OURS) <= set(registered("batching"))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(OURS), seed=st.integers(0, 1000), dp=st.integers(1, 3), slots=st.integers(1, 24),
       kv=st.integers(2000, 30000), rate=st.floats(1.0, 300.0), out_mean=st.integers(1, 120),
       closed=st.booleans())
def test_no_deadlock_or_overcommit_on_random_units(name, seed, dp, slots, kv, rate, out_mean, closed):
    """The phase machines never deadlock: empty queues, full slots and full KV all occur here."""
    wl = {"num_requests": 80, "arrival": "closed" if closed else "poisson", "rate": rate, "concurrency": 3 * slots,
          "prompt": {"dist": "uniform", "low": 1, "high": 1800}, "output": {"dist": "geometric", "mean": out_mean,
                                                                            "max": 500}}
    sim = run(coloc(slots=slots, kv=kv, dp=dp, chunk=512, wl=wl), name, seed)
    assert_resolved(sim)
    assert (sim.req.state == R.FINISHED).mean() > 0.5


def test_fcfs_runs_one_request_at_a_time():
    sim = run(coloc(), "fcfs", max_running=1)
    assert_resolved(sim)
    req = sim.req
    order = np.argsort(req.first_token)
    assert (np.diff(req.finish[order]) >= 0).all(), "process to completion finishes in start order"


def test_chunked_caps_pieces_and_alternates():
    pol = make_policy("batching", {"name": "chunked", "chunk_size": 16, "K": 64})
    seen = []

    class Spy(type(pol)):
        def next_batch(self, sim, inst, unit):
            b = super().next_batch(sim, inst, unit)
            if b is not None:
                seen.append((max((t for _, t in b.prefill), default=0), sum(t for _, t in b.prefill), b.decode,
                             sim.colocated[inst].units[unit].n_decoding))
            return b

    sim = Simulator(coloc(), {"batching": Spy(chunk_size=16, K=64)}, 0)
    assert sim.run()
    assert all(piece <= 16 and total <= 64 for piece, total, _, _ in seen)
    for (p0, _, _d0, _n0), (p1, _, d1, n1) in itertools.pairwise(seen):
        if p0 and n1:  # after a prefill iteration, waiting decodes get the next one
            assert d1 and not p1


def study(rate, n=600):
    """The batching study's regime: S(b) = 20 ms + 0.3 ms max(0, b - 64), K = 128, 20-token prompts, 16 outputs."""
    return {"hardware": "h200", "model": "qwen3_8b",
            "cost": {"kind": "piecewise_linear", "params": {"c": 0.02, "a": 3e-4, "b0": 64}},
            "cluster": {"topology": "colocated", "colocated": {"batch_limit": 256, "chunk_tokens": 128,
                                                               "kv_capacity_tokens": 10_000_000}},
            "workload": {"num_requests": n, "arrival": "poisson", "rate": rate, "prompt": {"dist": "fixed", "mean": 20},
                         "output": {"dist": "fixed", "mean": 16}}}


def test_chunk_knee_at_the_prompt_length():
    """Chunks >= the prompt (20 tokens) give the same run; 16 and 8 split prompts and raise TTFT 1.5-4x."""
    ttft = {cs: SimResult(run(study(15.0), {"name": "chunked", "chunk_size": cs, "K": 128})).summary()["ttft_mean"]
            for cs in (8, 16, 32, 128)}
    assert ttft[32] == ttft[128]
    assert 1.5 * ttft[32] < ttft[16] < ttft[8] < 4 * ttft[32]


def test_fixed_batching_keeps_cadence_dynamic_finishes_sooner():
    """At 25 req/s: fixed b = 128 (timeout-paced) gives the tightest token gaps; dynamic batching
    (small targets while the queue is short) finishes typical requests sooner, with more jitter."""
    from pdgym.agents.experiments.chunk_knee import token_gaps

    res = {}
    for name, spec in (("fixed", {"name": "fixed", "b": 128, "timeout_s": 0.05}), ("dynamic", "dynamic")):
        sim = run(study(25.0), spec)
        assert_resolved(sim)
        r = SimResult(sim)
        g = token_gaps(r)
        res[name] = (g.std() / g.mean(), r.requests.e2e.median())
    assert res["fixed"][0] < 0.5 * res["dynamic"][0]
    assert res["dynamic"][1] < 0.9 * res["fixed"][1]


def test_fixed_batching_waits_for_b_tokens_or_the_timeout():
    """Nothing runs before b queued tokens or the oldest job's timeout: one lone request waits timeout_s."""
    cfg = study(1.0, n=1)
    sim = run(cfg, {"name": "fixed", "b": 128, "timeout_s": 0.05})
    req = sim.req
    assert req.prefill_start[0] - req.dev_arrive[0] == pytest.approx(0.05)


def test_kv_gate_and_memory_safe_batch_hold_kv():
    """Tight KV: MB over-commits and preempts; EB* sizes N to the memory and does not."""
    wl = {"num_requests": 600, "arrival": "closed", "concurrency": 256,
          "prompt": {"dist": "gamma", "mean": 800, "cv": 0.5, "max": 4000},
          "output": {"dist": "geometric", "mean": 200, "max": 2000}}
    cfg = coloc(slots=256, kv=120000, wl=wl)
    mb = run(cfg, "mb")
    star = run(cfg, "eb_star")
    assert mb.req.preemptions.sum() > 20
    assert star.req.preemptions.sum() <= 0.1 * mb.req.preemptions.sum()
    pol = star.policies["batching"]
    assert 50 < pol.batch_size(star.colocated[0].units[0]) < 256


def test_prompt_that_cannot_fit_fails_fast():
    with pytest.raises(ConfigError, match="kv_capacity_tokens"):
        Simulator(coloc(kv=1000), {"batching": make_policy("batching", "eb_star")}, 0)


@pytest.mark.parametrize("spec,key", [
    ({"name": "eb", "theta": 1.5}, "policy.batching.theta"),
    ({"name": "eb", "N": 0}, "policy.batching.N"),
    ({"name": "eb_star", "bound": "loose"}, "policy.batching.bound"),
    ({"name": "eb_star", "theta_max": 2.0}, "policy.batching.theta_max"),
    ({"name": "eb_star", "coef": {"a_p": 1.0}}, "policy.batching.coef"),
    ({"name": "eb_plus", "delta": -1.0}, "policy.batching.delta"),
    ({"name": "eb_plus", "cooldown": 1.5}, "policy.batching.cooldown"),
    ({"name": "chunked", "chunk_size": 0}, "policy.batching.chunk_size"),
    ({"name": "fixed", "timeout_s": -1}, "policy.batching.timeout_s"),
    ({"name": "dynamic", "thresholds": [[2, 10]]}, "policy.batching.thresholds"),
    ({"name": "mb", "budget": "big"}, "policy.batching.budget"),
    ({"name": "eb", "bogus": 1}, "policy.batching.bogus"),
])
def test_invalid_parameters_fail_at_config_time(spec, key):
    with pytest.raises(ConfigError) as exc:
        make_policy("batching", spec)
    assert key in str(exc.value) and "\n" not in str(exc.value)


def _scenario(hw, *ov):
    return load_scenario(f"coloc_{hw}_qwen3_8b", ["workload.num_requests=600", *ov]).sim


def _rps(cfg, name):
    sim = Simulator(cfg, {"batching": make_policy("batching", name)}, 0)
    sim.run()
    return SimResult(sim).summary()["rps"], sim


def test_eb_star_beats_mb_on_low_bandwidth_and_not_on_b300():
    """L40S is out of sample: its interference comes from the bandwidth rule fitted on RTX PRO 6000 and H200
    (envs/sim/cost.py), so EB*'s gain there is a prediction, bounded by the EB study's +40% halved (the fidelity
    report's factor-of-2 rule). B300 is *calibrated*, not predicted: its interference is H200's copied
    (conf/hardware/b300.yaml), and H200's was set from the EB study's H200 crossover, so B300's parity follows
    from the copy; the check only guards the copy (EB* no more than 2% ahead)."""
    l40s = _scenario("l40s")
    assert _rps(l40s, "eb_star")[0] > 1.2 * _rps(l40s, "mb")[0]
    b300 = _scenario("b300")
    assert _rps(b300, "eb_star")[0] < 1.02 * _rps(b300, "mb")[0]


def test_eb_plus_picks_mb_at_low_load_and_eb_where_eb_wins():
    low = _scenario("rtx_pro_6000", "workload.concurrency=8")
    _, sim = _rps(low, "eb_plus")
    assert sim.policies["batching"].mode == "mb" and not sim.policies["batching"].switches
    # EB+ runs MB until its switch (about 42 s in): with L40S's interference re-fitted for issue 35 (EB* +41% over
    # MB here) that warm-up costs 5.1% of a 600-request run, 3.7% of this one
    high = _scenario("l40s", "workload.num_requests=1200")
    rps_plus, sim = _rps(high, "eb_plus")
    assert sim.policies["batching"].switches and sim.policies["batching"].switches[0][1] == "eb"
    assert rps_plus >= 0.95 * max(_rps(high, "eb_star")[0], _rps(high, "mb")[0])


def test_eb_star_learns_theta_from_completions_only():
    cfg = _scenario("h200")
    assert not cfg.oracle
    _, sim = _rps(cfg, "eb_star")
    pol = sim.policies["batching"]
    assert pol.stats.fitted and 0.01 <= pol.theta <= 0.8
    assert len(sim.completed) - 5 <= pol.stats.n <= len(sim.completed)  # the last ones end the run
