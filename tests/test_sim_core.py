"""The event core: invariants on random clusters, determinism, and queueing results it must reproduce."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdgym.envs.sim import ConfigError, SimResult, Simulator, simulate
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.events import PassKind
from pdgym.envs.sim.observers import Observer
from pdgym.envs.sim.policy import RoundRobinDispatch
from pdgym.envs.sim.view import OracleError, RunView

LINEAR = {"kind": "linear", "params": {"a_p": 0.01, "b_p": 2e-5, "a_d": 0.008, "b_d": 5e-5}}


def disagg(**over):
    cfg = {
        "hardware": "h800", "model": "deepseek_v3", "cost": LINEAR,
        "cluster": {"topology": "disaggregated",
                    "prefill": {"count": 2, "dp": 4, "ep": 4, "chunk_tokens": 2048, "kv_capacity_tokens": 100000},
                    "decode": {"count": 1, "dp": 8, "ep": 8, "batch_limit": 16, "kv_capacity_tokens": 20000}},
        "workload": {"num_requests": 300, "arrival": "poisson", "rate": 40.0,
                     "prompt": {"dist": "uniform", "low": 16, "high": 2048},
                     "output": {"dist": "geometric", "mean": 40, "max": 400}},
    }
    for k, v in over.items():
        cfg[k] = v
    return cfg


def coloc(**over):
    cfg = {
        "hardware": "h200", "model": "qwen3_8b", "cost": LINEAR,
        "cluster": {"topology": "colocated",
                    "colocated": {"count": 1, "dp": 1, "batch_limit": 32, "chunk_tokens": 1024,
                                  "kv_capacity_tokens": 40000}},
        "workload": {"num_requests": 300, "arrival": "poisson", "rate": 20.0,
                     "prompt": {"dist": "uniform", "low": 16, "high": 1500},
                     "output": {"dist": "geometric", "mean": 40, "max": 400}},
    }
    cfg.update(over)
    return cfg


class CapacityCheck(Observer):
    """Asserts capacities after every pass end (the places where state grows) and at prefill pass starts."""

    def __init__(self):
        self.checked = 0

    def on_pass_end(self, sim, kind, inst):
        self.checked += 1
        for d in sim.decode:
            assert (d.batch <= d.batch_limit).all(), "decode batch limit exceeded"
            assert (d.kv <= d.kv_cap).all(), "decode KV capacity exceeded"
            assert (d.batch == [len(a) for a in d.active]).all()
            assert d.n_batch == int(d.batch.sum()), "the running count drifted from the per-worker batches"
        for C in sim.colocated:
            for u in C.units:
                assert u.n_running <= u.slots, "colocated slots exceeded"
                assert u.kv_used <= u.kv_cap, "colocated KV exceeded"

    def on_pass_start(self, sim, p):
        if p.kind == PassKind.PREFILL:
            P = sim.prefill[p.inst]
            assert (P.running_tokens <= P.chunk_tokens).all(), "prefill chunk capacity exceeded"


def run_checked(cfg, seed=0) -> tuple[Simulator, SimResult]:
    sim = Simulator(cfg, None, seed)
    check = CapacityCheck()
    sim.observe(check)
    assert sim.run()
    assert check.checked > 0
    return sim, SimResult(sim)


def assert_accounted(sim: Simulator) -> None:
    req = sim.req
    st_ = req.state
    assert np.isin(st_, [R.FINISHED, R.REJECTED]).all(), "a request was lost"
    fin = st_ == R.FINISHED
    assert (req.done[fin] == req.output[fin]).all(), "a finished request has missing tokens"
    assert sim.tokens_out == int(req.done.sum()), "output tokens not conserved"
    assert (req.reason[st_ == R.REJECTED] > 0).all(), "a rejection without a reason"
    assert not sim.buffer and not sim.pool
    for d in sim.decode:
        assert d.kv.sum() == 0 and d.batch.sum() == 0
    for C in sim.colocated:
        for u in C.units:
            assert u.kv_used == 0 and u.n_running == 0 and not u.waiting


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    topology=st.sampled_from(["disaggregated", "colocated"]),
    dp=st.integers(1, 4),
    count=st.integers(1, 3),
    limit=st.integers(1, 12),
    kv=st.integers(3000, 30000),
    rate=st.floats(2.0, 200.0),
    out_mean=st.integers(1, 80),
    kv_policy=st.sampled_from(["preempt", "reject"]),
    cache=st.sampled_from([0, 4]),
    drop=st.sampled_from([0.0, 0.3]),
)
def test_invariants_on_random_clusters(seed, topology, dp, count, limit, kv, rate, out_mean, kv_policy, cache,
                                       drop):
    wl = {"num_requests": 120, "arrival": "poisson", "rate": rate, "prefix_groups": 3,
          "prompt": {"dist": "uniform", "low": 1, "high": 2500},
          "output": {"dist": "geometric", "mean": out_mean, "max": 600}}
    if topology == "disaggregated":
        cl = {"topology": topology, "kv_policy": kv_policy,
              "prefill": {"count": count, "dp": dp, "chunk_tokens": 1024, "kv_capacity_tokens": 10**6,
                          "prefix_cache_entries": cache},
              "decode": {"count": count, "dp": dp, "batch_limit": limit, "kv_capacity_tokens": kv}}
        faults = {"drop_end_forward": drop, "detect_s": 0.2,
                  "down": [{"instance": 0, "at": 0.5, "until": 1.5}] if count > 1 else []}
        cfg = disagg(cluster=cl, workload=wl, faults=faults)
    else:
        cl = {"topology": topology, "kv_policy": kv_policy,
              "colocated": {"count": count, "dp": dp, "batch_limit": limit, "chunk_tokens": 512,
                            "kv_capacity_tokens": kv}}
        cfg = coloc(cluster=cl, workload=wl)
    sim, res = run_checked(cfg, seed)
    assert_accounted(sim)
    assert not sim.stalled
    m = res.summary()
    assert m["finished"] + m["rejected"] == 120


def test_tight_kv_preempts_and_recomputes_without_loss():
    cl = {"topology": "disaggregated",
          "prefill": {"count": 1, "dp": 2, "chunk_tokens": 2048, "kv_capacity_tokens": 10**6},
          "decode": {"count": 1, "dp": 2, "batch_limit": 64, "kv_capacity_tokens": 6000}}
    sim, res = run_checked(disagg(cluster=cl), seed=3)
    assert_accounted(sim)
    assert sim.req.preemptions.sum() > 0, "the scenario was meant to exhaust KV"
    assert (res.requests.status == "finished").mean() > 0.9


def test_same_seed_same_history_and_different_seeds_differ():
    a = simulate(disagg(), seed=7).requests
    b = simulate(disagg(), seed=7).requests
    c = simulate(disagg(), seed=8).requests
    assert a.equals(b)
    assert not a[["arrival", "finish"]].equals(c[["arrival", "finish"]])


def test_summary_has_exactly_the_design_keys():
    from pdgym.envs.sim.metrics import SUMMARY_KEYS

    m = simulate(disagg(), seed=0).summary()
    assert tuple(m) == SUMMARY_KEYS
    assert m["finished"] == 300 and m["rejected"] == 0
    assert m["throughput_tok_s"] > 0 and 0 < m["chunk_util_mean"] <= 1
    assert m["ttft_p50"] <= m["ttft_p99"]


def test_md1_mean_wait_matches_pollaczek_khinchine():
    """One slot, fixed lengths, Poisson arrivals, FCFS: M/D/1, W = rho D / (2 (1 - rho))."""
    base = coloc(cluster={"topology": "colocated", "net_latency_s": 0.0,
                          "colocated": {"batch_limit": 1, "chunk_tokens": 2048, "kv_capacity_tokens": 10**5}})
    base["workload"] = {"num_requests": 1, "arrival": "poisson", "rate": 1.0,
                        "prompt": {"dist": "fixed", "mean": 256}, "output": {"dist": "fixed", "mean": 2}}
    one = simulate(base, seed=0).requests.iloc[0]
    d = one.finish - one.arrival
    rho = 0.5
    waits = []
    for seed in range(3):
        base["workload"] = dict(base["workload"], num_requests=20000, rate=rho / d)
        waits.append(simulate(base, seed=seed).requests.device_queue.mean())
    theory = rho * d / (2 * (1 - rho))
    assert abs(np.mean(waits) / theory - 1) < 0.03


def test_gated_batch_insensitive_prefill_waits_half_a_pass():
    """Immediate dispatch to a busy gated instance waits T/2 on the device, whatever the load."""
    T = 0.2
    cost = {"kind": "linear", "params": {"a_p": T, "b_p": 0.0, "a_d": 0.001, "b_d": 0.0}}
    cl = {"topology": "disaggregated", "net_latency_s": 0.0,
          "prefill": {"count": 1, "dp": 1, "chunk_tokens": 10**5, "kv_capacity_tokens": 10**6},
          "decode": {"count": 1, "dp": 1, "batch_limit": 4096, "kv_capacity_tokens": 10**7}}
    wl = {"num_requests": 3000, "arrival": "deterministic", "rate": 57.0,
          "prompt": {"dist": "fixed", "mean": 100}, "output": {"dist": "fixed", "mean": 2}}
    res = simulate(disagg(cost=cost, cluster=cl, workload=wl), seed=0)
    assert res.summary()["device_queue_s"] == pytest.approx(T / 2, rel=0.05)


def test_itl_and_tpot_are_consistent():
    res = simulate(disagg(), seed=1)
    r = res.requests[(res.requests.status == "finished") & (res.requests.output > 2)]
    assert (r.itl >= r.tpot - 1e-12).all(), "the longest gap is at least the mean gap"
    assert (r.e2e >= r.ttft).all()


def test_horizon_rejects_the_rest_with_a_reason():
    cfg = disagg(max_sim_time_s=2.0)
    res = simulate(cfg, seed=0)
    req = res.requests
    assert set(req.status) <= {"finished", "rejected"}
    assert (req.loc[req.status == "rejected", "reason"] == "horizon").all()
    assert (req.status == "rejected").any()


def test_prompt_larger_than_kv_is_a_config_error():
    cl = {"topology": "colocated", "colocated": {"kv_capacity_tokens": 1000}}
    with pytest.raises(ConfigError, match="kv_capacity_tokens"):
        Simulator(coloc(cluster=cl), None, 0)


@pytest.mark.parametrize("key,value,match", [
    (("cluster", "prefill", "count"), 0, "cluster.prefill.count"),
    (("cluster", "decode", "batch_limit"), -1, "cluster.decode.batch_limit"),
    (("cluster", "prefill", "chunk_tokens"), 0, "cluster.prefill.chunk_tokens"),
    (("workload", "rate"), 0.0, "workload.rate"),
    (("cluster", "topology"), "mesh", "cluster.topology"),
    (("workload", "bogus"), 1, "workload.bogus"),
    (("hardware",), "tpu_v9", "hardware"),
    (("model",), "gpt-7", "model"),
])
def test_bad_values_fail_with_one_line_naming_the_key(key, value, match):
    cfg = disagg()
    node = cfg
    for k in key[:-1]:
        node = node[k]
    node[key[-1]] = value
    with pytest.raises(ConfigError) as exc:
        Simulator(cfg, None, 0)
    assert match in str(exc.value) and "\n" not in str(exc.value)


def test_faults_lose_nothing():
    f = {"drop_end_forward": 0.3, "down": [{"instance": 0, "at": 1.0, "until": 4.0}], "detect_s": 0.5}
    sim, _ = run_checked(disagg(faults=f), seed=2)
    assert_accounted(sim)
    assert sim.dropped_signals > 0
    assert not np.isnan(sim.req.finish).any()
    served_after = sim.req.prefill_inst[sim.req.dispatch > 4.5]
    assert 0 in served_after, "the instance that came back never served again"


def test_scale_event_changes_active_instances():
    f = {"scale": [{"at": 2.0, "count": 3}, {"at": 5.0, "count": 1}]}
    sim, res = run_checked(disagg(faults=f), seed=4)
    assert_accounted(sim)
    used = set(res.requests.prefill_inst)
    assert 2 in used, "the scaled-up instance never served"
    late = res.requests[res.requests.dispatch > 5.5]
    assert set(late.prefill_inst) <= {0}


def test_prefill_work_is_conserved_and_prefix_hits_cut_it():
    cl = {"topology": "disaggregated",
          "prefill": {"count": 1, "dp": 2, "chunk_tokens": 1024, "kv_capacity_tokens": 10**6,
                      "prefix_cache_entries": 8},
          "decode": {"count": 1, "dp": 4, "batch_limit": 64, "kv_capacity_tokens": 10**6}}
    wl = {"num_requests": 400, "arrival": "poisson", "rate": 30.0, "prefix_groups": 4, "prefix_frac": 0.6,
          "prompt": {"dist": "uniform", "low": 100, "high": 3000}, "output": {"dist": "fixed", "mean": 4}}
    sim, res = run_checked(disagg(cluster=cl, workload=wl), seed=5)
    assert_accounted(sim)
    req = res.requests
    assert req.cached.sum() > 0.2 * (req.prompt * 0.6).sum(), "repeated prefixes should mostly hit"
    computed = res.steps.loc[res.steps.kind == PassKind.PREFILL, "tokens"].sum()
    assert computed == req.prompt.sum() - req.cached.sum()


# --------------------------------------------------------------------------- what policies and observers see
class _Probe(RoundRobinDispatch):
    """Checks the view it is handed on the first arrival, then dispatches like the engine default."""

    def __init__(self):
        self.checked = False

    def on_arrival(self, sim, rid):
        if not self.checked:
            self.checked = True
            assert isinstance(sim, RunView) and not isinstance(sim, Simulator)
            assert not hasattr(sim, "run") and not hasattr(sim, "_heap")
            with pytest.raises(ValueError, match="read-only"):
                sim.req.prompt[rid] = 1
            with pytest.raises(TypeError):
                sim.buffer[rid + 1] = None
            assert rid in sim.buffer and sim.req.load(rid) == int(sim.req.prompt[rid])
            if sim.cfg.oracle:
                self.output = int(sim.req.output[rid])
            else:
                with pytest.raises(OracleError, match="oracle"):
                    _ = sim.req.output
        super().on_arrival(sim, rid)


@pytest.mark.parametrize("oracle", [False, True])
def test_policies_get_a_read_only_view_and_output_lengths_only_under_oracle(oracle):
    probe = _Probe()
    sim = Simulator({**disagg(), "oracle": oracle, "workload": {**disagg()["workload"], "num_requests": 20}},
                    {"prefill": probe}, 0)
    assert sim.run() and probe.checked
    if oracle:
        assert probe.output == int(sim.req.output[0])


class _Passes(Observer):
    def __init__(self):
        self.idle, self.ends, self.finished = [], 0, 0

    def on_pass_start(self, sim, p):
        u = p.unit_time
        self.idle.append((p.kind, p.inst, p.t, 1.0 - u.mean() / u.max() if u.max() > 0 else 0.0))

    def on_pass_end(self, sim, kind, inst):
        self.ends += 1

    def on_finish(self, sim, rid):
        self.finished += 1


@pytest.mark.parametrize("cfg", [disagg(), coloc()], ids=["disaggregated", "colocated"])
def test_observers_see_every_pass_with_its_unit_times_and_change_nothing(cfg):
    plain = simulate(cfg, None, 3)
    sim = Simulator(cfg, None, 3)
    obs = _Passes()
    sim.observe(obs)
    assert sim.run()
    res = SimResult(sim)
    assert res.requests.equals(plain.requests) and res.steps.equals(plain.steps)
    steps = res.steps
    assert len(obs.idle) == len(steps) and obs.ends == len(steps)  # every pass started and ended
    got = np.array([x[3] for x in obs.idle])
    assert np.allclose(got, steps.idle_frac.to_numpy())  # the barrier idle the step table records
    assert [int(x[0]) for x in obs.idle] == steps.kind.tolist()
    assert obs.finished == res.summary()["finished"]


def test_step_log_keeps_every_row_across_chunks_and_a_frame_taken_mid_run_stays_put():
    """StepLog (the step table in compact chunks) gives what a DataFrame of the rows gives, on either side
    of chunk boundaries; a frame taken before more rows arrive does not change."""
    import pandas as pd
    from pdgym.envs.sim import steplog

    rng = np.random.default_rng(0)
    n = 2 * steplog.CHUNK + 17
    rows = [(float(t), 0.01, 1, i % 3, float(i), i % 7, i, -i, 0.5, 0.25) for i, t in enumerate(rng.random(n))]
    log = steplog.StepLog()
    log.append(rows[0])
    first = log.frame()
    for r in rows[1:steplog.CHUNK + 5]:
        log.append(r)
    mid = log.frame()
    for r in rows[steplog.CHUNK + 5:]:
        log.append(r)
    full = log.frame()
    want = pd.DataFrame.from_records(rows, columns=list(steplog.COLUMNS))  # 64-bit: the values, not the widths
    pd.testing.assert_frame_equal(full, want, check_dtype=False)
    pd.testing.assert_frame_equal(mid, want.iloc[:steplog.CHUNK + 5], check_dtype=False)
    assert [full[c].dtype for c in steplog.COLUMNS] == [log.dtype[c] for c in steplog.COLUMNS]
    assert len(first) == 1 and first.t[0] == rows[0][0] and len(log) == n
    assert steplog.StepLog(float_reqs=True).frame().reqs.dtype == np.float64
