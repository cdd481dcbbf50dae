"""Trace export and run views: the Chrome / Perfetto trace is well formed, every unit's slice fits
its pass, the gaps are the barrier idle, and pdgym-sim writes the CDFs, time series and trace."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pdgym.agents import plots
from pdgym.agents.run_views import latency_table
from pdgym.agents.trace import PassRecorder, busy_from_unit_times, chrome_trace, instance_keys, simulate_traced
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim.events import PassKind

# Trace Event Format: the fields each phase we emit must carry (Trace Event Format document,
# "Complete Events", "Async Events" (nestable), "Metadata Events").
REQUIRED = {
    "X": {"name", "ph", "ts", "dur", "pid", "tid"},
    "b": {"name", "cat", "ph", "ts", "pid", "id"},
    "e": {"name", "cat", "ph", "ts", "pid", "id"},
    "M": {"name", "ph", "pid", "args"},
}
METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}


def check_trace(obj: dict) -> None:
    """Fail unless `obj` is a valid JSON-object-form trace as ui.perfetto.dev / chrome://tracing read it."""
    assert isinstance(obj["traceEvents"], list) and obj["displayTimeUnit"] in ("ms", "ns")
    json.dumps(obj, allow_nan=False)  # strict JSON: no NaN / Infinity
    stacks: dict[tuple, list[str]] = defaultdict(list)
    for e in obj["traceEvents"]:
        ph = e["ph"]
        assert ph in REQUIRED, f"unexpected phase {ph}"
        missing = REQUIRED[ph] - set(e)
        assert not missing, f"{ph} event without {missing}: {e}"
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if ph == "M":
            assert e["name"] in METADATA and METADATA[e["name"]] in e["args"]
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if ph == "X":
            assert e["dur"] >= 0
        elif ph == "b":
            stacks[(e["cat"], e["id"])].append(e["name"])
        else:  # 'e' closes the innermost open slice of its (cat, id), by name
            assert stacks[(e["cat"], e["id"])].pop() == e["name"]
    assert not any(stacks.values()), "async slice never closed"


def synthetic_passes() -> PassRecorder:
    """Two prefill instances (DP 4) and one decode instance (DP 2): unequal units, an empty unit."""
    rng = np.random.default_rng(0)
    rec = PassRecorder()
    for inst, t0 in ((0, 0.0), (1, 0.01)):
        t = t0
        for _ in range(5):
            unit = rng.uniform(0.0, 0.05, 4)
            unit[rng.integers(4)] = 0.0
            dur = 0.002 + unit.max()
            rec.record(t, dur, "prefill", inst, busy_from_unit_times(dur, unit), prefill_tokens=np.sign(unit) * 500)
            t += dur + rng.uniform(0, 0.01)
    t = 0.05
    for _ in range(8):
        unit = rng.uniform(0.005, 0.01, 2)
        rec.record(t, unit.max(), "decode", 0, busy_from_unit_times(unit.max(), unit), decode_reqs=[10, 20])
        t += unit.max()
    return rec


def requests_frame() -> pd.DataFrame:
    nan = float("nan")
    return pd.DataFrame({
        "id": [0, 1, 2], "arrival": [0.0, 0.001, 0.002], "dispatch": [0.0, 0.004, nan],
        "first_token": [0.03, 0.05, nan], "finish": [0.09, 0.12, 0.02],
        "status": ["finished", "finished", "rejected"], "reason": ["", "", "kv_exhausted"],
        "prompt": [100, 200, 300], "output": [10, 20, 5]})


def unit_slices(trace: dict) -> dict[tuple[int, int], list[dict]]:
    out = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            out[(e["pid"], e["tid"])].append(e)
    return out


def test_trace_has_the_required_fields_and_closes_every_async_slice():
    rec = synthetic_passes()
    tr = chrome_trace(rec.passes, requests_frame(), idle_slices=True)
    check_trace(tr)
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name"}
    assert names == {"prefill 0 (DP 4)", "prefill 1 (DP 4)", "decode 0 (DP 2)", "requests"}
    req = [e for e in tr["traceEvents"] if e.get("cat") == "request" and e["ph"] == "b"]
    assert [e["name"] for e in req if e["id"] == 2] == ["request 2", "rejected: kv_exhausted"]
    assert [e["name"] for e in req if e["id"] == 1] == ["request 1", "scheduler", "prefill", "decode"]


def test_a_bad_trace_fails_the_check():
    tr = chrome_trace(synthetic_passes().passes, requests_frame())
    x = next(e for e in tr["traceEvents"] if e["ph"] == "X")
    del x["dur"]
    with pytest.raises(AssertionError):
        check_trace(tr)


