"""Prefill-side baselines: immediate dispatchers, scheduler batching, SBS and PBAA.

Direction checks run on the SBS scenario (DeepSeek-V3 / H800, 3 prefill x DP 8 on two nodes each,
chunk 3K) with a few thousand requests; the effect sizes are in the reproductions (pdgym-repro sbs_ttft, pbaa_util,
sbs_faults).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from pdgym.agents.experiments.measure import full_chunk_rate
from pdgym.baselines import make_policy, registered
from pdgym.baselines.dispatch import JoinShortestQueue, LeastOutstandingTokens
from pdgym.baselines.pbaa import PBAA, greedy_dispatch
from pdgym.baselines.sbs import SBS
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, SimResult, Simulator, simulate
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.events import PassKind

CONF = Path(__file__).resolve().parents[1] / "conf" / "policy" / "prefill"
PREFILL = ("random", "jsq", "least_tokens", "fixed_batch", "dynamic_batch", "sbs")
RATE = load_scenario("ds_v3_h800_3p1d").sim.workload.rate  # the scenario's own (126 req/s, 0.61 of saturation)


def scenario(rate: float, n: int, *extra: str):
    return load_scenario("ds_v3_h800_3p1d", [f"workload.rate={rate}", f"workload.num_requests={n}", *extra]).sim


def small(**faults) -> dict:
    return {
        "hardware": "h800", "model": "deepseek_v3",
        "cost": {"kind": "linear", "params": {"a_p": 0.02, "b_p": 2e-5, "a_d": 0.008, "b_d": 5e-5}},
        "cluster": {"topology": "disaggregated",
                    "prefill": {"count": 3, "dp": 4, "ep": 4, "chunk_tokens": 1024, "kv_capacity_tokens": 10**6},
                    "decode": {"count": 1, "dp": 4, "ep": 4, "batch_limit": 64, "kv_capacity_tokens": 10**6}},
        "workload": {"num_requests": 200, "arrival": "poisson", "rate": 60.0,
                     "prompt": {"dist": "uniform", "low": 16, "high": 2500},
                     "output": {"dist": "geometric", "mean": 20, "max": 200}},
        "faults": faults,
    }


def assert_accounted(sim: Simulator) -> None:
    state = sim.req.state
    assert np.isin(state, [R.FINISHED, R.REJECTED]).all(), "a request was lost"
    assert not sim.stalled, "the run deadlocked"
    assert (sim.req.reason[state == R.REJECTED] > 0).all()
    assert not sim.buffer


# --------------------------------------------------------------------------- registry and configs
def test_every_prefill_baseline_is_registered_and_its_config_builds():
    assert set(PREFILL) | {"round_robin"} <= set(registered("prefill"))
    files = sorted(CONF.glob("*.yaml"))
    assert len(files) >= 11
    for f in files:
        spec = OmegaConf.to_container(OmegaConf.load(f))
        pol = make_policy("prefill", spec)
        assert pol.name == spec["name"], f.name


@pytest.mark.parametrize("spec,key", [
    ({"name": "sbs", "window": -1}, "policy.prefill.window"),
    ({"name": "sbs", "window": 0}, "policy.prefill.window"),
    ({"name": "sbs", "n_limit": -1}, "policy.prefill.n_limit"),
    ({"name": "sbs", "allocation": "best_fit"}, "policy.prefill.allocation"),
    ({"name": "sbs", "overload": "drop"}, "policy.prefill.overload"),
    ({"name": "sbs", "watchdog": 0.5}, "policy.prefill.watchdog"),
    ({"name": "sbs", "t_default": 0.0}, "policy.prefill.t_default"),
    ({"name": "sbs", "order": "random"}, "policy.prefill.order"),
    ({"name": "sbs", "compose": "shortest"}, "policy.prefill.compose"),
    ({"name": "sbs", "join": "always"}, "policy.prefill.join"),
    ({"name": "sbs", "early": "soon"}, "policy.prefill.early"),
    ({"name": "sbs", "poll_s": 0}, "policy.prefill.poll_s"),
    ({"name": "fixed_batch", "b": 0}, "policy.prefill.b"),
    ({"name": "fixed_batch", "timeout_s": -1.0}, "policy.prefill.timeout_s"),
    ({"name": "dynamic_batch", "thresholds": [[4, 100], [2, 200]]}, "policy.prefill.thresholds"),
    ({"name": "dynamic_batch", "thresholds": [[1, 100]]}, "policy.prefill.thresholds"),
    ({"name": "dynamic_batch", "ttft_target_s": 0}, "policy.prefill.ttft_target_s"),
    ({"name": "sbs", "chunk": 3}, "policy.prefill.chunk"),
])
def test_bad_parameters_fail_at_config_time_with_one_line(spec, key):
    with pytest.raises(ConfigError) as exc:
        make_policy("prefill", spec)
    msg = str(exc.value)
    assert msg.startswith(key) and "\n" not in msg


def test_zero_chunk_capacity_and_colocated_clusters_are_config_errors():
    cfg = small()
    cfg["cluster"]["prefill"]["chunk_tokens"] = 0
    with pytest.raises(ConfigError, match="cluster.prefill.chunk_tokens"):
        Simulator(cfg, {"prefill": SBS()}, 0)
    coloc = {"cluster": {"topology": "colocated", "colocated": {"kv_capacity_tokens": 10**6}},
             "workload": {"num_requests": 5, "rate": 1.0}}
    with pytest.raises(ConfigError, match="disaggregated"):
        Simulator(coloc, {"prefill": SBS()}, 0).run()


# --------------------------------------------------------------------------- accounting everywhere
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), name=st.sampled_from(PREFILL),
       allocation=st.sampled_from(["pbaa", "pbaa_cache", "first_fit", "round_robin"]),
       overload=st.sampled_from(["reject", "throttle"]), n_limit=st.integers(0, 4),
       rate=st.floats(10.0, 400.0), drop=st.sampled_from([0.0, 0.3]), down=st.booleans(),
       compose=st.sampled_from(["all", "length"]), early=st.sampled_from(["none", "full"]))
def test_every_request_is_finished_or_rejected_with_a_reason(seed, name, allocation, overload, n_limit, rate,
                                                             drop, down, compose, early):
    faults = {"drop_end_forward": drop, "detect_s": 0.5,
              "down": [{"instance": 1, "at": 0.5, "until": 2.0}] if down else []}
    cfg = small(**faults)
    cfg["workload"]["rate"] = rate
    cfg["workload"]["prefix_groups"] = 8
    cfg["cluster"]["prefill"]["prefix_cache_entries"] = 4
    spec = {"name": name}
    if name == "sbs":
        spec.update(allocation=allocation, overload=overload, n_limit=n_limit, compose=compose, early=early)
    sim = Simulator(cfg, {"prefill": make_policy("prefill", spec)}, seed)
    assert sim.run()
    assert_accounted(sim)
    reasons = set(sim.req.reason[sim.req.state == R.REJECTED].tolist())
    assert reasons <= {R.reason_code("flow_control")}, "only flow control may reject on the prefill side"
    if name != "sbs" or overload == "throttle" or allocation in ("first_fit", "round_robin"):
        assert not reasons, "this policy never rejects"


# --------------------------------------------------------------------------- PBAA properties
@st.composite
def allocation_case(draw):
    n = draw(st.integers(0, 60))
    d = draw(st.integers(1, 8))
    lengths = np.array(draw(st.lists(st.integers(1, 6000), min_size=n, max_size=n)), dtype=np.int64)
    avail = np.array(draw(st.lists(st.integers(-4000, 4096), min_size=d, max_size=d)), dtype=np.int64)
    hits = None
    if draw(st.booleans()):
        hits = np.array(draw(st.lists(st.integers(0, 3000), min_size=n * d, max_size=n * d)),
                        dtype=np.int64).reshape(n, d)
        hits = np.minimum(hits, np.maximum(lengths[:, None] - 1, 0))
    return lengths, avail, hits


@settings(max_examples=200, deadline=None)
@given(allocation_case())
def test_greedy_dispatch_only_uses_units_with_positive_capacity(case):
    lengths, avail, hits = case
    out = greedy_dispatch(lengths, avail, hits)
    # Replay in GreedyDispatch's order (length descending): capacity was positive at every assignment,
    # and it falls by exactly the work the unit takes on.
    cur = avail.copy()
    for k in np.argsort(-lengths, kind="stable"):
        d = out.unit[k]
        if d < 0:
            continue
        assert cur[d] > 0 and out.avail_at[k] == cur[d]
        cur[d] -= lengths[k] - (hits[k, d] if hits is not None else 0)
    assert (cur == out.avail).all()
    assert ((out.unit >= -1) & (out.unit < len(avail))).all()
    if hits is None and (out.unit < 0).any():
        assert out.avail.max() <= 0, "a request was left over while a unit still had capacity"
    if hits is None and len(lengths) and avail.max() > 0:
        first = int(np.argsort(-lengths, kind="stable")[0])
        assert out.unit[first] == int(np.argmax(avail)), "the longest request goes to the roomiest unit"


class FakeCap:
    """The part of CapacityModel PBAA.release uses: one instance's C_avail and the dispatch bookkeeping."""

    def __init__(self, avail):
        self.avail = np.array(avail, dtype=np.int64)

    def c_avail(self, inst):
        return self.avail.copy()

    def dispatched(self, inst, dp, tokens, now):
        self.avail[dp] -= tokens


