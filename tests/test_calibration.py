"""The roofline against kernels measured on real GPUs: Qwen3-8B on one H100 80GB, pdgym-profile and a
DeepSeek-V3 prefill slice on one H200 (data/calibration/SOURCES.md).

data/calibration/h100_qwen3_8b_kernels.csv (method in data/calibration/SOURCES.md): Qwen3-8B-shaped
prefill and decode passes with real kernels. The roofline must stay within +-25% of them where it claims
to model the pass: prefill of >= 512 tokens (compute bound) and decode batches of 8-256 (bandwidth
bound). Short prefills (128-256 tokens, launch bound) and decode batch 512 are outside that claim and
only reported.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pdgym.agents.experiments import calibration
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim.config import ConfigError, CostConfig, InstanceConfig
from pdgym.envs.sim.cost import RooflineCost, build_cost_model
from pdgym.envs.sim.hardware import load_hardware
from pdgym.envs.sim.models import load_model

CSV = importlib.resources.files("pdgym.data") / "calibration" / "h100_qwen3_8b_kernels.csv"


def roofline_times() -> pd.DataFrame:
    cost = build_cost_model(CostConfig(kind="roofline"), load_hardware("h100"), load_model("qwen3_8b"),
                            InstanceConfig(count=1, dp=1, tp=1, ep=1))
    df = pd.read_csv(CSV)
    model = []
    for r in df.itertuples():
        if r.phase == "prefill":
            tok = float(r.batch * r.tokens_per_req)
            att = float(r.batch * r.tokens_per_req ** 2 / 2)
            model.append(cost.pass_time(np.array([tok]), np.array([att]), np.zeros(1), np.zeros(1),
                                        np.array([float(r.batch)])))  # the file's prefill runs the LM head per prompt
        else:
            model.append(cost.pass_time(np.zeros(1), np.zeros(1), np.array([float(r.batch)]),
                                        np.array([float(r.batch * r.ctx)])))
    return df.assign(model_s=model, ratio=np.array(model) / df.time_s)


def test_the_measurements_ship_with_the_package():
    df = pd.read_csv(CSV)
    assert set(df.phase) == {"prefill", "decode"} and (df.time_s > 0).all() and len(df) >= 30


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_roofline_within_25_percent_of_measured_h100_kernels(phase):
    df = roofline_times()
    claim = (df.phase == "prefill") & (df.batch * df.tokens_per_req >= 512) if phase == "prefill" else (
        (df.phase == "decode") & df.batch.between(8, 256))
    sel = df[claim]
    assert len(sel) >= 8
    bad = sel[(sel.ratio < 0.75) | (sel.ratio > 1.25)]
    assert bad.empty, bad[["phase", "batch", "tokens_per_req", "ctx", "time_s", "model_s", "ratio"]].to_string()


def test_roofline_keeps_the_measured_shape():
    """Not just a band: prefill time grows about linearly in tokens, decode time rises with batch and context."""
    df = roofline_times()
    pre = df[(df.phase == "prefill") & (df.batch == 1) & (df.tokens_per_req >= 1024)].sort_values("tokens_per_req")
    assert np.all(np.diff(pre.model_s) > 0)
    dec = df[(df.phase == "decode") & (df.ctx == 2048)].sort_values("batch")
    assert np.all(np.diff(dec.model_s) > 0)


def mixed_vs_decode(interference):
    """Per-token time of a mixed batch (r = 0.5 of T = 512 tokens, decodes over 500 cached tokens) / pure decode."""
    cost = build_cost_model(CostConfig(kind="roofline"), load_hardware("h100"), load_model("qwen3_8b"),
                            InstanceConfig(count=1, dp=1, tp=1, ep=1, interference=interference))
    z = np.zeros(1)
    d = cost.pass_time(z, z, np.array([256.0]), np.array([256.0 * 500])) / 256
    m = cost.pass_time(np.array([256.0]), np.array([256.0 * 256 / 2]), np.array([256.0]), np.array([256.0 * 500]))
    return m / 512 / d


def test_interference_is_the_engines_choice():
    """SOURCES.md: on this H100 with two attention kernels a mixed batch at r = 0.5 costs 0.67 of pure decode per
    token (T = 512). With the engine's interference 0 the roofline agrees in direction; the EB study engine's
    value from the hardware profile (1.29) makes the same batch dearer."""
    assert mixed_vs_decode(0.0) < 1.0
    assert mixed_vs_decode(None) > mixed_vs_decode(0.0)
    with pytest.raises(Exception, match="interference"):
        InstanceConfig(interference=-1.0).validate("cluster.colocated")


# --------------------------------------------------------------------------- measured on an H200 (2026-11-26)
def profile_vs_roofline(name: str, hardware: str, model: str) -> pd.DataFrame:
    """pdgym-profile's measurements (data/calibration/NAME) against the roofline of the same layers."""
    cost = build_cost_model(CostConfig(kind="roofline"), load_hardware(hardware), load_model(model),
                            InstanceConfig(count=1, dp=1, tp=1, ep=1))
    df = calibration.load(name)
    z = np.zeros(1)
    model_s = [cost.pass_time(np.array([float(r.tokens)]), np.array([r.tokens ** 2 / 2.0]), z, z) if r.phase == "prefill"
               else cost.pass_time(z, z, np.array([float(r.batch)]), np.array([float(r.batch * r.ctx)]))
               for r in df.itertuples()]
    return df.assign(model_s=model_s, ratio=np.array(model_s) / df.time_s)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_roofline_within_25_percent_of_pdgym_profile_on_an_h200(phase):
    """The H200 profile's roofline against pdgym-profile's own measurement on an H200 (SOURCES.md): 0.83-1.13 where
    it claims to model the pass, as on the H100. Prefill of 128-256 tokens (launch bound) only reported."""
    df = profile_vs_roofline("h200_qwen3_8b_profile.csv", "h200", "qwen3_8b")
    claim = (df.phase == "prefill") & (df.tokens >= 512) if phase == "prefill" else (
        (df.phase == "decode") & df.batch.between(8, 256))
    sel = df[claim]
    assert len(sel) >= 6 and bool(df[df.phase == "decode"].cuda_graph.all())
    bad = sel[(sel.ratio < 0.75) | (sel.ratio > 1.25)]
    assert bad.empty, bad[["phase", "batch", "ctx", "tokens", "time_s", "model_s", "ratio"]].to_string()


