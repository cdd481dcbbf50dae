"""pdgym-profile (agents/apps/profile.py): a tiny shape timed on the CPU gives a table CSV that the table cost
model loads and a simulate() runs on; the roofline fit recovers known mfu / mbu / pass_overhead_s from timings
the roofline itself generated; bad input is one line, exit 2, no files."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from pdgym.agents.apps import profile
from pdgym.envs.sim import simulate
from pdgym.envs.sim.config import CostConfig, InstanceConfig, sim_config
from pdgym.envs.sim.cost import build_cost_model
from pdgym.envs.sim.hardware import load_hardware
from pdgym.envs.sim.models import load_model

TINY = ["profile.shrink=32", "profile.layers=1", "profile.prefill_tokens=[16,64,256]", "profile.decode_batch=[1,4,16]",
        "profile.decode_ctx=[64,256]", "profile.warmup=1", "profile.repeats=3", "profile.threads=1",
        "profile.check_requests=0"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "pdgym.agents.apps.profile", *args], check=False, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "run"
    p = run(*TINY, "profile.plots=true", "hydra.run.dir=" + str(out))
    assert p.returncode == 0, p.stderr
    return out, p.stdout


@pytest.fixture(scope="module")
def tiny_run(tiny_profile):
    return tiny_profile[0]


def test_tiny_cpu_run_writes_every_file(tiny_run):
    for name in ("table.csv", "measurements.csv", "hardware_fit.yaml", "profile.png", "fit.json"):
        assert (tiny_run / name).is_file(), name
    assert not list(tiny_run.glob(".*partial*"))
    fit = json.loads((tiny_run / "fit.json").read_text())
    assert fit["device"] == "cpu" and fit["points"] == 3 + 3 * 2 and fit["mfu"] > 0 and fit["mbu"] > 0
    meas = pd.read_csv(tiny_run / "measurements.csv")
    assert (meas.time_s > 0).all() and np.allclose(meas.time_s, meas.timed_s * 36)  # 1 of qwen3_8b's 36 layers
    hw = yaml.safe_load((tiny_run / "hardware_fit.yaml").read_text())
    assert hw["name"] == "h100_profiled" and hw["mfu"] == pytest.approx(fit["mfu"], rel=1e-3)


def test_printed_table_override_drives_pdgym_sim(tiny_profile, tmp_path, monkeypatch):
    """The overrides the app prints (as README shows them) are accepted by pdgym-sim: `cost.params` is
    free-form, so its `path` needs the `+` (without it Hydra refuses the key)."""
    from pdgym.agents.apps import sim

    out, stdout = tiny_profile
    hint = next(ln for ln in stdout.splitlines() if "cost.kind=table" in ln).split(": ", 1)[1].split()
    assert hint == ["cost.kind=table", f"+cost.params.path={out / 'table.csv'}"]
    monkeypatch.chdir(tmp_path)
    sim.main(["scenario=coloc_h100_qwen3_8b", "workload.num_requests=20", "plots=false", *hint,
              f"hydra.run.dir={tmp_path / 'sim'}"])
    assert json.loads((tmp_path / "sim" / "metrics.json").read_text())["finished"] == 20
    assert yaml.safe_load((tmp_path / "sim" / ".hydra" / "config.yaml").read_text())["cost"]["params"] == \
        {"path": str(out / "table.csv")}


def test_table_csv_loads_into_the_table_cost_model_and_drives_a_simulation(tiny_run):
    path = str(tiny_run / "table.csv")
    table = pd.read_csv(path)
    assert list(table.columns) == ["phase", "tokens", "kv", "time_s", "model", "hardware"]
    assert set(table.model) == {"qwen3_8b"} and set(table.hardware) == {"h100"}  # what was timed, checked on use
    cost = build_cost_model(CostConfig(kind="table", params={"path": path}), load_hardware("h100"),
                            load_model("qwen3_8b"), InstanceConfig(count=1))
    z, one = np.zeros(1), np.ones(1)
    pre = table[table.phase == "prefill"].sort_values("tokens")
    assert cost.pass_time(one * 64, z, z, z) == pytest.approx(pre.time_s[pre.tokens == 64].item())
    dec = table[table.phase == "decode"].sort_values("kv")
    assert cost.pass_time(z, z, one * 4, one * 256) == pytest.approx(dec.time_s[dec.kv == 256].item())
    cfg = sim_config({"hardware": "h100", "model": "qwen3_8b", "cost": {"kind": "table", "params": {"path": path}},
                      "cluster": {"topology": "colocated", "colocated": {"count": 1}},
                      "workload": {"num_requests": 30, "arrival": "closed", "concurrency": 8}})
    res = simulate(cfg, seed=0)
    assert res.metrics()["finished"] == 30


def test_the_app_checks_its_table_with_a_simulation(tmp_path):
    out = tmp_path / "run"
    p = run(*TINY[:-1], "profile.check_requests=20", "profile.plots=false", "profile.prefill_tokens=[16,128]",
            "profile.decode_batch=[1,4]", "profile.decode_ctx=[64]", "hydra.run.dir=" + str(out))
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "fit.json").read_text())["check_run"]["finished"] == 20


GRID = pd.DataFrame(
    [{"phase": "prefill", "batch": 1, "tokens_per_req": n, "ctx": 0} for n in (128, 256, 512, 1024, 2048, 4096, 8192)]
    + [{"phase": "decode", "batch": b, "tokens_per_req": 1, "ctx": c}
       for b in (1, 8, 32, 64, 128, 256) for c in (256, 1024, 4096)])


@pytest.mark.parametrize("model,truth", [
    ("qwen3_8b", {"mfu": 0.45, "mbu": 0.7, "pass_overhead_s": 3e-3}),
    ("qwen3_30b_a3b", {"mfu": 0.3, "mbu": 0.85, "pass_overhead_s": 5e-4}),
])
def test_fit_recovers_the_roofline_that_generated_the_timings(model, truth):
    hw, m = load_hardware("h100"), load_model(model)
    # without cached context the fit holds attn_mfu = mfu: one efficiency for all matrix work generates the grid
    cost = build_cost_model(CostConfig(kind="roofline"),
                            dataclasses.replace(hw, **truth, attn_mfu=truth["mfu"], interference=0.0), m,
                            InstanceConfig(count=1))
    z = np.zeros(1)
    t = [cost.pass_time(np.array([r.tokens_per_req * 1.0]), np.array([r.tokens_per_req ** 2 / 2.0]), z, z)
         if r.phase == "prefill" else cost.pass_time(z, z, np.array([r.batch * 1.0]), np.array([r.batch * r.ctx * 1.0]))
         for r in GRID.itertuples()]
    noise = np.random.default_rng(0).normal(1.0, 0.01, len(t))  # 1% timing noise
    fit = profile.fit_roofline(hw, m, GRID.assign(time_s=np.array(t) * noise))
    assert fit["mfu"] == pytest.approx(truth["mfu"], rel=0.03)
    assert fit["mbu"] == pytest.approx(truth["mbu"], rel=0.03)
    assert fit["pass_overhead_s"] == pytest.approx(truth["pass_overhead_s"], rel=0.15)
    assert np.abs(fit["rel_err"]).max() < 0.05


CTX_GRID = pd.DataFrame(
    [{"phase": "prefill", "batch": 1, "tokens_per_req": n, "ctx": c} for n in (256, 1024, 4096) for c in (0, 4096, 32768)]
    + [{"phase": "decode", "batch": b, "tokens_per_req": 1, "ctx": c} for b in (1, 32, 256) for c in (256, 4096)])


def test_fit_recovers_attn_mfu_apart_from_mfu_on_a_grid_with_cached_context():
    """A synthetic table from known coefficients (attention at 0.34, GEMMs at 0.55: a FlashAttention-2-class engine),
    prefill after 0-32K cached tokens: the fit returns all four; without the context axis attn_mfu is tied to mfu."""
    hw, m = load_hardware("h200"), load_model("qwen3_8b")
    truth = {"mfu": 0.55, "attn_mfu": 0.34, "mbu": 0.75, "pass_overhead_s": 2e-3}
    timed = profile.timed_model(m, profile.model_shape(m, 1, None, 151936, 2))
    cost = build_cost_model(CostConfig(kind="roofline"), dataclasses.replace(hw, **truth, interference=0.0), timed,
                            InstanceConfig(count=1))
    z = np.zeros(1)
    t = [cost.pass_time(np.array([r.tokens_per_req * 1.0]), np.array([r.tokens_per_req * (r.ctx + r.tokens_per_req / 2)]),
                        z, z) if r.phase == "prefill"
         else cost.pass_time(z, z, np.array([r.batch * 1.0]), np.array([r.batch * r.ctx * 1.0]))
         for r in CTX_GRID.itertuples()]
    noise = np.random.default_rng(1).normal(1.0, 0.01, len(t))
    fit = profile.fit_roofline(hw, timed, CTX_GRID.assign(time_s=np.array(t) * noise))
    assert fit["attn_fitted"]
    for k, v in truth.items():
        assert fit[k] == pytest.approx(v, rel=0.05 if k != "pass_overhead_s" else 0.25), k
    flat = profile.fit_roofline(hw, timed, GRID.assign(time_s=1e-3 * (1 + np.arange(len(GRID)))))
    assert not flat["attn_fitted"] and flat["attn_mfu"] == flat["mfu"]


def test_a_cpu_run_with_cached_context_and_a_named_kernel(tmp_path):
    out = tmp_path / "ctx"
    p = run(*TINY, "profile.prefill_tokens=[16,64]", "profile.prefill_ctx=[0,128]", "profile.attn_kernel=math",
            "profile.plots=true", "hydra.run.dir=" + str(out))
    assert p.returncode == 0, p.stderr
    meas = pd.read_csv(out / "measurements.csv")
    pre = meas[meas.phase == "prefill"]
    assert sorted(zip(pre.tokens_per_req, pre.ctx)) == [(16, 0), (16, 128), (64, 0), (64, 128)]
    fit = json.loads((out / "fit.json").read_text())
    assert fit["attn_fitted"] and fit["attn_kernel"] == "math" and fit["prefill_ctx"] == [0, 128]
    assert (out / "prefill_ctx.png").is_file()
    table = pd.read_csv(out / "table.csv")  # the table has no context axis: the c = 0 passes
    assert sorted(table[table.phase == "prefill"].tokens) == [16, 64]
    assert yaml.safe_load((out / "hardware_fit.yaml").read_text())["attn_mfu"] == pytest.approx(fit["attn_mfu"], rel=1e-3)


def test_timed_model_counts_what_the_workload_builds():
    m = load_model("qwen3_8b")
    shape = profile.model_shape(m, 1, None, 151936, 2)
    assert shape.ffn == 12288  # params_total gives 12287; rounded to 128 as Qwen3-8B's intermediate_size is
    tm = profile.timed_model(m, shape)
    assert tm.kv_bytes_per_token == m.kv_bytes_per_token and tm.layers == 36
    moe = profile.model_shape(load_model("qwen3_30b_a3b"), 1, None, 0, 2)
    assert (moe.experts, moe.top_k, moe.expert_ffn) == (128, 8, 768)
    share = profile.model_shape(load_model("qwen3_30b_a3b"), 1, None, 0, 2, ep=8)  # one device of EP 8
    assert (share.experts, share.top_k) == (16, 8)


@pytest.mark.parametrize("args,key", [
    (["profile.device=tpu"], "profile.device"),
    (["profile.decode_batch=[0,4]"], "profile.decode_batch"),
    (["profile.layers=99"], "profile.layers"),
    (["profile.ep=2"], "profile.ep"),
    (["model=qwen3_30b_a3b", "profile.ep=3"], "profile.ep"),
    (["model=qwen3_30b_a3b", "profile.ep=32"], "profile.ep"),
    (["profile.bogus=1"], "profile.bogus"),
    (["profile.memory_limit_gb=0.001"], "profile.memory_limit_gb"),
    (["hardware=tpu_v9"], "hardware"),
    (["profile.prefill_ctx=[-1]"], "profile.prefill_ctx"),
    (["profile.attn_kernel=fa9"], "profile.attn_kernel"),
])
def test_bad_input_is_one_line_exit_2_and_no_files(tmp_path, capsys, args, key):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:  # in process: the checks run before Hydra makes a run folder
        profile.main([*args, "hydra.run.dir=" + str(out)])
    assert exc.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln]
    assert len(lines) == 1 and key in lines[0] and lines[0].startswith("pdgym-profile: error:")
    assert not out.exists()


def test_moe_grouped_gemm_is_the_per_expert_loop():
    """The MoE layer's grouped GEMM (no host sync, so CUDA graphs can hold decode) computes what one GEMM per expert
    does; the layer uses it only after checking that here."""
    import torch

    shape = profile.model_shape(load_model("qwen3_30b_a3b"), 16, None, 0, 4)
    layers = profile.Layers(shape, 1, "cpu", "float32", 0)
    assert layers.grouped == hasattr(torch, "_grouped_mm")
    x = torch.randn(1, 40, shape.hidden)
    with torch.inference_mode():
        grouped = layers._moe(x, layers.layers[0])
        layers.grouped = False
        loop = layers._moe(x, layers.layers[0])
    assert torch.allclose(grouped, loop, rtol=1e-4, atol=1e-5)