class FakeSim:
    """A scheduler buffer and the dispatch / reject actions, recording what happens."""

    class Req:
        def __init__(self, work):
            self.work = np.asarray(work, dtype=np.int64)

    def __init__(self, work):
        self.req = self.Req(work)
        self.buffer = {}
        self.now = 0.0
        self.sent: list[int] = []
        self.rejected: list[tuple[int, str]] = []

    def arrive(self, rids):
        for r in rids:
            self.buffer[r] = None

    def dispatch(self, rid, inst, dp=None):
        del self.buffer[rid]
        self.sent.append(rid)

    def reject(self, rid, reason):
        del self.buffer[rid]
        self.rejected.append((rid, reason))


@settings(max_examples=100, deadline=None)
@given(work=st.lists(st.integers(1, 4000), min_size=1, max_size=80), d=st.integers(1, 8),
       cycles=st.integers(1, 8), n_limit=st.integers(0, 3), overload=st.sampled_from(["reject", "throttle"]),
       cap_tokens=st.integers(200, 6000), data=st.data())
def test_pbaa_cycles_place_pending_first_and_never_lose_or_duplicate(work, d, cycles, n_limit, overload,
                                                                     cap_tokens, data):
    sim = FakeSim(work)
    pbaa = PBAA(n_limit=n_limit, overload=overload)
    ids = list(range(len(work)))
    arrivals = sorted(data.draw(st.lists(st.integers(0, cycles - 1), min_size=len(ids), max_size=len(ids))))
    for c in range(cycles):
        sim.arrive([r for r, a in zip(ids, arrivals) if a == c])
        pending = [r for r in pbaa.wait if r in sim.buffer]
        before_sent = len(sim.sent)
        pbaa.release(sim, 0, FakeCap([cap_tokens] * d))
        placed = sim.sent[before_sent:]
        left_pending = [r for r in pending if r in sim.buffer]
        new_placed = [r for r in placed if r not in pending]
        assert not (left_pending and new_placed), "a new request was placed while a pending one was left"
        assert all(w <= n_limit + (overload == "throttle") * cycles for w in pbaa.wait.values())
    rejected = [r for r, _ in sim.rejected]
    assert all(reason == "flow_control" for _, reason in sim.rejected)
    assert len(set(sim.sent)) == len(sim.sent) and not set(sim.sent) & set(rejected)
    assert set(sim.sent) | set(rejected) | set(sim.buffer) == {r for r, a in zip(ids, arrivals) if a < cycles}
    if overload == "throttle":
        assert not rejected