def test_the_measured_h200_profile_keeps_the_h100_kernels_shape():
    """Same silicon for compute: a prefill of 1-8K tokens takes about as long on the H200 as on the H100 (within
    25%); decode over 8K contexts, bandwidth bound, is faster on the H200 (4.8 against 3.35 TB/s)."""
    h200 = calibration.load("h200_qwen3_8b_profile.csv")
    h100 = pd.read_csv(CSV)
    for n in (1024, 2048, 4096, 8192):
        a = h200[(h200.phase == "prefill") & (h200.tokens == n)].time_s.item()
        b = h100[(h100.phase == "prefill") & (h100.batch == 1) & (h100.tokens_per_req == n)].time_s.item()
        assert 0.75 < a / b < 1.25, (n, a, b)
    for batch in (8, 32):
        a = h200[(h200.phase == "decode") & (h200.batch == batch) & (h200.ctx == 8192)].time_s.item()
        b = h100[(h100.phase == "decode") & (h100.batch == batch) & (h100.ctx == 8192)].time_s.item()
        assert a < b, (batch, a, b)


def test_the_measured_moe_profile_is_slower_than_its_roofline():
    """Qwen3-30B-A3B with torch's grouped GEMMs: the roofline is 0.34-0.84 of the measured pass (SOURCES.md), i.e.
    these kernels reach a fraction of what the profile assumes. Recorded as a bound, not a band: a roofline faster
    than the measurement everywhere, and never by more than 3x."""
    df = profile_vs_roofline("h200_qwen3_30b_a3b_profile.csv", "h200", "qwen3_30b_a3b")
    assert (df.ratio < 1.0).all() and (df.ratio > 1 / 3).all(), df[["phase", "batch", "ctx", "tokens", "ratio"]]


