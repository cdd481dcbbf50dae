"""What a run and its result tables hold per request (docs/performance.md, "Peak memory at 1M requests"), and that
the memory-lean summary gives exactly what the frame definitions give."""

from __future__ import annotations

import math
import subprocess
import sys
import tracemalloc

import numpy as np
import pandas as pd
import pytest
from pdgym.envs.sim import SUMMARY_KEYS, SimResult, Simulator, simulate, steplog
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.events import PassKind
from pdgym.envs.sim.slo import slo_metrics

LINEAR = {"kind": "linear", "params": {"a_p": 0.01, "b_p": 2e-5, "a_d": 0.008, "b_d": 5e-5}}
WORKLOAD = {"num_requests": 300, "arrival": "poisson", "rate": 40.0, "prompt": {"dist": "uniform", "low": 16, "high": 2048},
            "output": {"dist": "geometric", "mean": 40, "max": 400}}


def disagg(**over) -> dict:
    """tests/test_sim_core.py's small disaggregated cluster (tight decode KV: preemptions happen)."""
    return {"hardware": "h800", "model": "deepseek_v3", "cost": LINEAR,
            "cluster": {"topology": "disaggregated",
                        "prefill": {"count": 2, "dp": 4, "ep": 4, "chunk_tokens": 2048, "kv_capacity_tokens": 100000},
                        "decode": {"count": 1, "dp": 8, "ep": 8, "batch_limit": 16, "kv_capacity_tokens": 20000}},
            "workload": WORKLOAD, **over}


def coloc() -> dict:
    return {"hardware": "h200", "model": "qwen3_8b", "cost": LINEAR,
            "cluster": {"topology": "colocated", "colocated": {"count": 2, "dp": 2, "batch_limit": 32,
                                                              "chunk_tokens": 1024, "kv_capacity_tokens": 40000}},
            "workload": {**WORKLOAD, "rate": 20.0}}

# Bytes a request costs in the simulator's request table, column by column: the budget the peak figure is built on.
REQUEST_WIDTHS = {
    **dict.fromkeys(("prompt", "output", "prefix_key", "prefix_len", "done", "work", "cached", "admit_step",
                     "done_at_admit", "finish_step"), 8),
    **dict.fromkeys(("arrival", "dispatch", "prefill_start", "first_token", "decode_admit", "finish", "last_tok",
                     "buf_t", "dev_arrive", "itl_max", "sched_wait", "device_wait"), 8),
    **dict.fromkeys(("prefill_inst", "prefill_dp", "decode_inst", "worker", "preemptions"), 4),
    "state": 1, "reason": 1, "cls": 1,  # cls: the request class code (int8; issue 33)
}
# A pass row: five float64 (t, dur, tokens, idle_frac, util), kv_max and kv_min int64, kind int8, inst and reqs int32.
STEP_ROW = 5 * 8 + 2 * 8 + 1 + 4 + 4


def frame_summary(res: SimResult) -> dict:
    """The DESIGN section 5 metrics the way the module docstring defines them, on whole-frame selections."""
    r, s, slo = res.requests, res.steps, res.slo
    fin = r[r.status == "finished"]
    span = max(float(np.nanmax(r.finish)) - float(np.nanmin(r.arrival)), 1e-12)
    tpot = fin.tpot.dropna().to_numpy()
    dec = s[s.kind == PassKind.DECODE]
    if not len(dec):
        dec = s[s.kind == PassKind.COLOCATED]
    pre = s[(s.kind != PassKind.DECODE) & (s.util > 0)]
    t = res.classes
    codes = r["class"].cat.codes.to_numpy()
    fcodes = codes[(r.status == "finished").to_numpy()]
    good = (fin.ttft.to_numpy() <= t.ttft_s[fcodes]) & (fin.tpot.isna().to_numpy() | (fin.tpot.to_numpy() <= t.tpot_s[fcodes]))
    if t.single:
        assert (t.ttft_s[0], t.tpot_s[0]) == (slo.ttft_s, slo.tpot_s)
    pct = lambda x, q: float(np.percentile(x, q)) if len(x) else math.nan  # noqa: E731
    mean = lambda x: float(np.mean(x)) if len(x) else math.nan  # noqa: E731
    return {
        "ttft_mean": mean(fin.ttft.to_numpy()), "ttft_p50": pct(fin.ttft.to_numpy(), 50),
        "ttft_p99": pct(fin.ttft.to_numpy(), 99), "tpot_mean": mean(tpot), "tpot_p95": pct(tpot, 95),
        "e2e_p99": pct(fin.e2e.to_numpy(), 99), "throughput_tok_s": float(fin.output.sum()) / span,
        "total_tok_s": float(fin.output.sum() + fin.prompt.sum()) / span, "rps": len(fin) / span,
        "goodput_rps": float(good.sum()) / span,
        "imbalance_mean": mean((dec.kv_max - dec.kv_min).to_numpy()) if len(dec) else 0.0,
        "barrier_idle_frac": float(np.dot(s.idle_frac, s.dur) / s.dur.sum()),
        "chunk_util_mean": mean(pre.util.to_numpy()), "sched_queue_s": mean(fin.sched_queue.to_numpy()),
        "device_queue_s": mean(fin.device_queue.to_numpy()), "finished": len(fin),
        "rejected": int((r.status == "rejected").sum()), "sim_time_s": span,
        "goodput_per_gpu": float(good.sum()) / span / res.config.cluster.gpus,
        "prefix_hit_ratio": float(r.cached.sum()) / max(float(r.prompt.sum()), 1.0),
        **slo_metrics((r.status == "finished").to_numpy(), r.ttft.to_numpy(), r.tpot.to_numpy(), codes, t,
                      r.preemptions.to_numpy(), (r.reason == "slo").to_numpy(),
                      r.predicted_output.to_numpy() if "predicted_output" in r else None, r.output.to_numpy()),
    }