def test_flow_control_rejects_after_n_limit_cycles_and_throttle_holds_new_arrivals():
    sim = FakeSim([3000, 100, 100])
    sim.arrive([0])
    pbaa = PBAA(n_limit=2, overload="reject")
    full = [0, 0]
    for k in range(3):
        pbaa.release(sim, 0, FakeCap(full))
        assert (0 in sim.buffer) == (k < 2)
    assert sim.rejected == [(0, "flow_control")] and pbaa.stats["flow_control_rejected"] == 1

    sim = FakeSim([3000, 100, 100])
    sim.arrive([0])
    pbaa = PBAA(n_limit=1, overload="throttle")
    for _ in range(2):
        pbaa.release(sim, 0, FakeCap(full))
    sim.arrive([1, 2])
    pbaa.release(sim, 0, FakeCap([50, 5000]))  # request 0 starves: only it is considered
    assert sim.sent == [0] and 1 in sim.buffer and pbaa.stats["throttled"] == 2
    pbaa.release(sim, 0, FakeCap([5000, 5000]))
    assert sim.sent == [0, 1, 2] and not sim.rejected


# --------------------------------------------------------------------------- immediate dispatchers
def test_jsq_and_least_tokens_pick_the_lightest_instance():
    sim = Simulator(small(), None, 0)
    P = sim.prefill
    P[0].depth, P[1].depth, P[2].depth = 3, 1, 2
    P[0].queued_tokens[:] = 10
    P[1].queued_tokens[:] = 500
    P[2].queued_tokens[:] = 300
    jsq, lot = JoinShortestQueue(), LeastOutstandingTokens()
    jsq.reset(sim)
    lot.reset(sim)
    assert jsq.choose(sim, [0, 1, 2]) == 1
    assert lot.choose(sim, [0, 1, 2]) == 0
    assert lot.choose(sim, [1, 2]) == 2
    P[0].depth = P[1].depth = P[2].depth = 0
    assert {jsq.choose(sim, [0, 1, 2]) for _ in range(6)} == {0, 1, 2}, "ties must rotate"