def slice_rows(component: str, precision: str = "fp8") -> pd.DataFrame:
    df = calibration.load(calibration.DS_V3_SLICE)
    return df[(df.component == component) & (df.precision == precision)].set_index("tokens_per_unit")


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_ds_v3_slice_pass_is_its_layers(precision):
    moe, dense, full = (slice_rows(c, precision) for c in ("moe_layer", "dense_layer", "pass"))
    assert list(full.index) == [512, 1024, 2048, 3072]
    assert np.allclose(full.time_s, 58 * moe.time_s + 3 * dense.time_s, rtol=1e-9)
    assert (full.time_s <= full.eager_s * 1.02).all()  # graph replay drops host gaps; never slower


def test_ds_v3_slice_roofline_column_is_the_current_roofline():
    """The file's roofline_s is recomputable; if the cost model changes, SOURCES.md's table must be re-derived."""
    inst = InstanceConfig(count=1, dp=8, tp=2, ep=16)
    full = slice_rows("pass")
    for tokens, r in full.iterrows():
        now = calibration.roofline_compute_s(load_hardware("h800"), load_model("deepseek_v3"), inst, tokens)
        assert now == pytest.approx(r.roofline_s, rel=1e-6), tokens


def test_ds_v3_slice_grows_with_tokens_as_the_roofline_does():
    """From 1K to 3K tokens per unit both the measured pass and the roofline's grow about 3x (within 25% of each
    other): the roofline has the pass's shape; what it misses is the level, the kernels' efficiency."""
    full = slice_rows("pass")
    measured = full.time_s[3072] / full.time_s[1024]
    modelled = full.roofline_s[3072] / full.roofline_s[1024]
    assert 0.75 < measured / modelled < 1.25


def test_implied_mfu_makes_the_roofline_meet_the_measured_pass():
    """calibration.implied_mfu: the mfu at which the roofline's compute of the SBS prefill instance's full-chunk
    pass equals the measured one (pbaa_util's `measured` pass-time point): about 0.25."""
    sim = load_scenario("ds_v3_h800_3p1d", []).sim
    mfu = calibration.implied_mfu(sim)
    inst = sim.cluster.prefill
    hw = dataclasses.replace(load_hardware("h800"), mfu=mfu)
    got = calibration.roofline_compute_s(hw, load_model("deepseek_v3"), inst, inst.chunk_tokens)
    assert got == pytest.approx(slice_rows("pass").time_s[3072], rel=1e-3)
    assert 0.15 < mfu < 0.35
    with pytest.raises(ConfigError, match="DP/TP/EP"):
        calibration.measured_pass_s(dataclasses.replace(inst, tp=1, ep=8), 3072)