TIERS = [{"name": "chat", "share": 0.6, "ttft_s": 0.4, "tpot_s": 0.03, "weight": 3.0},
         {"name": "batch", "share": 0.4, "ttft_s": 5.0, "tpot_s": 0.2, "weight": 1.0}]


def tiered() -> dict:
    cfg = coloc()
    return {**cfg, "workload": {**cfg["workload"], "classes": TIERS, "predictor": {"kind": "lognormal", "sigma": 1.0}}}


def same(got: dict, want: dict) -> None:
    for k, v in want.items():
        assert got[k] == v or (math.isnan(got[k]) and math.isnan(v)), k


@pytest.mark.parametrize("cfg", [disagg(max_sim_time_s=2.0), coloc(), tiered()], ids=["disagg_horizon", "coloc", "tiered"])
def test_summary_is_bit_identical_to_the_frame_definitions(cfg):
    """summary() reads the run's arrays, never the frames: every key equals its definition on the frames."""
    res = simulate(cfg, seed=3)
    assert res._requests is None and res._steps is None  # summary() built no frame
    got, want = res.summary(), frame_summary(res)
    assert set(got) - set(want) == {"wall_time_s", "recomputed_tokens", "cache_evictions"}
    assert set(got) >= set(SUMMARY_KEYS)
    if "max_sim_time_s" in cfg:
        assert (res.requests.status == "rejected").any()  # the masks select, not everything
    if "classes" in cfg["workload"]:
        assert len(res.classes.names) == 2 and not math.isnan(got["predictor_kendall_tau"])
    same(got, want)


@pytest.mark.parametrize("cfg", [disagg(max_sim_time_s=2.0), coloc(), tiered()], ids=["disagg_horizon", "coloc", "tiered"])
def test_a_run_without_a_step_table_has_the_same_summary(cfg, monkeypatch):
    """Simulator(step_log=False) keeps of each pass only what summary() reads (steplog.SummaryLog, 25 of 65
    bytes a pass): the same run, and every summary figure the same number, as with the full step table."""
    monkeypatch.setattr(steplog, "CHUNK", 16)  # many chunks, merged in order
    full, lean = Simulator(cfg, None, seed=3), Simulator(cfg, None, seed=3, step_log=False)
    full.run()
    lean.run()
    a, b = SimResult(full), SimResult(lean)
    assert len(full.steps) == len(lean.steps) > 4 * steplog.CHUNK
    kinds = set(a.steps.kind.tolist())
    assert kinds == ({int(PassKind.COLOCATED)} if "colocated" in cfg["cluster"] else
                     {int(PassKind.PREFILL), int(PassKind.DECODE)})
    got, want = b.summary(), a.summary()
    assert set(got) == set(want)
    same({k: v for k, v in got.items() if k != "wall_time_s"}, {k: v for k, v in want.items() if k != "wall_time_s"})
    assert sum(v.nbytes for v in lean.steps.columns().values()) < 0.5 * len(lean.steps) * STEP_ROW
    with pytest.raises(RuntimeError, match="step_log=False"):
        b.steps  # noqa: B018


