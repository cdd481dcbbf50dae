"""Kernel timings measured on real GPUs (pdgym.data calibration/*.csv, method in its SOURCES.md) set against
the roofline.

The roofline's achievable FLOP fraction (`hardware.mfu`) stands for the kernels an engine runs. A pass measured
with real kernels says which fraction those kernels reach: `implied_mfu` is the mfu at which the roofline's
compute for the same pass equals the measured time. Reproductions use it as a labelled sensitivity point
(pbaa_util's `pass_time_measured`), never as the headline.
"""

from __future__ import annotations

import dataclasses
import importlib.resources

import numpy as np
import pandas as pd
from pdgym.envs.sim.config import ConfigError, InstanceConfig
from pdgym.envs.sim.cost import RooflineCost
from pdgym.envs.sim.hardware import HardwareProfile, load_hardware
from pdgym.envs.sim.models import ModelProfile, load_model
from pdgym.envs.sim.safe_files import save_figure

DS_V3_SLICE = "h200_ds_v3_prefill_slice.csv"  # data/calibration/ds_v3_prefill_slice.py on one H200
DS_V3_SLICE_H100 = "h100_ds_v3_prefill_slice.csv"  # the same on one H100 (the H800's silicon)
CACHED_PREFIX = "h200_qwen3_8b_cached_prefix_prefill.csv"  # Qwen3-8B prefill after c cached tokens, one H200
FREE = 1e30  # link bandwidth that makes the communication term vanish: one GPU measures compute only


def load(name: str) -> pd.DataFrame:
    """A measurement file shipped in pdgym.data/calibration."""
    with importlib.resources.as_file(importlib.resources.files("pdgym.data") / "calibration" / name) as path:
        return pd.read_csv(path)


def roofline_compute_s(hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig, tokens: int) -> float:
    """RooflineCost's pass with every DP unit prefilling `tokens` fresh prompt tokens, the links made free and no
    pass overhead: the per-device compute (or memory) term a one-GPU measurement is set against."""
    hw = dataclasses.replace(hw, scaleup_bw=FREE, scaleout_bw=FREE, pass_overhead_s=0.0)
    cost = RooflineCost(hw, model, dataclasses.replace(inst, count=1))
    t = np.full(inst.dp, float(tokens))
    return float(cost.pass_time(t, t * t / 2.0, np.zeros(inst.dp), np.zeros(inst.dp)))


def measured_pass_s(inst: InstanceConfig, tokens: int, precision: str = "fp8") -> float:
    """The DS-V3 slice's measured compute of one full pass of `inst` (58 MoE + 3 dense layers, one device's share,
    CUDA-graph replay) at `tokens` per DP unit; the instance's layout must be the one measured."""
    df = load(DS_V3_SLICE)
    row = df[(df.component == "pass") & (df.precision == precision) & (df.tokens_per_unit == tokens)]
    layout = df[["dp", "tp", "ep"]].drop_duplicates()
    if row.empty or len(layout) != 1 or tuple(layout.iloc[0]) != (inst.dp, inst.tp, inst.ep):
        have = tuple(int(v) for v in layout.iloc[0])
        raise ConfigError(f"{DS_V3_SLICE} holds DP/TP/EP {have} at tokens per unit "
                          f"{sorted(int(t) for t in df.tokens_per_unit.unique())} "
                          f"({', '.join(sorted(df.precision.unique()))}); asked for DP/TP/EP "
                          f"{(inst.dp, inst.tp, inst.ep)} at {tokens} ({precision})")
    return float(row.time_s.iloc[0])


def implied_mfu(sim_cfg, precision: str = "fp8") -> float:
    """The mfu at which the roofline's compute for a full-chunk pass of the prefill instance equals the measured
    one (bisection in log mfu; the compute term falls monotonically as mfu rises)."""
    inst = sim_cfg.cluster.prefill
    model = load_model(sim_cfg.model)
    if model.name != "deepseek_v3":
        raise ConfigError(f"{DS_V3_SLICE} measures deepseek_v3; the scenario serves {model.name}")
    hw = load_hardware(sim_cfg.hardware)
    target = measured_pass_s(inst, inst.chunk_tokens, precision)
    lo, hi = 1e-3, 1.0
    if roofline_compute_s(dataclasses.replace(hw, mfu=hi), model, inst, inst.chunk_tokens) > target:
        return hi  # even at peak the roofline is slower than measured: the bound itself
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        if roofline_compute_s(dataclasses.replace(hw, mfu=mid), model, inst, inst.chunk_tokens) > target:
            lo = mid
        else:
            hi = mid
    return hi