def test_unit_slices_fit_their_pass_and_the_gaps_are_the_barrier_idle():
    rec = synthetic_passes()
    tr = chrome_trace(rec.passes)
    pids = instance_keys(rec.passes)
    slices = unit_slices(tr)
    for p in rec.passes:
        pid = pids[(p.kind, p.inst)]
        whole = next(e for e in slices[(pid, 0)] if e["ts"] == round(p.t * 1e6, 3))
        assert whole["dur"] == pytest.approx(p.dur * 1e6, abs=1e-3)
        for u in range(len(p.busy)):
            mine = [e for e in slices[(pid, u + 1)] if e["ts"] == whole["ts"]]
            busy_us = mine[0]["dur"] if mine else 0.0  # a unit without work has no slice: all idle
            assert busy_us <= whole["dur"] + 1e-9
            gap = whole["dur"] - busy_us
            assert gap == pytest.approx(p.idle[u] * 1e6, abs=2e-3)
        # the barrier: the slowest unit never waits; the step table's idle_frac is the mean wait
        # over the slowest unit's compute time (here dur minus the 2 ms overhead for prefill)
        assert p.idle.min() == pytest.approx(0.0, abs=1e-12)


def test_idle_slices_fill_exactly_the_gaps():
    rec = synthetic_passes()
    tr = chrome_trace(rec.passes, idle_slices=True)
    idle = [e for e in tr["traceEvents"] if e.get("cat") == "idle"]
    total = sum(e["dur"] for e in idle) / 1e6
    assert total == pytest.approx(sum(p.idle.sum() for p in rec.passes), rel=1e-6)
    by_track = unit_slices(tr)
    for track in by_track.values():  # on a unit, pass slices and idle slices never overlap
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in track)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))


def test_recorder_clips_float_noise_and_busy_follows_the_barrier():
    rec = PassRecorder()
    rec.record(1.0, 0.5, "decode", 0, [0.5 + 1e-15, 0.2])
    assert rec.passes[0].busy.max() <= 0.5 and rec.passes[0].idle.tolist() == pytest.approx([0.0, 0.3])
    busy = busy_from_unit_times(0.012, np.array([0.004, 0.010, 0.0]))  # 2 ms fixed costs over the barrier
    assert busy.tolist() == pytest.approx([0.006, 0.012, 0.002])


def test_timeline_bars_show_the_idle_as_the_pale_band_beyond_the_busy_bar(tmp_path):
    rec = synthetic_passes()
    pre = [p for p in rec.passes if p.kind == "prefill"]
    rows = {(i, u): 4 * i + u for i in (0, 1) for u in range(4)}
    band, busy = plots.timeline_bars(rec.passes, "prefill", (0.0, 10.0), rows)
    assert sum(len(b) for b in band.values()) == 4 * len(pre)
    for p in pre:
        for u, b in enumerate(p.busy):
            r = rows[(p.inst, u)]
            assert (p.t, p.dur) in band[r]
            assert ((p.t, b) in busy[r]) == (b > 0)
    assert plots.timeline(rec.passes, tmp_path / "t.png").stat().st_size > 5000


def test_latency_table_percentiles_are_monotone_and_match_the_finished_requests():
    req = pd.DataFrame({"status": ["finished"] * 4 + ["rejected"], "ttft": [0.1, 0.2, 0.3, 0.4, 9.0],
                        "tpot": [0.01, np.nan, 0.03, 0.02, np.nan], "e2e": [1.0, 2.0, 3.0, 4.0, np.nan],
                        "sched_queue": [0.0, 0.1, 0.0, 0.2, 5.0], "device_queue": [0.05, 0.0, 0.0, 0.0, 0.0]})
    t = latency_table({"a": req, "b": req.assign(ttft=req.ttft * 2)})
    a = t[t.policy_set == "a"].set_index("percentile")
    assert a.loc[100, "ttft"] == 0.4 and a.loc[0, "tpot"] == 0.01 and a.loc[100, "sched_delay"] == 0.2
    assert (np.diff(a.ttft.to_numpy()[:101]) >= 0).all()
    b = t[t.policy_set == "b"].set_index("percentile")
    assert b.loc[50, "ttft"] == pytest.approx(2 * a.loc[50, "ttft"])


BIN = Path(sys.executable).parent