def test_the_slice_script_runs_a_shrunk_shape_on_a_cpu(tmp_path):
    """data/calibration/ds_v3_prefill_slice.py end to end on a tiny shape: every component per token count, and
    no roofline for a shrunk slice (it is not the model)."""
    script = Path(__file__).resolve().parent.parent / "data" / "calibration" / "ds_v3_prefill_slice.py"
    p = subprocess.run([sys.executable, str(script), "--shrink", "32", "--tokens", "32,64", "--repeats", "1",
                        "--warmup", "0", "--out", str(tmp_path)], check=False, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    df = pd.read_csv(tmp_path / "ds_v3_prefill_slice.csv")
    assert set(df.component) == {"attention", "shared", "routed", "dense", "moe_layer", "dense_layer", "pass"}
    assert len(df) == 2 * 7 and df.roofline_s.isna().all() and (df.time_s > 0).all()
    bad = subprocess.run([sys.executable, str(script), "--tokens", "abc", "--out", str(tmp_path / "x")],
                         check=False, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--tokens" in bad.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("ep", [8, 16])
def test_the_roofline_kv_read_is_the_measured_one_in_a_decode_tier_step(ep):
    """One device's share of the BalanceRoute tier's step (Qwen3-30B-A3B, EP = N), measured on an H200: the cost of
    a cached token (the slope of step time in context at batch 64) is the roofline's within 25%; the rest of the
    step is far above the roofline's (kernel latency floor of 48 small layers), so a real step is less KV-bound."""
    df = calibration.load(f"h200_qwen3_30b_a3b_ep{ep}_profile.csv")
    g = df[(df.phase == "decode") & (df.batch == 64)].set_index("ctx").time_s
    measured = (g[4096] - g[256]) / (64 * 3840)
    cost = RooflineCost(dataclasses.replace(load_hardware("h200"), scaleup_bw=1e30, scaleout_bw=1e30,
                                            pass_overhead_s=0.0), load_model("qwen3_30b_a3b"),
                        InstanceConfig(count=1, dp=ep, tp=1, ep=ep))
    v, z = np.full(ep, 64.0), np.zeros(ep)
    modelled = (cost.pass_time(z, z, v, v * 4096) - cost.pass_time(z, z, v, v * 256)) / (64 * 3840)
    assert 0.75 < measured / modelled < 1.25, (measured, modelled)
    rest_measured = g[256] - measured * 64 * 256
    assert rest_measured > 2 * cost.pass_time(z, z, v, z)


def test_pdgym_profile_reproduces_the_independent_h100_measurement():
    """pdgym-profile on an H100 (h100_qwen3_8b_profile.csv) against the H100 kernels measured three days earlier by
    another script (h100_qwen3_8b_kernels.csv): within 25% at every common point, and within 15% for most."""
    ours = calibration.load("h100_qwen3_8b_profile.csv")
    ref = pd.read_csv(CSV)
    ratios = []
    for r in ours.itertuples():
        if r.phase == "prefill":
            m = ref[(ref.phase == "prefill") & (ref.batch == 1) & (ref.tokens_per_req == r.tokens)]
        else:
            m = ref[(ref.phase == "decode") & (ref.batch == r.batch) & (ref.ctx == r.ctx)]
        if len(m):
            ratios.append(r.time_s / m.time_s.item())
    ratios = np.array(ratios)
    assert len(ratios) >= 20
    assert ((ratios > 0.8) & (ratios < 1.25)).all(), ratios
    assert np.mean(np.abs(ratios - 1) < 0.15) > 0.9


def test_the_ds_v3_slice_on_the_h800_silicon_matches_the_h200():
    """The H100 is the H800's silicon (same FLOP peaks); prefill is compute-bound, so the slice's full-chunk pass
    there is within 10% of the H200's, and as far above the roofline."""
    h200 = slice_rows("pass")
    h100 = calibration.load("h100_ds_v3_prefill_slice.csv")
    h100 = h100[(h100.component == "pass") & (h100.precision == "fp8")].set_index("tokens_per_unit")
    assert 0.9 < h100.time_s[3072] / h200.time_s[3072] < 1.1
    assert (h100.roofline_s == h200.roofline_s).all() and (h100.time_s > 2 * h100.roofline_s).all()


# --------------------------------------------------------------------------- prefill after a cached prefix (H200)
def cached_prefix_grid() -> pd.DataFrame:
    df = calibration.load(calibration.CACHED_PREFIX)
    return df[df.kind == "prefill"].reset_index(drop=True)


def test_the_cached_prefix_grid_ships_with_the_package():
    df = cached_prefix_grid()
    assert sorted(df.n.unique()) == [256, 512, 1024, 2048, 4096, 8192]
    assert sorted(df.c.unique()) == [0, 1024, 4096, 16384, 32768] and len(df) == 30 and (df.layers == 36).all()


def test_shipped_h200_qwen3_8b_predicts_every_cached_prefix_point_with_n_from_1024_within_10_percent():
    """Issue 35's done-when: the h200 profile's PyTorch-SDPA engine (attn_mfu 0.34) and Qwen3-8B's decoder
    parameters price every pass of n >= 1024 new tokens after c = 0..32K cached ones within 10%. The roofline
    before (attention at mfu, every parameter per token) misses it both ways: 0.73 at 32K, 1.17 uncached."""
    df = cached_prefix_grid()
    hw, model = load_hardware("h200"), load_model("qwen3_8b")
    big = df[df.n >= 1024]
    ratio = calibration.cached_prefix_predicted_s(hw, model, big.n, big.c) / big.time_s.to_numpy()
    assert np.all(np.abs(ratio - 1) <= 0.10), dict(zip(zip(big.n, big.c), ratio.round(3)))
    before = calibration.cached_prefix_predicted_s(dataclasses.replace(hw, attn_mfu=hw.mfu),
                                                   dataclasses.replace(model, vocab_size=0), big.n, big.c)
    before = before / big.time_s.to_numpy()
    assert before.min() < 0.76 and before.max() > 1.15  # the test can fail: the old physics does


def test_h200_attn_mfu_is_the_fit_to_the_shared_grid():
    """conf/hardware/h200.yaml's attn_mfu is calibration.fit_attn_mfu on the grid, to two figures."""
    hw, model = load_hardware("h200"), load_model("qwen3_8b")
    fit = calibration.fit_attn_mfu(hw, model, cached_prefix_grid())
    assert 0.33 <= fit <= 0.36  # the 0.33-0.36 of the BF16 peak
    assert hw.attn_mfu == pytest.approx(round(fit, 2))


def test_fit_attn_mfu_recovers_the_value_that_generated_a_grid():
    hw, model = load_hardware("h200"), load_model("qwen3_8b")
    grid = pd.DataFrame([(n, c) for n in (1024, 4096) for c in (0, 8192, 32768)], columns=["n", "c"])
    truth = dataclasses.replace(hw, attn_mfu=0.47)
    grid["time_s"] = calibration.cached_prefix_predicted_s(truth, model, grid.n, grid.c)
    assert calibration.fit_attn_mfu(hw, model, grid) == pytest.approx(0.47, rel=1e-3)


def test_hit_savings_and_a_long_prompt_as_the_grid_measures_them():
    """The grid's own line (least squares of overhead + a n + k n (c + n / 2) over n >= 1024, relative error)
    interpolates it: an 8K prompt with a 4K hit costs 0.565 of the recompute, a 32K prompt 1.72 s. The calibrated
    roofline gives both within 2%; the one before gave 0.536 and 1.44 s (it overstated what a hit saves and
    under-priced long prompts)."""
    df = cached_prefix_grid()
    d = df[df.n >= 1024]
    x = np.column_stack([np.ones(len(d)), d.n, d.n * (d.c + d.n / 2)]) / d.time_s.to_numpy()[:, None]
    a, b, k = np.linalg.lstsq(x, np.ones(len(d)), rcond=None)[0]

    def line(n, c):
        return a + b * n + k * n * (c + n / 2)

    hw, model = load_hardware("h200"), load_model("qwen3_8b")
    before = dataclasses.replace(hw, attn_mfu=hw.mfu), dataclasses.replace(model, vocab_size=0)
    for h, m, ok in ((hw, model, True), (*before, False)):
        def t(n, c, h=h, m=m):
            return calibration.cached_prefix_predicted_s(h, m, [n], [c])[0]

        hit = t(4096, 4096) / t(8192, 0)
        assert (hit == pytest.approx(line(4096, 4096) / line(8192, 0), rel=0.02)) == ok, hit
        assert (t(32768, 0) == pytest.approx(line(32768, 0), rel=0.02)) == ok, t(32768, 0)