def cached_prefix_predicted_s(hw: HardwareProfile, model: ModelProfile, n, c) -> np.ndarray:
    """RooflineCost's time of a prefill pass of n new tokens after c cached ones (one prompt ending in the pass,
    one GPU): n x (c + n / 2) attention pairs, the same as the second chunk of a (c + n)-token prompt."""
    cost = RooflineCost(hw, model, InstanceConfig(count=1))
    z, one = np.zeros(1), np.ones(1)
    return np.array([cost.pass_time(np.array([float(k)]), np.array([k * (ck + k / 2.0)]), z, z, one)
                     for k, ck in zip(n, c)])


def fit_attn_mfu(hw: HardwareProfile, model: ModelProfile, df: pd.DataFrame, min_n: int = 1024) -> float:
    """The attn_mfu at which the roofline (hw's mfu, mbu, pass_overhead_s held) best predicts a cached-prefix grid
    (columns n, c, time_s): least squares of log(predicted / measured) over the points with n >= min_n (smaller
    passes carry eager PyTorch's launch gaps, which no attention efficiency describes)."""
    from scipy.optimize import minimize_scalar

    pts = df[df.n >= min_n]

    def loss(a: float) -> float:
        pred = cached_prefix_predicted_s(dataclasses.replace(hw, attn_mfu=a), model, pts.n, pts.c)
        return float(np.sum(np.log(pred / pts.time_s.to_numpy()) ** 2))

    return float(minimize_scalar(loss, bounds=(0.01, 1.0), method="bounded", options={"xatol": 1e-5}).x)


