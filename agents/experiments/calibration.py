"""Kernel timings measured on real GPUs (pdgym.data calibration/*.csv, method in its SOURCES.md) set against
the roofline.

The roofline's achievable FLOP fraction (`hardware.mfu`) stands for the kernels an engine runs. A pass measured
with real kernels says which fraction those kernels reach: `implied_mfu` is the mfu at which the roofline's
compute for the same pass equals the measured time. Reproductions use it as a labelled sensitivity point
(pbaa_util's `pass_time_mfu: [..., measured]`), never as the headline.
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

DS_V3_SLICE = "h200_ds_v3_prefill_slice.csv"  # data/calibration/ds_v3_prefill_slice.py on one H200
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
        raise ConfigError(f"{DS_V3_SLICE} holds DP/TP/EP {tuple(layout.iloc[0])} at tokens per unit "
                          f"{sorted(df.tokens_per_unit.unique())} ({', '.join(sorted(df.precision.unique()))}); "
                          f"asked for DP/TP/EP {(inst.dp, inst.tp, inst.ep)} at {tokens} ({precision})")
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
