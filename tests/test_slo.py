"""SLO tiers, length predictions, queue disciplines and early rejection (issue 33; ALGORITHMS.md section 9):
attainment against an independent recomputation, EDF against a hand-computed schedule, SJF against Cobham's
formula, the predictor's Kendall tau against its closed form, conservation under preemption, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim import ConfigError, Simulator, simulate
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.classes import SLOClass
from pdgym.envs.sim.config import LengthConfig
from pdgym.envs.sim.prediction import PredictorConfig, predict_lengths
from pdgym.envs.sim.workload import sample_lengths
from scipy.stats import kendalltau

TIERS = [{"name": "chat", "share": 0.6, "ttft_s": 0.4, "tpot_s": 0.03, "weight": 3.0},
         {"name": "batch", "share": 0.4, "ttft_s": 5.0, "tpot_s": 0.2, "weight": 1.0}]


def coloc(over: dict, scenario: str = "coloc_h100_qwen3_8b"):
    return merge_sim_config(load_scenario(scenario).sim, over)


def test_per_class_attainment_matches_a_recomputation_from_requests_csv(tmp_path):
    cfg = coloc({"workload": {"num_requests": 400, "concurrency": 96, "classes": TIERS,
                              "predictor": {"kind": "lognormal", "sigma": 1.0}},
                 "cluster": {"colocated": {"kv_capacity_tokens": 30000}}, "queue": {"order": "vllm_priority"}})
    res = simulate(cfg, None, seed=3)
    res.write(tmp_path)
    m = res.metrics()
    r = pd.read_csv(tmp_path / "requests.csv")
    slo = {t["name"]: (t["ttft_s"], t["tpot_s"], t["weight"]) for t in TIERS}
    fin = r.status == "finished"
    ttft_ok = fin & (r.ttft <= r["class"].map(lambda c: slo[c][0]))
    tpot_ok = fin & (r.tpot.isna() | (r.tpot <= r["class"].map(lambda c: slo[c][1])))
    both = ttft_ok & tpot_ok
    w = r["class"].map(lambda c: slo[c][2])
    assert set(r["class"]) == {"chat", "batch"}
    assert m["slo_attainment"] == pytest.approx((w * both).sum() / w.sum(), abs=1e-12)
    for name in slo:
        k = r["class"] == name
        assert m[f"slo_attainment_{name}"] == pytest.approx(both[k].mean(), abs=1e-12)
        assert m[f"slo_ttft_attainment_{name}"] == pytest.approx(ttft_ok[k].mean(), abs=1e-12)
        assert m[f"ttft_p99_{name}"] == pytest.approx(np.percentile(r.ttft[k & fin], 99), rel=1e-12)
    span = r.finish.max() - r.arrival.min()
    assert m["goodput_rps"] == pytest.approx(both.sum() / span, rel=1e-12)
    assert m["preemptions"] == r.preemptions.sum() > 0  # the tight KV preempted (by rank or to relieve it)
    assert m["predictor_kendall_tau"] == pytest.approx(kendalltau(r.predicted_output, r.output).statistic, abs=1e-12)


def test_one_class_is_the_scenario_slo_and_classes_leave_the_traffic_unchanged():
    base = coloc({"workload": {"num_requests": 300}})
    tiered = coloc({"workload": {"num_requests": 300, "classes": TIERS, "predictor": {"kind": "buckets"}}})
    a, b = Simulator(base, seed=5), Simulator(tiered, seed=5)
    for col in ("prompt", "output"):
        assert np.array_equal(getattr(a.req, col), getattr(b.req, col))
    assert np.array_equal(a._arrivals, b._arrivals) or (a._arrivals is None and b._arrivals is None)
    assert set(np.unique(a.req.cls)) == {0} and a.classes.names == ("default",)
    assert 0.45 < (b.req.cls == 0).mean() < 0.75  # share 0.6 of 300
    res = simulate(base, None, seed=5)
    m, r = res.metrics(), res.requests
    fin = r.status == "finished"
    good = fin & (r.ttft <= base.slo.ttft_s) & (r.tpot.isna() | (r.tpot <= base.slo.tpot_s))
    assert m["slo_attainment"] == pytest.approx(good.mean()) and "slo_attainment_default" not in m
    assert math.isnan(m["predictor_kendall_tau"]) and "predicted_output" not in r


def single_slot(over: dict) -> object:
    return merge_sim_config(load_scenario("md1_single_slot").sim, over)


def test_edf_on_a_single_server_follows_the_hand_computed_schedule():
    """One slot, equal lengths: each time the server frees, the waiting request with the earliest deadline
    a_i + ttft_k(i) starts (non-preemptive EDF), recomputed here from the arrivals, classes and service times."""
    cfg = single_slot({"workload": {"num_requests": 60, "rate": 60.0, "classes": [
        {"name": "tight", "share": 0.5, "ttft_s": 0.2, "tpot_s": 1.0},
        {"name": "loose", "share": 0.5, "ttft_s": 2.0, "tpot_s": 1.0}]}, "queue": {"order": "edf"}})
    r = simulate(cfg, None, seed=2).requests
    start = (r.arrival + r.sched_queue + r.device_queue).to_numpy()
    service = r.finish.to_numpy() - start
    assert np.ptp(service) < 1e-9  # equal lengths: one service time
    deadline = r.arrival.to_numpy() + np.where(r["class"] == "tight", 0.2, 2.0)
    arrival = r.arrival.to_numpy()
    t, waiting, nxt, expect = 0.0, [], 0, np.empty(len(r))  # t: when the server is next free
    for _ in range(len(r)):
        if not waiting:
            t = max(t, arrival[nxt])  # idle until the next arrival
        while nxt < len(r) and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        i = min(waiting, key=lambda j: (deadline[j], j))
        waiting.remove(i)
        expect[i] = t
        t += service[i]
    assert np.allclose(start, expect, atol=1e-9)
    assert (np.argsort(start) != np.arange(len(r))).any()  # EDF did reorder: not FCFS in disguise


def test_sjf_with_the_oracle_predictor_matches_cobham_on_a_single_slot():
    """Two job sizes (outputs 1 and 8 tokens) on one slot, Poisson arrivals at load ~0.5: SJF on the oracle
    prediction is M/G/1 non-preemptive priority with the short class first; mean waits within 5% of
    W_k = W0 / ((1 - sigma_{k-1})(1 - sigma_k)), W0 = sum lambda_j E[S_j^2] / 2."""
    cfg = single_slot({"workload": {"num_requests": 8000, "rate": 18.0, "prompt": {"dist": "fixed", "mean": 64},
                                    "output": {"dist": "empirical", "values": [1, 8]},
                                    "predictor": {"kind": "oracle"}}, "queue": {"order": "sjf"}})
    r = simulate(cfg, None, seed=3).requests
    wait = (r.sched_queue + r.device_queue).to_numpy()
    service = (r.finish - r.arrival).to_numpy() - wait
    small = r.output.to_numpy() == 1
    lam = (len(r) - 1) / (r.arrival.max() - r.arrival.min())
    lam1, lam2 = lam * small.mean(), lam * (~small).mean()
    rho1, rho2 = lam1 * service[small].mean(), lam2 * service[~small].mean()
    assert 0.4 < rho1 + rho2 < 0.6
    w0 = (lam1 * (service[small] ** 2).mean() + lam2 * (service[~small] ** 2).mean()) / 2
    assert wait[small].mean() == pytest.approx(w0 / (1 - rho1), rel=0.05)
    assert wait[~small].mean() == pytest.approx(w0 / ((1 - rho1) * (1 - rho1 - rho2)), rel=0.05)


def test_lognormal_predictor_tau_falls_with_sigma_and_matches_the_closed_form():
    s = 0.8  # log-sd of the true lengths (lognormal, cv = sqrt(exp(s^2) - 1)); max large: no clipping
    true = sample_lengths(LengthConfig(dist="lognormal", mean=2000, cv=math.sqrt(math.exp(s * s) - 1), max=10**9),
                          20000, np.random.default_rng(0))
    taus = []
    for sigma in (0.0, 0.25, 0.5, 1.0, 2.0):
        pred = predict_lengths(PredictorConfig(kind="lognormal", sigma=sigma), true, np.random.default_rng(1))
        tau = kendalltau(pred, true).statistic
        closed = 2 / math.pi * math.asin(s / math.sqrt(s * s + sigma * sigma))
        assert tau == pytest.approx(closed, abs=0.015), sigma
        taus.append(tau)
    assert all(a > b for a, b in zip(taus, taus[1:]))
    b = predict_lengths(PredictorConfig(kind="buckets", buckets=4, confusion=0.0), true, np.random.default_rng(1))
    assert len(np.unique(b)) == 4 and kendalltau(b, true).statistic > 0.6


def test_preemption_conserves_requests_at_every_pause():
    """vllm_priority on a tight KV budget: at any time, finished + rejected + in the system = arrived."""
    cfg = coloc({"workload": {"num_requests": 300, "concurrency": 128, "classes": TIERS},
                 "cluster": {"colocated": {"kv_capacity_tokens": 16000}}, "queue": {"order": "vllm_priority"}})
    sim = Simulator(cfg, seed=1)
    t = 0.0
    while not sim.run(until=t):
        st = sim.req.state
        arrived = int((~np.isnan(sim.req.arrival)).sum())
        done = int((st == R.FINISHED).sum() + (st == R.REJECTED).sum())
        inside = int(((st > R.NEW) & (st < R.FINISHED)).sum())
        assert done + inside == arrived
        t += 2.0
    assert int(sim.req.preemptions.sum()) > 0
    assert int(((sim.req.state == R.FINISHED) | (sim.req.state == R.REJECTED)).sum()) == 300


def test_conductor_rejects_early_and_counts_it_as_a_miss_and_goodput_per_gpu_recomputes(tmp_path):
    cfg = merge_sim_config(load_scenario("ds_v3_h800_3p1d").sim, {"workload": {
        "num_requests": 400, "rate": 300.0, "classes": TIERS}, "queue": {"order": "edf"}})
    res = simulate(cfg, {"prefill": make_policy("prefill", {"name": "conductor", "base": "sbs"})}, seed=0)
    m, r = res.metrics(), res.requests
    early = r.reason == "slo"
    assert m["early_rejections"] == early.sum() > 0
    assert (r.finish[early] == r.arrival[early]).all()  # at arrival
    assert m["slo_attainment"] < 1 - early.mean() * min(t["weight"] for t in TIERS) / 3.0
    # goodput per GPU from requests.csv: 3 prefill instances x (DP 8 x TP 2) + 1 decode instance x DP 32 = 80 GPUs
    res.write(tmp_path)
    r = pd.read_csv(tmp_path / "requests.csv")
    slo = {t["name"]: (t["ttft_s"], t["tpot_s"]) for t in TIERS}
    good = (r.status == "finished") & (r.ttft <= r["class"].map(lambda c: slo[c][0])) & (
        r.tpot.isna() | (r.tpot <= r["class"].map(lambda c: slo[c][1])))
    assert 0 < good.sum() < len(r)
    assert m["goodput_per_gpu"] == pytest.approx(good.sum() / (r.finish.max() - r.arrival.min()) / 80, rel=1e-12)


@pytest.mark.parametrize("over, key", [
    ({"workload": {"classes": [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.4}]}}, "workload.classes"),
    ({"workload": {"classes": [{"name": "a", "share": -0.5}, {"name": "b", "share": 1.5}]}}, "workload.classes[0].share"),
    ({"workload": {"classes": [{"name": "a", "share": 1.0, "ttft_s": 0.0}]}}, "workload.classes[0].ttft_s"),
    ({"workload": {"classes": [{"name": "a", "share": 1.0, "tpot_s": float("nan")}]}}, "workload.classes[0].tpot_s"),
    ({"workload": {"classes": [{"name": "a", "share": 1.0, "ttft_s": float("inf")}]}}, "workload.classes[0].ttft_s"),
    ({"workload": {"classes": [{"name": "a", "share": 0.5}, {"name": "a", "share": 0.5}]}}, "workload.classes[1].name"),
    ({"workload": {"classes": [{"name": "a", "share": 1.0, "weight": -1.0}]}}, "workload.classes[0].weight"),
    ({"workload": {"predictor": {"kind": "lognormal", "sigma": -0.1}}}, "workload.predictor.sigma"),
    ({"workload": {"predictor": {"kind": "buckets", "buckets": 1}}}, "workload.predictor.buckets"),
    ({"workload": {"predictor": {"kind": "buckets", "confusion": 1.5}}}, "workload.predictor.confusion"),
    ({"queue": {"order": "sjf"}}, "queue.order"),
    ({"queue": {"order": "sjf_oracle"}, "workload": {"predictor": {"kind": "oracle"}}}, "queue.order"),
    ({"queue": {"order": "lifo"}}, "queue.order"),
])
def test_bad_input_is_one_line_naming_the_key(over, key):
    with pytest.raises(ConfigError) as e:
        Simulator(coloc(over), seed=0)
    msg = str(e.value)
    assert msg.startswith(f"{key}:") and "\n" not in msg


def test_trace_labels_merge_two_services_on_their_timestamps_and_the_length_rule_splits_by_prompt():
    from pdgym.envs.sim.config import WorkloadConfig
    from pdgym.envs.sim.traces import read_trace
    from pdgym.envs.sim.workload import make_workload

    cfg = WorkloadConfig(num_requests=400, rate=None, class_by="trace", trace_arrivals="recorded",
                         classes=[SLOClass(name="conv", trace="azure_conv"), SLOClass(name="code", trace="azure_code")])
    wl = make_workload(cfg, np.random.default_rng(0))
    assert np.all(np.diff(wl.arrival) >= 0) and set(np.unique(wl.cls)) == {0, 1}
    for k, name in enumerate(("azure_conv", "azure_code")):  # each class's rows are its trace's first rows, in order
        tr = read_trace(name, "t")
        m = wl.cls == k
        assert np.array_equal(wl.prompt[m], tr.prompt[:m.sum()]) and np.array_equal(wl.output[m], tr.output[:m.sum()])
    rule = WorkloadConfig(num_requests=500, class_by="prompt", classes=[
        SLOClass(name="short", max_prompt=300), SLOClass(name="mid", max_prompt=900), SLOClass(name="long")],
        prompt=LengthConfig(dist="uniform", low=1, high=2000))
    wl = make_workload(rule, np.random.default_rng(1))
    assert np.array_equal(wl.cls, np.digitize(wl.prompt, [300.5, 900.5]))


def test_vllm_priority_on_a_disaggregated_decode_tier_preempts_batch_for_chat_and_conserves_requests():
    over = {"workload": {"num_requests": 400, "rate": 250.0, "classes": TIERS},
            "cluster": {"decode": {"kv_capacity_tokens": 6000, "batch_limit": 8}}}
    base = merge_sim_config(load_scenario("ds_v3_h800_3p1d").sim, over)
    prio = merge_sim_config(base, {"queue": {"order": "vllm_priority"}})
    fifo, ranked = simulate(base, None, seed=0), simulate(prio, None, seed=0)
    for res in (fifo, ranked):
        assert set(res.requests.status) <= {"finished", "rejected"}
    r = ranked.requests
    assert r.preemptions[r["class"] == "batch"].sum() > 2 * r.preemptions[r["class"] == "chat"].sum() > 0
    assert ranked.metrics()["slo_tpot_attainment_chat"] >= fifo.metrics()["slo_tpot_attainment_chat"]


def test_a_trace_class_column_labels_each_row_with_the_tier_of_that_name(tmp_path):
    """class_by=label: requests.csv's class is the replayed rows' own label (Azure CSV and Mooncake JSON lines),
    whatever the order of the tiers; a label no tier names, a missing label or a trace without the column is one
    line naming the key."""
    import json

    rng = np.random.default_rng(0)
    labels = rng.choice(["batch", "chat"], size=60, p=[0.3, 0.7])
    rows = "".join(f"{0.1 * i:.1f},{int(p)},{int(o)},{c}\n" for i, (p, o, c) in
                   enumerate(zip(rng.integers(50, 500, 60), rng.integers(2, 40, 60), labels)))
    csv = tmp_path / "labelled.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,class\n" + rows)
    jsonl = tmp_path / "labelled.jsonl"
    jsonl.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 600, "output_length": 8,
                                         "hash_ids": [i, i + 1], "class": c}) + "\n" for i, c in enumerate(labels)))
    # the tiers in the other order than the labels' first appearance (chat): a code passed through unmapped fails
    tiers = [{"name": "batch", "ttft_s": 8.0}, {"name": "chat", "ttft_s": 0.3, "tpot_s": 0.05, "weight": 2.0}]
    for trace in (csv, jsonl):
        cfg = coloc({"workload": {"trace": str(trace), "trace_offset": 10, "num_requests": 40, "class_by": "label",
                                  "classes": tiers, "arrival": "trace", "rate": None}})
        r = simulate(cfg, None, seed=1).requests
        assert list(r["class"].astype(str)) == list(labels[10:50]), trace.name
    bad = [("gold", "workload.trace: class label 'gold' in column class names no class of workload.classes; "
                    "allowed: batch, chat"),
           ("", "workload.trace: missing or non-text class label")]
    for label, want in bad:
        csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,class\n0,10,5,chat\n1,10,5," + label + "\n")
        with pytest.raises(ConfigError) as e:
            Simulator(coloc({"workload": {"trace": str(csv), "num_requests": 2, "class_by": "label",
                                          "classes": tiers}}), seed=0)
        assert str(e.value).startswith(want), str(e.value)
    with pytest.raises(ConfigError, match=r"^workload.trace: 'azure_code' has no class column"):
        Simulator(coloc({"workload": {"trace": "azure_code", "num_requests": 5, "class_by": "label",
                                      "classes": tiers}}), seed=0)


def test_distserve_goodput_search_reports_the_rate_and_its_share_per_gpu(tmp_path, monkeypatch):
    """pdgym-repro goodput on the P/D tiers board (80 GPUs: 3 x DP 8 x TP 2 prefill + DP 32 decode): the reported
    rate is the highest probed rate that met the target, every probed rate above it missed, and per GPU it is
    that rate / 80."""
    import json

    from pdgym.agents.apps import repro

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "gp"
    try:
        repro.main(["goodput", "scenario=slo_pd_tiers", "workload.num_requests=200", "repro.rel_tol=0.2",
                    f"hydra.run.dir={out}"])
    except SystemExit as e:
        assert e.code in (0, None)
    s = json.loads((out / "summary.json").read_text())
    probes = pd.read_csv(out / "results.csv")
    met = probes[probes.slo_attainment >= s["target"]]
    assert s["goodput_rps"] == pytest.approx(met.rate.max(), rel=1e-12)
    assert (probes[probes.rate > s["goodput_rps"]].slo_attainment < s["target"]).all()
    assert s["gpus"] == 80 and s["goodput_per_gpu"] == pytest.approx(s["goodput_rps"] / 80, rel=1e-12)


def test_a_board_ranks_by_a_per_class_metric_in_its_direction():
    """Per-class keys (slo_attainment_<class>, ttft_p99_<class>, ...) are board metrics: accepted as a primary,
    ranked higher-better for attainment and lower-better for latency, and masked with the rest on a stalled seed."""
    from pdgym.agents.evaluation.leaderboard_run import board_scenarios
    from pdgym.agents.evaluation.leaderboard_stats import summarise
    from pdgym.agents.evaluation.metric_keys import check_metric_names, direction

    assert [direction(m) for m in ("slo_attainment_chat", "slo_tpot_attainment", "slo_ttft_attainment_batch",
                                   "goodput_per_gpu", "ttft_p99_chat", "tpot_mean_batch", "early_rejections")] == \
        [1, 1, 1, 1, -1, -1, -1]
    assert check_metric_names("metrics", ["ttft_p99_chat", "preemptions"]) == ["ttft_p99_chat", "preemptions"]
    with pytest.raises(ConfigError, match=r"^metrics: unknown metric 'slo_attainment_'.*slo_attainment_<class>"):
        check_metric_names("metrics", ["slo_attainment_"])
    boards = {}
    for primary in ("slo_attainment_chat", "ttft_p99_chat"):
        (boards[primary],) = board_scenarios({"b": {"scenario": "slo_pd_tiers", "point": "prefill", "primary": primary}})
    runs = pd.DataFrame({"scenario": "b", "policy": ["fcfs", "fcfs", "edf", "edf", "sjf", "sjf"], "kind": "baseline",
                         "seed": [0, 1] * 3, "slo_attainment_chat": [0.5, 0.6, 0.9, 0.8, 0.99, 0.97],
                         "ttft_p99_chat": [3.0, 2.0, 1.0, 1.2, 0.1, 0.2], "stopped": ["", "", "", "", "", "horizon"]})
    ranked = {p: list(dict.fromkeys(summarise(runs, [b], [p]).policy)) for p, b in boards.items()}
    # sjf would win both, but one of its seeds stopped early: no mean, last
    assert ranked == {"slo_attainment_chat": ["edf", "fcfs", "sjf"], "ttft_p99_chat": ["edf", "fcfs", "sjf"]}


# --------------------------------------------------------------------------- numbers that cannot overflow (issue 47)
def test_lognormal_predictions_stay_in_range_where_exp_overflows():
    """At sigma = 10 a 4-sd draw scales a length of 1000 by e^40 (2e20): past int64, the cast wrapped to -2**63,
    which SJF served first. Clipped in float, every prediction is a length in [1, MAX_PREDICTION], and the order
    of the predictions is the order of the floats they came from wherever neither is clipped."""
    from pdgym.envs.sim.prediction import MAX_PREDICTION

    out = np.full(20000, 1000, dtype=np.int64)
    pred = predict_lengths(PredictorConfig(kind="lognormal", sigma=10.0), out, np.random.default_rng(0))
    assert pred.min() == 1 and pred.max() == MAX_PREDICTION  # both clips reached by this many draws
    z = np.random.default_rng(0).standard_normal(20000)
    inside = (pred > 1) & (pred < MAX_PREDICTION)
    assert inside.any() and np.all(np.diff(pred[inside][np.argsort(z[inside])]) >= 0)


@pytest.mark.parametrize("over, key, words", [
    ({"predictor": {"kind": "lognormal", "sigma": 1000.0}}, "workload.predictor.sigma", "allowed [0, 10]"),
    ({"predictor": {"kind": "lognormal", "sigma": 60.0}}, "workload.predictor.sigma", "no rank signal"),
    ({"predictor": {"kind": "buckets", "buckets": 1_000_000_000}}, "workload.predictor.buckets", "[2, 1000]"),
    ({"classes": [{"name": f"c{i}", "share": 1 / 200} for i in range(200)]}, "workload.classes", "at most 128"),
    ({"class_by": "prompt", "classes": [{"name": "a", "max_prompt": 1000}, {"name": "b", "max_prompt": 500}]},
     "workload.classes[1].max_prompt", "must be null"),
    ({"class_by": "prompt", "classes": [{"name": "a", "max_prompt": 900}, {"name": "b", "max_prompt": 300},
                                        {"name": "c"}]}, "workload.classes", "strictly increase"),
    ({"classes": [{"name": "x" * 1_000_000, "share": 0.5}, {"name": "x" * 1_000_000, "share": 0.5}]},
     "workload.classes[1].name", "(1,000,002 characters)"),
])
def test_bounds_that_kept_numbers_from_wrapping_are_one_line(over, key, words):
    """sigma=1000 (or 60 with SJF) overflowed exp; 1e9 buckets asked for 7.45 GiB; 200 classes wrapped int8 class
    codes; a decreasing max_prompt was ignored; a 1 MB name was echoed whole."""
    with pytest.raises(ConfigError) as e:
        Simulator(coloc({"workload": over}), seed=0)
    msg = str(e.value)
    assert msg.startswith(f"{key}:") and words in msg and "\n" not in msg and len(msg) < 400, msg[:300]


def test_max_classes_is_what_int8_codes_hold():
    """128 classes (codes 0-127) run with every code intact; 129 are refused (above, one line)."""
    from pdgym.envs.sim.classes import MAX_CLASSES

    assert MAX_CLASSES == 128
    tiers = [{"name": f"c{i}", "share": 1 / 128} for i in range(128)]
    r = simulate(coloc({"workload": {"classes": tiers, "num_requests": 400}}), None, seed=0).requests
    assert set(r["class"].astype(str)) <= {t["name"] for t in tiers} and r["class"].cat.codes.min() >= 0


def test_prefill_admit_with_more_classes_than_codes_is_refused_at_make():
    """PrefillAdmit-v0 with 200 classes reset and stepped on wrapped class codes."""
    import gymnasium as gym
    import pdgym.envs  # noqa: F401

    tiers = "[" + ",".join(f"{{name: c{i}, share: 0.005}}" for i in range(200)) + "]"
    with pytest.raises(ConfigError, match=r"^workload.classes: 200 classes; at most 128"):
        gym.make("pdgym/PrefillAdmit-v0", scenario="slo_pd_tiers", overrides=[f"workload.classes={tiers}"]).reset(seed=0)