def test_immediate_dispatchers_never_hold_and_spread_the_load():
    for name in ("random", "jsq", "least_tokens"):
        res = simulate(scenario(RATE, 1500), {"prefill": make_policy("prefill", name)}, 0)
        req = res.requests
        assert (req.sched_queue == 0).all(), name
        share = np.bincount(req.prefill_inst, minlength=3) / len(req)
        assert share.min() > 0.25, (name, share)


# --------------------------------------------------------------------------- scheduler batching
def test_fixed_batching_waits_at_most_its_timeout_and_releases_at_b_tokens():
    res = simulate(scenario(60, 800), {"prefill": make_policy("prefill", {"name": "fixed_batch", "b": 10**7,
                                                                        "timeout_s": 0.05})}, 0)
    assert res.requests.sched_queue.max() <= 0.05 + 1e-9
    assert res.requests.sched_queue.mean() > 0.02
    res = simulate(scenario(60, 800), {"prefill": make_policy("prefill", {"name": "fixed_batch", "b": 1})}, 0)
    assert (res.requests.sched_queue == 0).all()


def test_dynamic_batching_releases_small_batches_at_once_and_guards_latency():
    spec = {"name": "dynamic_batch", "thresholds": [[0, 1]]}
    res = simulate(scenario(60, 800), {"prefill": make_policy("prefill", spec)}, 0)
    assert (res.requests.sched_queue == 0).all()
    spec = {"name": "dynamic_batch", "thresholds": [[0, 10**7]], "ttft_target_s": 0.3}
    res = simulate(scenario(60, 800), {"prefill": make_policy("prefill", spec)}, 0)
    wait = res.requests.sched_queue
    assert wait.max() <= 0.3 + 1e-9 and wait.mean() > 0.05


def test_fixed_batching_keeps_a_steadier_cadence_than_dynamic_batching():
    """Batching study (ALGORITHMS.md s4): fixed batches give the tighter cadence, dynamic more jitter."""
    out = {}
    for name in ("fixed_batch", "dynamic_batch"):
        cv, spread = [], []
        for seed in (0, 1):
            res = simulate(scenario(170, 3000), {"prefill": make_policy("prefill", {"name": name})}, seed)
            dur = res.steps.loc[res.steps.kind == PassKind.PREFILL, "dur"]
            cv.append(dur.std() / dur.mean())
            spread.append(res.requests.ttft.std())
        out[name] = (np.mean(cv), np.mean(spread))
    assert out["fixed_batch"][0] < out["dynamic_batch"][0]
    assert out["fixed_batch"][1] < out["dynamic_batch"][1]


