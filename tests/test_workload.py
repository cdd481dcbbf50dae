"""Tests of envs/sim/workload.py: arrival processes, length distributions, trace replay, phases, errors."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pdgym.envs.sim.config import ConfigError, LengthConfig, WorkloadConfig, WorkloadPhase
from pdgym.envs.sim.traces import COLUMN_ALIASES, SHIPPED_TRACES, load_trace, read_lengths, read_trace, trace_path
from pdgym.envs.sim.workload import Workload, WorkloadWarning, make_workload, sample_lengths

N = 20_000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def wl(seed: int = 0, **kw) -> Workload:
    w = make_workload(WorkloadConfig(**kw), rng(seed))
    check_invariants(w)
    return w


def check_invariants(w: Workload) -> None:
    n = w.n
    for a in (w.prompt, w.output, w.prefix_key, w.prefix_len):
        assert a.dtype == np.int64 and a.shape == (n,)
    assert (w.prompt >= 1).all() and (w.output >= 1).all()
    assert ((w.prefix_len >= 0) & (w.prefix_len <= w.prompt)).all()
    assert ((w.prefix_key == -1) == (w.prefix_len == 0)).all()
    if w.arrival is None:
        assert w.concurrency is not None and w.concurrency.dtype == np.int64 and w.concurrency.shape == (n,)
        assert (w.concurrency >= 1).all()
    else:
        assert w.concurrency is None
        assert w.arrival.dtype == np.float64 and w.arrival.shape == (n,)
        assert np.isfinite(w.arrival).all() and w.arrival[0] >= 0
        assert (np.diff(w.arrival) >= 0).all()


def mean_rate(a: np.ndarray) -> float:
    return (len(a) - 1) / (a[-1] - a[0])


def cv(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x))


# --------------------------------------------------------------------------- arrivals
def test_poisson_rate_and_cv():
    w = wl(num_requests=N, arrival="poisson", rate=12.0)
    assert mean_rate(w.arrival) == pytest.approx(12.0, rel=0.03)
    assert cv(np.diff(w.arrival)) == pytest.approx(1.0, abs=0.05)
    assert w.arrival[0] < 1.0  # starts near 0


def test_deterministic_spacing_exact():
    w = wl(num_requests=1000, arrival="deterministic", rate=8.0)
    np.testing.assert_allclose(np.diff(w.arrival), 1 / 8.0, rtol=1e-9)
    assert w.arrival[0] == pytest.approx(1 / 8.0)


@pytest.mark.parametrize("target_cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_cv(target_cv):
    w = wl(num_requests=N, arrival="gamma", rate=5.0, cv=target_cv)
    assert mean_rate(w.arrival) == pytest.approx(5.0, rel=0.04)
    assert cv(np.diff(w.arrival)) == pytest.approx(target_cv, rel=0.07)


def test_onoff_long_run_rate_and_burstiness():
    w = wl(num_requests=N, arrival="onoff", rate=10.0, on_s=0.2, off_s=0.3)
    assert mean_rate(w.arrival) == pytest.approx(10.0, rel=0.05)
    assert cv(np.diff(w.arrival)) > 1.2
    # off_s = 0 degenerates to Poisson
    w0 = wl(num_requests=N, arrival="onoff", rate=10.0, on_s=1.0, off_s=0.0)
    assert mean_rate(w0.arrival) == pytest.approx(10.0, rel=0.03)
    assert cv(np.diff(w0.arrival)) == pytest.approx(1.0, abs=0.05)


def window_rate(a: np.ndarray, lo: float, hi: float) -> float:
    return float(((a >= lo) & (a < hi)).sum() / (hi - lo))


def test_steps_rates_per_segment():
    w = wl(num_requests=9000, arrival="steps", steps=[[0, 5.0], [200, 20.0], [400, 10.0]])
    a = w.arrival
    assert a[-1] > 600
    assert window_rate(a, 0, 200) == pytest.approx(5.0, rel=0.1)
    assert window_rate(a, 200, 400) == pytest.approx(20.0, rel=0.1)
    assert window_rate(a, 400, 600) == pytest.approx(10.0, rel=0.1)


def test_steps_base_rate_and_zero_rate_gap():
    # before the first t_start `rate` applies
    w = wl(num_requests=3000, arrival="steps", rate=5.0, steps=[[200, 20.0]])
    assert window_rate(w.arrival, 0, 200) == pytest.approx(5.0, rel=0.12)
    assert window_rate(w.arrival, 200, w.arrival[-1]) == pytest.approx(20.0, rel=0.1)
    # a zero-rate step is a silent gap
    w = wl(num_requests=2000, arrival="steps", steps=[[0, 10.0], [50, 0.0], [80, 10.0]])
    a = w.arrival
    assert not ((a >= 50) & (a < 80)).any()
    assert (a < 50).sum() > 300 and (a >= 80).sum() > 300


def test_diurnal_mean_rate_and_shape():
    w = wl(num_requests=N, arrival="diurnal", rate=10.0, amplitude=0.8, period_s=100.0)
    a = w.arrival
    assert mean_rate(a) == pytest.approx(10.0, rel=0.03)
    phase = (a % 100.0) / 100.0
    peak, trough = (phase < 0.5).sum(), (phase >= 0.5).sum()
    # expected ratio (1 + 2a/pi) / (1 - 2a/pi) ~ 3.1 for a = 0.8
    assert 2.5 < peak / trough < 3.8


def test_closed_loop():
    w = wl(num_requests=500, arrival="closed", concurrency=16, think_s=0.25)
    assert w.arrival is None
    assert (w.concurrency == 16).all() and w.think_s == 0.25


# --------------------------------------------------------------------------- lengths
@pytest.mark.parametrize("cfg, mean", [
    (LengthConfig(dist="geometric", mean=128), 128),
    (LengthConfig(dist="gamma", mean=512, cv=1.0), 512),
    (LengthConfig(dist="gamma", mean=300, cv=0.5), 300),
    (LengthConfig(dist="lognormal", mean=1000, cv=1.0), 1000),
    (LengthConfig(dist="lognormal", mean=200, cv=0.3), 200),
    (LengthConfig(dist="uniform", low=10, high=1000), 505),
])
def test_length_means(cfg, mean):
    x = sample_lengths(cfg, 50_000, rng(1))
    assert x.dtype == np.int64 and x.min() >= 1
    assert x.mean() == pytest.approx(mean, rel=0.03)


def test_length_shapes():
    g = sample_lengths(LengthConfig(dist="gamma", mean=500, cv=2.0), 50_000, rng(2))
    assert cv(g) == pytest.approx(2.0, rel=0.08)
    ln = sample_lengths(LengthConfig(dist="lognormal", mean=500, cv=1.5), 50_000, rng(2))
    assert np.median(ln) == pytest.approx(500 / np.sqrt(1 + 1.5**2), rel=0.05)
    u = sample_lengths(LengthConfig(dist="uniform", low=3, high=7), 5000, rng(2))
    assert set(np.unique(u)) == {3, 4, 5, 6, 7}
    geo = sample_lengths(LengthConfig(dist="geometric", mean=1), 100, rng(2))
    assert (geo == 1).all()
    assert (sample_lengths(LengthConfig(dist="fixed", mean=99.6), 10, rng()) == 100).all()


def test_length_clipping():
    cfg = LengthConfig(dist="lognormal", mean=512, cv=2.0, min=16, max=2048)
    x = sample_lengths(cfg, 20_000, rng(3))
    assert x.min() == 16 and x.max() == 2048
    x = sample_lengths(LengthConfig(dist="fixed", mean=5000, max=4096), 3, rng())
    assert (x == 4096).all()
    x = sample_lengths(LengthConfig(dist="gamma", mean=2, cv=3.0), 10_000, rng())
    assert x.min() >= 1  # rounding to 0 is clipped to min = 1


def test_empirical_lengths():
    x = sample_lengths(LengthConfig(dist="empirical", values=[3, 7, 11]), 1000, rng())
    assert set(np.unique(x)) == {3, 7, 11}
    conv = pd.read_csv(trace_path("azure_conv"))
    p = sample_lengths(LengthConfig(dist="empirical", source="azure_conv"), 5000, rng(), key="workload.prompt")
    assert set(np.unique(p)) <= set(conv["ContextTokens"])
    o = sample_lengths(LengthConfig(dist="empirical", source="azure_conv", column="output"), 5000, rng())
    assert set(np.unique(o)) <= set(conv["GeneratedTokens"])
    assert o.mean() == pytest.approx(conv["GeneratedTokens"].mean(), rel=0.05)
    # default column from the key, in a full workload
    w = wl(num_requests=2000, prompt=LengthConfig(dist="empirical", source="azure_code"),
           output=LengthConfig(dist="empirical", source="azure_code"))
    code = pd.read_csv(trace_path("azure_code"))
    assert set(np.unique(w.prompt)) <= set(code["ContextTokens"])
    assert set(np.unique(w.output)) <= set(code["GeneratedTokens"])


# --------------------------------------------------------------------------- traces
def test_trace_paths_and_load():
    for name, fname in SHIPPED_TRACES.items():
        assert trace_path(name).name == fname and trace_path(name).is_file()
    df = load_trace("azure_conv")
    assert list(df.columns) == ["arrival_s", "prompt", "output"]
    assert len(df) == 19366 and df["prompt"].dtype == np.int64 and df["output"].dtype == np.int64
    assert df["arrival_s"].iloc[0] == 0.0 and df["arrival_s"].is_monotonic_increasing
    assert df["arrival_s"].iloc[-1] == pytest.approx(3501.72, abs=0.01)
    assert len(load_trace("azure_code")) == 8819
    part = load_trace("azure_conv", offset=100, limit=50)
    assert len(part) == 50 and part["arrival_s"].iloc[0] == 0.0
    np.testing.assert_array_equal(part["prompt"].to_numpy(), df["prompt"].to_numpy()[100:150])
    # the vidur copy matches the Azure trace row for row
    sw = load_trace(str(trace_path("splitwise_conv")))
    np.testing.assert_array_equal(sw[["prompt", "output"]].to_numpy(), df[["prompt", "output"]].to_numpy())
    np.testing.assert_allclose(sw["arrival_s"].to_numpy(), df["arrival_s"].to_numpy(), atol=1e-5)


def test_trace_replay_azure_conv():
    raw = pd.read_csv(trace_path("azure_conv"))
    ts = pd.to_datetime(raw["TIMESTAMP"], format="mixed")
    secs = (ts - ts.iloc[0]).dt.total_seconds().to_numpy()
    with pytest.warns(WorkloadWarning, match="only 19366 rows"):
        w = wl(num_requests=50_000, trace="azure_conv", arrival="trace", rate=None, trace_arrivals="recorded")
    assert w.n == 19366
    np.testing.assert_array_equal(w.prompt, raw["ContextTokens"].to_numpy())
    np.testing.assert_array_equal(w.output, raw["GeneratedTokens"].to_numpy())
    np.testing.assert_allclose(w.arrival, secs, atol=1e-6)
    # held-out slice
    w = wl(num_requests=500, trace="azure_conv", trace_offset=1000, arrival="trace", rate=None,
           trace_arrivals="recorded")
    assert w.n == 500 and w.arrival[0] == 0.0
    np.testing.assert_array_equal(w.prompt, raw["ContextTokens"].to_numpy()[1000:1500])
    np.testing.assert_allclose(w.arrival, secs[1000:1500] - secs[1000], atol=1e-6)


def test_trace_rescaling():
    w = wl(num_requests=5000, trace="azure_conv", arrival="trace", rate=20.0, trace_arrivals="recorded")
    assert mean_rate(w.arrival) == pytest.approx(20.0, rel=1e-9)
    w = wl(num_requests=5000, trace="azure_conv", arrival="trace", rate=20.0)  # re-drawn: Poisson around 20/s
    assert mean_rate(w.arrival) == pytest.approx(20.0, rel=0.05)
    native = wl(num_requests=5000, trace="azure_conv", arrival="trace", rate=None).arrival
    np.testing.assert_allclose(w.arrival / w.arrival[-1], native / native[-1])  # same shape, new speed
    half = wl(num_requests=5000, trace="azure_conv", arrival="trace", time_scale=0.5).arrival
    np.testing.assert_allclose(half, native * 0.5)  # time_scale wins over rate


def counts_dispersion(t: np.ndarray, window_s: float) -> float:
    c = np.bincount((t // window_s).astype(np.int64))
    return float(c.var() / c.mean())


def test_seed_redraws_trace_arrivals_around_the_recorded_rate_curve():
    """Seeds give distinct replicates of one trace window: same rows, new times, same burstiness."""
    rec = wl(num_requests=19366, trace="azure_conv", arrival="trace", rate=None, trace_arrivals="recorded")
    a, b = (wl(seed, num_requests=19366, trace="azure_conv", arrival="trace", rate=None) for seed in (1, 2))
    np.testing.assert_array_equal(a.prompt, rec.prompt)
    np.testing.assert_array_equal(a.output, b.output)
    assert a.arrival[0] == 0.0 and (np.diff(a.arrival) >= 0).all()
    assert np.abs(a.arrival - b.arrival).mean() > 1.0  # different times, not a rounding difference
    for w in (a, b):
        assert w.arrival[-1] == pytest.approx(rec.arrival[-1], rel=0.05)  # Poisson around the recorded span
        # the recorded slow rate swings survive (count dispersion 20.6 per 60 s; a flat Poisson gives 1)
        assert 12 < counts_dispersion(w.arrival, 60.0) < 30
        assert counts_dispersion(w.arrival, 0.1) == pytest.approx(counts_dispersion(rec.arrival, 0.1), abs=0.1)
        # and where the trace is busy the replay is busy: per-minute counts follow the recorded ones
        n = int(rec.arrival[-1] // 60)
        c_rec = np.bincount((rec.arrival // 60).astype(int))[:n]
        c = np.bincount((w.arrival // 60).astype(int), minlength=n)[:n]
        assert np.corrcoef(c_rec, c)[0, 1] > 0.8
    # the same seed is the same replicate
    np.testing.assert_array_equal(a.arrival, wl(1, num_requests=19366, trace="azure_conv", arrival="trace",
                                               rate=None).arrival)


def test_numeric_timestamps_are_seconds_and_rate_null_replays_them(tmp_path):
    p = tmp_path / "secs.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n1.5,11,6\n3.0,12,7\n")
    np.testing.assert_allclose(load_trace(str(p))["arrival_s"], [0.0, 1.5, 3.0])
    w = wl(num_requests=3, trace=str(p), arrival="poisson", rate=None, trace_arrivals="recorded")
    np.testing.assert_allclose(w.arrival, [0.0, 1.5, 3.0])
    d = tmp_path / "dates.csv"
    d.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,10,5\n"
                 "2023-11-16 18:15:48,11,6\n")
    np.testing.assert_allclose(load_trace(str(d))["arrival_s"], [0.0, 1.5])


def test_trace_lengths_with_generated_arrivals():
    w = wl(num_requests=8819, trace="azure_code", arrival="poisson", rate=7.0)
    assert w.n == 8819
    np.testing.assert_array_equal(w.prompt, load_trace("azure_code")["prompt"].to_numpy())
    assert mean_rate(w.arrival) == pytest.approx(7.0, rel=0.05)
    c = wl(num_requests=100, trace="azure_code", arrival="closed", concurrency=4, think_s=0.5)
    assert c.arrival is None and (c.concurrency == 4).all() and c.think_s == 0.5


def test_vidur_without_times(tmp_path):
    p = tmp_path / "lens.csv"
    pd.DataFrame({"num_prefill_tokens": np.arange(1, 2001), "num_decode_tokens": 7}).to_csv(p, index=False)
    df = load_trace(str(p))
    assert df["arrival_s"].isna().all() and len(df) == 2000
    with pytest.warns(WorkloadWarning, match="no arrival times"):
        w = wl(num_requests=2000, trace=str(p), arrival="trace", rate=50.0)
    np.testing.assert_array_equal(w.prompt, np.arange(1, 2001))
    assert (w.output == 7).all()
    assert mean_rate(w.arrival) == pytest.approx(50.0, rel=0.08)
    g = wl(num_requests=100, trace=str(p), arrival="deterministic", rate=4.0)
    np.testing.assert_allclose(np.diff(g.arrival), 0.25)
    # vidur with arrived_at (given unsorted by column order) replays its own times
    q = tmp_path / "timed.csv"
    pd.DataFrame({"num_decode_tokens": [5, 6, 7], "arrived_at": [10.0, 10.5, 12.0],
                  "num_prefill_tokens": [1, 2, 3]}).to_csv(q, index=False)
    t = wl(num_requests=3, trace=str(q), arrival="trace", rate=None, trace_arrivals="recorded")
    np.testing.assert_allclose(t.arrival, [0.0, 0.5, 2.0])
    np.testing.assert_array_equal(t.output, [5, 6, 7])


# --------------------------------------------------------------------------- phases
def test_phases_open_loop_continue_in_time():
    phases = [
        WorkloadPhase(num_requests=4000, prompt=LengthConfig(mean=100), output=LengthConfig(mean=10), rate=5.0),
        WorkloadPhase(num_requests=6000, prompt=LengthConfig(mean=2000), output=LengthConfig(mean=50)),
    ]
    w = wl(num_requests=1, arrival="poisson", rate=20.0, phases=phases)
    assert w.n == 10_000  # num_requests ignored
    assert (w.prompt[:4000] == 100).all() and (w.prompt[4000:] == 2000).all()
    assert (w.output[:4000] == 10).all() and (w.output[4000:] == 50).all()
    a1, a2 = w.arrival[:4000], w.arrival[4000:]
    assert a2[0] > a1[-1]
    assert a2[0] - a1[-1] < 1.0  # continues right after, not from 0
    assert mean_rate(a1) == pytest.approx(5.0, rel=0.05)
    assert mean_rate(a2) == pytest.approx(20.0, rel=0.05)


def test_phases_deterministic_and_diurnal():
    phases = [WorkloadPhase(num_requests=10, rate=2.0), WorkloadPhase(num_requests=10, rate=4.0)]
    w = wl(arrival="deterministic", phases=phases)
    # the next phase's first gap already has the new spacing
    np.testing.assert_allclose(np.diff(w.arrival), [0.5] * 9 + [0.25] * 10)
    assert w.arrival[0] == 0.5
    w = wl(arrival="diurnal", period_s=50.0, phases=[WorkloadPhase(num_requests=300),
                                                     WorkloadPhase(num_requests=300, rate=30.0)])
    assert w.n == 600


def test_phases_closed_loop_concurrency_shift():
    phases = [WorkloadPhase(num_requests=300, concurrency=8),
              WorkloadPhase(num_requests=200),
              WorkloadPhase(num_requests=100, concurrency=64, output=LengthConfig(dist="geometric", mean=400))]
    w = wl(arrival="closed", concurrency=16, think_s=0.1, phases=phases)
    assert w.arrival is None and w.n == 600 and w.think_s == 0.1
    np.testing.assert_array_equal(w.concurrency, [8] * 300 + [16] * 200 + [64] * 100)
    assert w.output[500:].mean() > 200


# --------------------------------------------------------------------------- prefixes
def test_prefix_keys():
    w = wl(num_requests=5000, prefix_groups=4, prefix_frac=0.25,
           prompt=LengthConfig(dist="uniform", low=1, high=2000))
    has = w.prefix_key >= 0
    np.testing.assert_array_equal(w.prefix_len, np.floor(0.25 * w.prompt).astype(np.int64))
    assert set(np.unique(w.prefix_key[has])) == {0, 1, 2, 3}
    assert (w.prefix_key[w.prompt < 4] == -1).all()
    counts = np.bincount(w.prefix_key[has])
    assert counts.min() > 0.8 * counts.max()  # uniform over groups
    none = wl(num_requests=100)
    assert (none.prefix_key == -1).all() and (none.prefix_len == 0).all()


# --------------------------------------------------------------------------- errors
def write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


TRACE_ERRORS = [
    ("TIMESTAMP,GeneratedTokens\n2023-11-16 18:15:46.68,4\n", "missing columns ContextTokens"),
    ("a,b\n1,2\n", "missing columns TIMESTAMP,ContextTokens,GeneratedTokens"),
    ("num_prefill_tokens,arrived_at\n3,0.0\n", "missing columns num_decode_tokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47,4,5\n2023-11-16 18:15:46,4,5\n",
     "timestamps decrease at line 3"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,3,4\n2.0,3,4\n1.0,3,4\n", "timestamps decrease"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,4,5\n2023-11-16 18:15:47,4,0\n",
     "non-positive length 0 in column GeneratedTokens at line 3"),
    ("num_prefill_tokens,num_decode_tokens\n-3,4\n", "non-positive length"),
    ("num_prefill_tokens,num_decode_tokens\nx,4\n", "non-numeric"),
    ("num_prefill_tokens,num_decode_tokens\n2.5,4\n", "non-integer"),
    ("num_prefill_tokens,num_decode_tokens\n10,5\n99999999999999999999999,5\n", "at line 3 is too large"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nnot a time,4,5\n", "TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "empty trace"),
    ("", "empty trace"),
]


@pytest.mark.parametrize("text, msg", TRACE_ERRORS)
def test_trace_file_errors(tmp_path, text, msg):
    path = write(tmp_path, "bad.csv", text)
    for fn in (lambda: make_workload(WorkloadConfig(trace=path, arrival="trace"), rng()),
               lambda: load_trace(path)):
        with pytest.raises(ConfigError) as e:
            fn()
        s = str(e.value)
        assert s.startswith("workload.trace: ") and msg in s and "\n" not in s


def test_missing_columns_message_names_formats(tmp_path):
    path = write(tmp_path, "bad.csv", "TIMESTAMP,GeneratedTokens\n2023-11-16 18:15:46.68,4\n")
    with pytest.raises(ConfigError, match=r"need TIMESTAMP,ContextTokens,GeneratedTokens \(Azure\) or "
                                          r"num_prefill_tokens,num_decode_tokens\[,arrived_at\] \(vidur\)"):
        load_trace(path)


CONFIG_ERRORS = [
    ({"trace": "no/such/file.csv"}, "workload.trace", "file not found"),
    ({"trace": "azure_chat"}, "workload.trace", "azure_conv, azure_code, splitwise_conv"),
    ({"trace": 123}, "workload.trace", "shipped name"),
    ({"arrival": "trace"}, "workload.trace", "arrival=trace needs a trace"),
    ({"trace": "azure_conv", "trace_offset": 19366}, "workload.trace_offset", "19366 rows"),
    ({"trace": "azure_conv", "arrival": "trace", "time_scale": 0.0}, "workload.time_scale", "> 0"),
    ({"rate": None}, "workload.rate", "needs rate"),
    ({"trace_arrivals": "bootstrap"}, "workload.trace_arrivals", "allowed: redraw, recorded"),
    ({"trace_rate_rows": 0}, "workload.trace_rate_rows", ">= 1"),
    ({"trace": "azure_conv", "phases": [WorkloadPhase()]}, "workload.phases", "workload.trace"),
    ({"arrival": "bogus"}, "workload.arrival", "allowed"),
    ({"arrival": "steps", "steps": [[0, 1.0], [0, 2.0]]}, "workload.steps[1]", "sorted"),
    ({"arrival": "steps", "steps": [[0, 1.0], [5, 0.0]]}, "workload.steps[1]", "last rate"),
    ({"arrival": "steps", "steps": [[0, -1.0]]}, "workload.steps[0]", "rate >= 0"),
    ({"arrival": "steps", "steps": [[0]]}, "workload.steps[0]", "t_start_s"),
    ({"arrival": "steps", "steps": []}, "workload.steps", "needs"),
    ({"phases": [WorkloadPhase(rate=-1.0)]}, "workload.phases[0].rate", "> 0"),
    ({"phases": [WorkloadPhase(), WorkloadPhase(num_requests=0)]}, "workload.phases[1].num_requests", ">= 1"),
    ({"arrival": "steps", "steps": [[0, 1.0]], "phases": [WorkloadPhase(rate=3.0)]}, "workload.phases[0].rate",
     "steps"),
    ({"arrival": "closed", "phases": [WorkloadPhase(concurrency=0)]}, "workload.phases[0].concurrency", ">= 1"),
    ({"prompt": LengthConfig(dist="normal")}, "workload.prompt.dist", "allowed"),
    ({"output": LengthConfig(dist="empirical")}, "workload.output", "values"),
    ({"output": LengthConfig(dist="empirical", source="azure_conv", column="tokens")},
     "workload.output.column", "allowed"),
    ({"output": LengthConfig(dist="empirical", source="nope")}, "workload.output.source", "unknown trace"),
    ({"phases": [WorkloadPhase(prompt=LengthConfig(dist="uniform", low=5, high=2))]},
     "workload.phases[0].prompt.low", "low <= high"),
    ({"prompt": LengthConfig(dist="empirical", values=["a"])}, "workload.prompt.values", "numbers"),
]


@pytest.mark.parametrize("kw, key, msg", CONFIG_ERRORS)
def test_config_errors(kw, key, msg):
    with pytest.raises(ConfigError) as e:
        make_workload(WorkloadConfig(**kw), rng())
    s = str(e.value)
    assert s.startswith(key + ": ") and msg in s and "\n" not in s, s


def test_sample_lengths_errors():
    with pytest.raises(ConfigError, match=r"^length\.column: .*prompt or output"):
        sample_lengths(LengthConfig(dist="empirical", source="azure_conv"), 10, rng())
    with pytest.raises(ConfigError, match=r"^x\.max: "):
        sample_lengths(LengthConfig(min=10, max=5), 10, rng(), key="x")


def test_trace_path_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"^workload\.trace: unknown trace 'foo'; shipped names"):
        trace_path("foo")
    with pytest.raises(ConfigError, match="not a file"):
        trace_path(str(tmp_path))
    with pytest.raises(ConfigError, match="past the end"):
        load_trace("azure_code", offset=10**6)


def test_short_trace_warns_not_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wl(num_requests=8819, trace="azure_code")  # exactly enough: no warning
    with pytest.warns(WorkloadWarning, match="replaying 19 requests instead of 100"):
        w = wl(num_requests=100, trace="azure_code", trace_offset=8800)
    assert w.n == 19


# --------------------------------------------------------------------------- determinism
DET_CONFIGS = [
    {"num_requests": 300, "arrival": "poisson", "prompt": LengthConfig(dist="lognormal", mean=500),
     "output": LengthConfig(dist="geometric", mean=50), "prefix_groups": 3},
    {"num_requests": 300, "arrival": "gamma", "prompt": LengthConfig(dist="gamma", mean=500, cv=2.0)},
    {"num_requests": 300, "arrival": "onoff", "on_s": 0.5, "off_s": 1.0},
    {"num_requests": 300, "arrival": "steps", "steps": [[0, 3.0], [10, 30.0]]},
    {"num_requests": 300, "arrival": "diurnal", "period_s": 20.0},
    {"num_requests": 300, "arrival": "closed", "prompt": LengthConfig(dist="uniform", low=1, high=100)},
    {"num_requests": 300, "trace": "azure_code", "trace_offset": 50, "prefix_groups": 5},
    {"arrival": "poisson", "phases": [WorkloadPhase(num_requests=100, prompt=LengthConfig(dist="gamma", mean=64)),
                                      WorkloadPhase(num_requests=100, rate=50.0)]},
]

FIELDS = ("prompt", "output", "arrival", "prefix_key", "prefix_len", "concurrency")


def same(a: Workload, b: Workload) -> bool:
    return all((getattr(a, f) is None and getattr(b, f) is None)
               or (getattr(a, f) is not None and getattr(b, f) is not None
                   and np.array_equal(getattr(a, f), getattr(b, f)))
               for f in FIELDS)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, len(DET_CONFIGS) - 1))
def test_same_seed_identical_different_seed_differs(seed, which):
    cfg = WorkloadConfig(**DET_CONFIGS[which])
    a = make_workload(cfg, np.random.default_rng(seed))
    b = make_workload(cfg, np.random.default_rng(seed))
    check_invariants(a)
    assert same(a, b)
    c = make_workload(cfg, np.random.default_rng(seed + 1))
    if which == 5:  # closed loop: only the lengths are random
        assert not np.array_equal(a.prompt, c.prompt)
    else:
        assert not same(a, c)


def test_apps_print_each_workload_warning_once():
    """A reproduction replays a short trace in every simulation; libraries' `catch_warnings` clear Python's
    once-per-place registry, so the same WorkloadWarning used to be printed per simulation. The apps print
    each distinct warning once; a different one still shows, and filters that raise still raise. (A
    subprocess: pytest records warnings itself, so nothing would reach stderr here.)"""
    code = """if True:
        import warnings
        from pdgym.agents.errors import show_each_warning_once
        from pdgym.envs.sim.config import WorkloadConfig
        from pdgym.envs.sim.workload import WorkloadWarning, make_workload
        import numpy as np
        show_each_warning_once(); show_each_warning_once()  # idempotent
        def wl(n):
            cfg = WorkloadConfig(num_requests=n, trace="azure_code", trace_offset=8800)
            return make_workload(cfg, np.random.default_rng(0))
        for n in (100, 100, 100, 200):
            with warnings.catch_warnings():  # what pandas / tqdm do between simulations
                pass
            wl(n)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                wl(100)
            except WorkloadWarning:
                print("raised")
    """
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("instead of 100") == 1 and r.stderr.count("instead of 200") == 1, r.stderr
    assert r.stdout.strip() == "raised"


def test_a_rate_for_a_trace_whose_rows_share_one_time_is_said_to_do_nothing(tmp_path):
    """Rescaling needs a span: 20 rows at one time arrive at once whatever workload.rate says, and the run says so."""
    path = write(tmp_path, "same.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                 + "".join("1.0,10,5\n" for _ in range(20)))
    with pytest.warns(WorkloadWarning, match="no span to rescale"):
        wl = make_workload(WorkloadConfig(trace=path, arrival="trace", rate=10.0, num_requests=20), rng())
    assert (wl.arrival == 0).all()


@pytest.mark.parametrize("name", sorted(SHIPPED_TRACES))
def test_read_lengths_gives_read_traces_columns(name):
    """Empirical lengths of a shipped CSV come from the csv module, not pandas (bench_memory): the same int64
    values as read_trace's checked parse, for every column name a LengthConfig accepts."""
    tr = read_trace(name)
    for alias, which in COLUMN_ALIASES.items():
        got, want = read_lengths(name, alias), getattr(tr, which)
        assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want) and len(got) > 1000
        assert not got.flags.writeable