def test_pdgym_sim_writes_cdfs_and_time_series_per_policy_set(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([str(BIN / "pdgym-sim"), "scenario=ds_v3_h800_3p1d", "workload.num_requests=150",
                        "compare=[{label: rr},{label: sbs, prefill: sbs}]", f"hydra.run.dir={out}"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    for name in ("latency_cdf.png", "latency_cdf.csv", "instance_timeseries.png", "compare/sbs/instance_timeseries.png"):
        assert (out / name).stat().st_size > 1000, name
    cdf = pd.read_csv(out / "latency_cdf.csv")
    assert set(cdf.policy_set) == {"rr", "sbs"}
    for label, d in (("rr", out), ("sbs", out / "compare" / "sbs")):
        fin = pd.read_csv(d / "requests.csv").query("status == 'finished'")
        p50 = cdf[(cdf.policy_set == label) & (cdf.percentile == 50)].iloc[0]
        assert p50.ttft == pytest.approx(fin.ttft.median()) and p50.e2e == pytest.approx(fin.e2e.median())
        assert p50.sched_delay == pytest.approx((fin.sched_queue + fin.device_queue).median())
    steps = pd.read_csv(out / "steps.csv")  # pass kinds by name; the summary still reads the right passes
    assert set(steps.kind) == {"prefill", "decode"}
    m = json.loads((out / "metrics.json").read_text())
    dec = steps[steps.kind == "decode"]
    assert m["imbalance_mean"] == pytest.approx((dec.kv_max - dec.kv_min).mean()) and m["imbalance_mean"] > 0
    pre = steps[(steps.kind != "decode") & (steps.util > 0)]
    assert m["chunk_util_mean"] == pytest.approx(pre.util.mean())


@pytest.mark.parametrize("cost", ["linear", "roofline"])
def test_a_real_runs_gaps_are_the_barrier_idle_of_its_step_table(cost):
    """The simulator's own passes: one trace pass per step-table row, every unit slice inside its
    pass, and the mean gap equal to the step table's idle_frac x the slowest unit's compute time
    (the whole pass with cost.kind=linear; less than the pass with roofline, whose pass adds fixed
    costs and the EP all-to-all that every unit spends busy)."""
    sc = load_scenario("ds_v3_h800_3p1d", ())
    cfg = merge_sim_config(sc.sim, {"workload": {"num_requests": 120}, "cost": {"kind": cost, "params": {}}})
    res, passes = simulate_traced(cfg, None, seed=1)
    steps = res.steps
    assert len(passes) == len(steps) > 100
    tr = chrome_trace(passes, res.requests)
    check_trace(tr)
    pids = instance_keys(passes)
    slices = unit_slices(tr)
    starts = {key: {e["ts"]: e for e in ev} for key, ev in slices.items()}
    ratios = []
    for p, row in zip(passes, steps.itertuples()):
        assert (p.t, p.dur, p.inst) == (row.t, row.dur, row.inst) and p.kind == PassKind(row.kind).name.lower()
        pid = pids[(p.kind, p.inst)]
        whole = starts[(pid, 0)][round(p.t * 1e9) / 1000]
        gaps = []
        for u in range(len(p.busy)):
            mine = starts[(pid, u + 1)].get(whole["ts"])
            busy_us = mine["dur"] if mine else 0.0
            assert 0 <= busy_us <= whole["dur"]
            gaps.append(whole["dur"] - busy_us)
        assert min(gaps) == pytest.approx(0.0, abs=2e-3)  # the slowest unit never waits
        mean_gap = float(np.mean(gaps))
        if cost == "linear":
            assert mean_gap == pytest.approx(row.idle_frac * row.dur * 1e6, abs=2e-3)
        else:
            assert mean_gap <= row.idle_frac * row.dur * 1e6 + 2e-3
            if row.idle_frac > 0.05:
                ratios.append(mean_gap / (row.idle_frac * row.dur * 1e6))
    if cost == "roofline":  # fixed costs + all-to-all: a real share of the pass, not a rounding error
        assert 0.3 < np.median(ratios) < 0.99


def test_pdgym_sim_trace_true_writes_a_trace_and_a_timeline(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([str(BIN / "pdgym-sim"), "scenario=ds_v3_h800_3p1d", "workload.num_requests=120", "trace=true",
                        f"hydra.run.dir={out}"], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    assert (out / "timeline.png").stat().st_size > 5000
    tr = json.loads((out / "trace.json").read_text())
    check_trace(tr)
    steps = pd.read_csv(out / "steps.csv")
    assert sum(1 for e in tr["traceEvents"] if e["ph"] == "X" and e["tid"] == 0) == len(steps)
    bad = subprocess.run([str(BIN / "pdgym-sim"), "trace=maybe", f"hydra.run.dir={tmp_path / 'bad'}"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "trace" in bad.stderr and "Traceback" not in bad.stderr