# --------------------------------------------------------------------------- SBS
def test_sbs_cuts_mean_ttft_by_moving_the_queue_off_the_device():
    imm = [simulate(scenario(165, 4000), None, s).summary() for s in (0, 1)]
    sbs = [simulate(scenario(165, 4000), {"prefill": SBS()}, s).summary() for s in (0, 1)]
    ratio = np.mean([b["ttft_mean"] / a["ttft_mean"] for a, b in zip(imm, sbs)])
    assert ratio < 0.9, ratio
    assert np.mean([b["device_queue_s"] for b in sbs]) < 0.5 * np.mean([a["device_queue_s"] for a in imm])
    assert 0 < np.mean([b["sched_queue_s"] for b in sbs]) < np.mean([a["device_queue_s"] for a in imm])


def test_early_full_release_stops_the_interval_idling_a_ready_instance_at_overload():
    """early="full": at saturation (the cost model's full-chunk rate, 211 req/s) the interval holds a ready instance
    idle while the buffer could fill it; releasing then cuts the scheduler queue. Below saturation the buffer never
    fills an instance: no change. Bounds from the mechanism, not from a measured run: the early release only
    shortens the wait in the scheduler's buffer, so mean TTFT falls (strictly: the interval did idle ready
    instances) by at most the interval policy's own scheduler wait (TTFT - sched_queue_s of the same runs)."""
    def runs(rate, n, early):
        return [simulate(scenario(rate, n), {"prefill": SBS(overload="throttle", early=early)}, s).summary()
                for s in (0, 1)]

    def ttft(rs):
        return np.mean([r["ttft_mean"] for r in rs])

    saturated = full_chunk_rate(scenario(RATE, 100))
    assert ttft(runs(101, 800, "full")) == ttft(runs(101, 800, "none"))
    none, full = runs(saturated, 2500, "none"), runs(saturated, 2500, "full")
    floor = ttft(none) - np.mean([r["sched_queue_s"] for r in none])
    assert floor <= ttft(full) < ttft(none)


def test_length_composition_gives_short_prompts_short_passes():
    """compose="length": short and long prompts in separate passes cut SBS's mean TTFT, the short half gaining and
    the long half waiting a cycle more. Bounds from the mechanism, each computed on the runs themselves rather than
    set from a past result: the short half gains and the long half loses (directions); the mean falls, but by less
    than the short half's whole share: the long half does not gain, so the new mean is at least half the old
    long-half mean; the same work at the same rate below saturation keeps throughput (2% for 2,000 requests)."""
    base = [simulate(scenario(RATE, 2000), {"prefill": SBS(overload="throttle")}, s) for s in (0, 1)]
    comp = [simulate(scenario(RATE, 2000), {"prefill": SBS(overload="throttle", compose="length")}, s) for s in (0, 1)]
    for a, b in zip(base, comp):
        ra, rb = a.requests, b.requests
        short = ra.prompt <= ra.prompt.median()
        floor = 0.5 * ra.ttft[~short].mean() / ra.ttft.mean()  # long half (half the requests) unchanged at best
        assert floor < rb.ttft.mean() / ra.ttft.mean() < 1.0
        assert rb.ttft[short].mean() < ra.ttft[short].mean() and rb.ttft[~short].mean() >= ra.ttft[~short].mean()
        assert b.summary()["rps"] == pytest.approx(a.summary()["rps"], rel=0.02)  # same throughput


def test_pbaa_packs_passes_better_than_round_robin_over_dp_units():
    on = [simulate(scenario(200, 4000), {"prefill": SBS(overload="throttle")}, s).summary() for s in (0, 1)]
    off = [simulate(scenario(200, 4000), {"prefill": SBS(allocation="round_robin")}, s).summary() for s in (0, 1)]
    # The mechanism: PBAA packs each unit so passes do not queue on a device (round robin leaves a device
    # queue two orders of magnitude longer), and TTFT falls. The run is past capacity (offered 200 req/s), so
    # the TTFT ratio depends on the run length and the pass cost: 0.70 before issue 35's LM-head accounting,
    # 0.77 after; the paper's effect is sustainable QPS at a TTFT target (ALGORITHMS.md section 2), which this
    # test does not measure, so it bounds the direction and the device queue, not a ratio of its own output.
    assert np.mean([m["ttft_mean"] for m in on]) < np.mean([m["ttft_mean"] for m in off])
    assert np.mean([m["device_queue_s"] for m in on]) < 0.1 * np.mean([m["device_queue_s"] for m in off])