def ctx_figure(df: pd.DataFrame, path, title: str, before: pd.Series | None = None) -> None:
    """Prefill passes after cached context, measured (points) against modelled (lines; `before`, dotted): pass time
    over new tokens n per cached length c (left), and over c per n (right). df: columns n, c, time_s, fitted_s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, (x, by, label) in zip(axes, (("n", "c", "cached tokens c"), ("c", "n", "new tokens n"))):
        for i, (key, g) in enumerate(df.groupby(by)):
            g = g.sort_values(x)
            ax.plot(g[x], g.time_s * 1e3, "o", color=f"C{i}", label=f"{label} = {key}: measured")
            ax.plot(g[x], g.fitted_s * 1e3, "-", color=f"C{i}")
            if before is not None:
                ax.plot(g[x], before.loc[g.index] * 1e3, ":", color=f"C{i}", alpha=0.6)
        ax.set(xlabel="new tokens n" if x == "n" else "cached tokens c", ylabel="pass time (ms)")
        if x == "n":
            ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cached_prefix_figure(path) -> None:
    """The H200 cached-prefix grid against the shipped h200 / qwen3_8b roofline (and the roofline before issue 35:
    attention at mfu, every parameter per token)."""
    df = load(CACHED_PREFIX)
    df = df[df.kind == "prefill"].copy()
    hw, model = load_hardware("h200"), load_model("qwen3_8b")
    df["fitted_s"] = cached_prefix_predicted_s(hw, model, df.n, df.c)
    old = pd.Series(cached_prefix_predicted_s(dataclasses.replace(hw, attn_mfu=hw.mfu),
                                              dataclasses.replace(model, vocab_size=0), df.n, df.c), index=df.index)
    big = df.n >= 1024
    ratio, was = df.fitted_s / df.time_s, old / df.time_s
    ctx_figure(df, path, f"Qwen3-8B prefill after a cached prefix, one H200 (PyTorch SDPA flash kernel): points measured, "
                         f"lines the h200 roofline (attn_mfu {hw.attn_mfu}, decoder params),\ndotted the roofline before "
                         f"(attention at mfu, every param per token); predicted / measured at n >= 1024: "
                         f"{ratio[big].min():.2f}-{ratio[big].max():.2f} (before {was[big].min():.2f}-{was[big].max():.2f})",
               before=old)


def slice_figure(path) -> None:
    """The DS-V3 prefill slice: measured pass against the roofline's compute by tokens per DP unit, and one MoE
    layer's components at the full chunk with the FLOP rate each reached."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = load(DS_V3_SLICE)
    full = df[df.component == "pass"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for gpu, style, frame in (("H200", "o-", full), ("H100", "s:", load(DS_V3_SLICE_H100))):
        frame = frame[frame.component == "pass"]
        for i, (prec, g) in enumerate(frame.groupby("precision")):
            ax1.plot(g.tokens_per_unit, g.time_s * 1e3, style, color=f"C{i}", label=f"{gpu}, {prec} GEMMs")
    roof = full.groupby("tokens_per_unit").roofline_s.first()
    ax1.plot(roof.index, roof.values * 1e3, "k--", label="roofline compute (h800, mfu 0.6)")
    ax1.set(xlabel="prompt tokens per DP unit (8 units, TP 2, EP 16)", ylabel="one device's compute per pass (ms)",
            title="DeepSeek-V3 prefill pass, 61 layers (measured, CUDA graph)")
    ax1.set_xticks(sorted(full.tokens_per_unit.unique()))
    comps = ["attention", "shared", "routed", "dense"]
    top = df[df.tokens_per_unit == df.tokens_per_unit.max()]
    width = 0.38
    for i, (prec, g) in enumerate(top.groupby("precision")):
        g = g.set_index("component").loc[comps]
        x = np.arange(len(comps)) + (i - 0.5) * width
        ax2.bar(x, g.time_s * 1e3, width, color=f"C{i}", label=f"{prec} GEMMs")
        for xi, t, f in zip(x, g.time_s, g.flops):
            ax2.annotate(f"{f / t / 1e12:.0f}", (xi, t * 1e3), ha="center", va="bottom", fontsize=7)
    ax2.set_xticks(np.arange(len(comps)), ["attention\n(MLA, TP 2)", "shared expert", "16 routed\nexperts",
                                           "dense FFN\n(layers 1-3 only)"])
    ax2.set(ylabel="ms per layer (H200)", title=f"a layer's parts at {int(top.tokens_per_unit.max())} tokens per unit "
                                         "(labels: TFLOP/s reached)")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def figures(out) -> list:
    """Every shipped pdgym-profile and slice measurement as a figure in `out` (docs/calibration/): the slice (H200
    and H100), and each pdgym-profile file with its roofline fit (agents/plots.py's profile_fit, pdgym-profile's own figure)."""
    from pathlib import Path

    from pdgym.agents.plots import profile_fit

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    slice_figure(out / "h200_ds_v3_prefill_slice.png")
    cached_prefix_figure(out / "h200_qwen3_8b_cached_prefix.png")
    written = [out / "h200_ds_v3_prefill_slice.png", out / "h200_qwen3_8b_cached_prefix.png"]
    for name, title in (("h200_qwen3_8b_profile", "Qwen3-8B on an H200"),
                        ("h200_qwen3_30b_a3b_profile", "Qwen3-30B-A3B on an H200"),
                        ("h200_qwen3_30b_a3b_ep8_profile", "Qwen3-30B-A3B, one device of EP 8, on an H200"),
                        ("h200_qwen3_30b_a3b_ep16_profile", "Qwen3-30B-A3B, one device of EP 16, on an H200"),
                        ("h100_qwen3_8b_profile", "Qwen3-8B on an H100")):
        df = load(f"{name}.csv")
        profile_fit(df, out / f"{name}.png", f"{title} (pdgym-profile; points measured, lines its roofline fit)")
        written.append(out / f"{name}.png")
    return written


if __name__ == "__main__":
    import sys

    for p in figures(sys.argv[1] if len(sys.argv) > 1 else "docs/calibration"):
        print(p)