def test_a_result_taken_mid_run_keeps_what_it_saw():
    """An env's summary is taken mid-run: the result copies the arrays, so running on changes neither its
    summary nor its tables."""
    sim = Simulator(disagg(), None, seed=0)
    sim.run(until=1.0)
    res = SimResult(sim)
    rows, finished = len(res.steps), int((sim.req.state == R.FINISHED).sum())
    sim.run()
    assert len(res.steps) == rows < len(sim.steps) and res.summary()["finished"] == finished > 0
    assert int((res.requests.status == "finished").sum()) == finished
    same(res.summary(), frame_summary(res))


def test_simulating_and_summarising_loads_no_pandas():
    """pandas and pyarrow are ~77 MB of a process's memory (bench_memory): a run with empirical lengths from a
    shipped trace and its summary() never import them; the frames do, when asked for."""
    code = ("import sys; from pdgym.envs.sim import simulate; "
            "cfg = {'hardware': 'h800', 'model': 'deepseek_v3', 'cluster': {'topology': 'disaggregated', "
            "'prefill': {'count': 1, 'dp': 8, 'tp': 2, 'ep': 16}, 'decode': {'count': 1, 'dp': 32, 'ep': 32}}, "
            "'workload': {'num_requests': 50, 'arrival': 'poisson', 'rate': 20.0, "
            "'prompt': {'dist': 'empirical', 'source': 'azure_conv'}, 'output': {'dist': 'empirical', 'source': 'azure_code'}}}; "
            "res = simulate(cfg, seed=0); m = res.summary(); print('pandas' in sys.modules, m['finished']); "
            "res.requests; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["False", "50", "True"]


def test_tables_hold_the_declared_widths_and_share_the_run_arrays():
    sim = Simulator(disagg(), None, seed=0)
    sim.run()
    req, n = sim.req, sim.req.n
    per_request = {k: v.itemsize for k, v in vars(req).items() if isinstance(v, np.ndarray) and v.shape == (n,)}
    assert per_request == REQUEST_WIDTHS
    res = SimResult(sim)
    for col, arr in (("arrival", req.arrival), ("prompt", req.prompt), ("output", req.output),
                     ("finish", req.finish), ("sched_queue", req.sched_wait), ("worker", req.worker)):
        assert np.shares_memory(res.requests[col].to_numpy(), arr), f"{col} copied, not viewed"
    steps = res.steps
    assert steps.memory_usage(index=False).sum() == STEP_ROW * len(steps)
    written = res.step_table()
    assert written.inst.dtype == np.int64 and written.reqs.dtype == np.int64  # files keep the 64-bit columns
    assert (written.inst.to_numpy() == steps.inst.to_numpy()).all()
    assert set(written.kind) <= {"prefill", "decode"}


def test_summary_reads_a_few_columns_not_a_copy_of_the_table():
    """tracemalloc counts NumPy's buffers: the summary's peak is a handful of request columns, far below one copy
    of the finished rows (21 columns), which selecting them as a frame took."""
    res = simulate(disagg(workload={"num_requests": 4000, "arrival": "poisson", "rate": 200.0,
                                    "prompt": {"dist": "uniform", "low": 16, "high": 512},
                                    "output": {"dist": "geometric", "mean": 8, "max": 64}}), seed=0)
    n = len(res.requests)
    column = 8 * n
    tracemalloc.start()
    try:
        res.summary()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.summary()["finished"] == n
    assert peak < 4 * column + 64_000, f"summary peak {peak} B for {n} requests"
    assert res.requests.memory_usage(index=False).sum() > 16 * column  # what a frame selection would copy


def test_completed_is_every_finished_id_once_in_finish_order():
    sim = Simulator(disagg(max_sim_time_s=2.0), None, seed=0)
    sim.run()
    done = sim.completed
    ids = done[:]
    assert isinstance(done, R.IdLog) and len(done) == int((sim.req.state == R.FINISHED).sum()) > 0
    assert sorted(ids.tolist()) == np.flatnonzero(sim.req.state == R.FINISHED).tolist()
    assert (np.diff(sim.req.finish[ids]) >= 0).all(), "completion order is finish-time order"
    assert done[len(done) - 1] == ids[-1] and isinstance(done[0], int) and list(done) == ids.tolist()
    with pytest.raises(ValueError):
        ids[0] = 1  # a policy reads the log; it cannot rewrite it


def test_step_rows_that_do_not_fit_their_narrow_type_raise():
    log = steplog.StepLog()
    log.append((0.0, 0.1, int(PassKind.DECODE), 2**31, 1.0, 1, 0, 0, 0.0, 0.0))  # inst past int32
    with pytest.raises(OverflowError):
        log.frame()
    assert pd.api.types.is_integer_dtype(steplog.row_dtype(False)["reqs"])