class Recording(SBS):
    def reset(self, sim):
        super().reset(sim)
        self.targets: list[tuple[float, int, float]] = []

    def release(self, sim, target):
        self.targets.append((sim.now, target, self.interval))
        return super().release(sim, target)


def test_sbs_staggers_releases_round_robin_at_the_adaptive_interval():
    pol = Recording(order="strict")
    sim = Simulator(scenario(120, 1500), {"prefill": pol}, 0)
    sim.run()
    t, target, interval = map(np.array, zip(*pol.targets))
    assert (target == np.arange(len(target)) % 3).all(), "strict round robin over the instances"
    assert (np.diff(t) >= interval[1:] - 1e-9).all(), "no release before I_opt has elapsed"
    cap = pol.cap
    assert pol.interval == pytest.approx((np.mean(cap._win) + sim.cfg.cluster.net_latency_s) / 3)
    assert len(cap._win) == 32 and cap.t_fwd < cap.t_full, "T_fwd comes from the EndForward window"


def test_an_end_forward_before_the_dispatch_lands_does_not_acknowledge_it():
    """EndForward of a pass that ended while our batch was still on the wire: not ready, watchdog armed."""
    from pdgym.baselines.pbaa import CapacityModel

    sim = Simulator(small(), None, 0)
    cap = CapacityModel()
    cap.reset(sim)
    cap.dispatched(0, 1, 500, sim.now)
    cap.end_forward(sim, 0, 0.05)  # at sim.now: the dispatch lands L_net later
    assert not cap.acked[0] and cap.u_flight[0, 1] == 500
    sim.now += 2 * sim.cfg.cluster.net_latency_s
    cap.end_forward(sim, 0, 0.05)
    assert cap.acked[0] and cap.u_flight[0].sum() == 0


def test_sbs_interval_follows_the_active_instance_count():
    cfg = scenario(100, 1500, "+faults.scale=[{at: 5.0, count: 2}]")
    pol = Recording()
    sim = Simulator(cfg, {"prefill": pol}, 0)
    sim.run()
    assert_accounted(sim)
    t, target, interval = map(np.array, zip(*pol.targets))
    assert set(target[t > 5.0].tolist()) <= {0, 1}
    late = interval[t > 6.0]
    assert list(pol.order) == [0, 1]
    assert pol.interval == pytest.approx((pol.cap.t_fwd + sim.cfg.cluster.net_latency_s) / 2)
    assert late.mean() > 1.2 * interval[(t > 1.0) & (t < 5.0)].mean()


def test_watchdog_and_quiescence_keep_sbs_serving_through_lost_signals_and_a_dead_instance():
    base = simulate(scenario(RATE, 3000), {"prefill": SBS()}, 0).summary()
    drop = scenario(RATE, 3000, "faults.drop_end_forward=0.3")
    pol = SBS()
    sim = Simulator(drop, {"prefill": pol}, 0)
    assert sim.run()
    assert_accounted(sim)
    assert sim.dropped_signals > 50
    assert SimResult(sim).summary()["ttft_mean"] < 1.5 * base["ttft_mean"]

    kill = scenario(RATE, 3000, "+faults.down=[{instance: 1, at: 8.0}]")
    pol = SBS()
    sim = Simulator(kill, {"prefill": pol}, 0)
    assert sim.run()
    assert_accounted(sim)
    assert pol.stats["watchdog_resets"] >= 1, "the dead instance went silent: the watchdog must fire"
    res = SimResult(sim)
    late = res.requests[res.requests.dispatch > 8.0 + sim.cfg.faults.detect_s + 1.0]
    assert len(late) and set(late.prefill_inst) <= {0, 2}
    assert (res.requests.status == "finished").mean() > 0.9


def test_cache_aware_pbaa_finds_more_prefix_hits():
    extra = ("workload.prefix_groups=64", "workload.prefix_frac=0.8", "cluster.prefill.prefix_cache_entries=8")
    hits = {}
    for alloc in ("pbaa", "pbaa_cache"):
        res = simulate(scenario(RATE, 3000, *extra), {"prefill": SBS(allocation=alloc, overload="throttle")}, 0)
        hits[alloc] = res.requests.cached.sum()
    assert hits["pbaa_cache"] > 1.2 * hits["pbaa"]
