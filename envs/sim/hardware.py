"""Accelerator profiles: the handful of numbers the cost models need per device.

Profiles ship as `conf/hardware/NAME.yaml` (package data `pdgym.conf`), so the same
file is both a Hydra config-group option and what `load_hardware("NAME")` reads.
The loaders here are shared with `models.py`: a profile is a frozen dataclass
built from a mapping with every key checked, so a typo fails with one line.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from .config import ConfigError, check, check_positive
from .validation import did_you_mean


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """One device (GPU / NPU); every figure is per device. Units in conf/hardware/*.yaml."""

    name: str
    hbm_bw: float  # memory bandwidth, bytes/s
    hbm_bytes: float  # memory capacity, bytes
    flops_bf16: float  # dense BF16 FLOP/s
    flops_fp8: float  # dense FP8 FLOP/s, 0 = unsupported
    scaleup_bw: float  # NVLink / HCCS / UB (PCIe without), bytes/s one direction
    scaleout_bw: float  # IB / RoCE NIC, bytes/s one direction
    scaleup_domain: int  # devices per scale-up domain
    pass_overhead_s: float  # fixed seconds per forward pass
    mfu: float  # achievable fraction of peak FLOP/s: the weight GEMMs
    attn_mfu: float  # achievable fraction of the BF16 peak: the attention products (QK^T, PV), the engine's kernel
    mbu: float  # achievable fraction of peak memory bandwidth
    interference: float  # mixed-batch decode-attention slowdown (cost.py)
    source: str = ""

    def validate(self, key: str) -> None:
        for f in ("hbm_bw", "hbm_bytes", "flops_bf16", "scaleup_bw", "scaleout_bw", "scaleup_domain"):
            check_positive(getattr(self, f), f"{key}.{f}")
        for f in ("flops_fp8", "pass_overhead_s", "interference"):
            check_positive(getattr(self, f), f"{key}.{f}", allow_zero=True)
        for f in ("mfu", "attn_mfu", "mbu"):
            v = getattr(self, f)
            check(0 < v <= 1, f"{key}.{f}", f"got {v!r}; allowed (0, 1]")


def build_profile(cls: type, data: Mapping, key: str):
    """A `cls` profile from a mapping: unknown keys, missing keys and non-numbers are ConfigErrors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key; {did_you_mean(unknown[0], fields)}allowed: {', '.join(fields)}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            check(f.default is not dataclasses.MISSING, f"{key}.{name}", "missing")
            continue
        kwargs[name] = _coerce(data[name], f.type, f"{key}.{name}")
    prof = cls(**kwargs)
    prof.validate(key)
    return prof


def _coerce(v: Any, typ: str, key: str):
    if typ == "str":
        check(isinstance(v, str), key, f"got {v!r}; must be a string")
        return v
    if typ == "bool":
        check(isinstance(v, bool), key, f"got {v!r}; must be true or false")
        return v
    try:
        x = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    check(math.isfinite(x), key, f"got {v!r}; must be a finite number")
    if typ == "int":
        check(x == int(x), key, f"got {v!r}; must be an integer")
        return int(x)
    return x


def profile_names(group: str) -> list[str]:
    """Names of the profiles shipped in `pdgym.conf/<group>/*.yaml`, sorted."""
    root = importlib.resources.files("pdgym.conf").joinpath(group)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def read_profile(cls: type, group: str, name: str):
    """Load a shipped profile by name; an unknown name lists the allowed ones (one line)."""
    names = profile_names(group)
    if name not in names:
        raise ConfigError(f"{group}: unknown {name!r}; {did_you_mean(name, names)}allowed: {', '.join(names)}")
    text = importlib.resources.files("pdgym.conf").joinpath(group, f"{name}.yaml").read_text()
    data = yaml.safe_load(text)
    check(isinstance(data, dict), f"{group}.{name}", "profile file is not a mapping")
    return build_profile(cls, data, group)


def load_profile(cls: type, group: str, spec: Any, cached_by_name):
    """Shared front end of load_hardware / load_model: a name, a mapping or a profile."""
    if isinstance(spec, cls):
        return spec
    if isinstance(spec, str):
        return cached_by_name(spec)
    if isinstance(spec, Mapping):
        return build_profile(cls, dict(spec), group)
    raise ConfigError(f"{group}: expected a profile name or a mapping of its fields, got {type(spec).__name__}")


@functools.cache
def _hardware_by_name(name: str) -> HardwareProfile:
    return read_profile(HardwareProfile, "hardware", name)


def load_hardware(spec: str | Mapping | HardwareProfile) -> HardwareProfile:
    """A profile from its name (conf/hardware/NAME.yaml), a mapping of its fields, or a profile."""
    return load_profile(HardwareProfile, "hardware", spec, _hardware_by_name)


def hardware_names() -> list[str]:
    return profile_names("hardware")
