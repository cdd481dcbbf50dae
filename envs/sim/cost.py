"""Forward-pass time models: the registry (`cost.kind`) and the builder every instance calls.

Kinds: roofline (default; roofline.py), linear (the EB form), piecewise_linear (the batching study's
service curve), table (measured timings from a CSV) (curves.py). The contract all share (four per-unit
vectors -> seconds, the barrier) is cost_model.CostModel. This module is the front door: the models, the EB
fit and the KV memory helpers are importable from here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping

import numpy as np

from . import compiled
from .config import CostConfig, InstanceConfig
from .cost_model import CostModel
from .curves import (
    EB_H200_QWEN3_8B,
    LinearCost,
    PiecewiseLinearCost,
    TableCost,
    linear_coefficients,
)
from .hardware import HardwareProfile
from .kv_memory import kv_capacity_tokens, kv_transfer_fn, kv_transfer_time
from .models import ModelProfile
from .registry import Registry
from .roofline import RooflineCost, engine_hardware
from .validation import ConfigError, check, check_params

__all__ = ["COST_MODELS", "EB_H200_QWEN3_8B", "CostModel", "LinearCost", "PiecewiseLinearCost", "RooflineCost",
           "TableCost", "build_cost_model", "engine_hardware", "kv_capacity_tokens", "kv_transfer_fn",
           "kv_transfer_time", "linear_coefficients"]

DEFAULT_MEAN_PROMPT = 1024.0  # prompt and decode-context lengths the linear fit assumes unless
DEFAULT_MEAN_CTX = 1024.0  # cost.params.mean_prompt / mean_ctx say otherwise


COST_MODELS: Registry[Callable[..., CostModel]] = Registry("cost.kind")


def build_cost_model(cfg: CostConfig, hw: HardwareProfile, model: ModelProfile,
                     inst: InstanceConfig, engine: str = "python") -> CostModel:
    """The cost model `cfg.kind` for one instance shape; bad params fail naming cost.params.X. A full pass of the
    shape (every unit a full chunk, or a full batch) must take a finite time: hardware values that are valid
    one by one (hbm_bw=1e-300) otherwise gave NaN latencies and a result that looked like one."""
    cost = COST_MODELS[cfg.kind](dict(cfg.params or {}), hw, model, inst)
    dp, c, b = inst.dp, float(inst.chunk_tokens), float(inst.batch_limit)
    full = np.full(dp, c)
    try:
        with np.errstate(all="ignore"):  # an overflow here is what the check reports, in one line
            probe = (cost.pass_time(full, full * c / 2, np.zeros(dp), np.zeros(dp), np.ones(dp)),
                     cost.pass_time(np.zeros(dp), np.zeros(dp), np.full(dp, b), np.full(dp, b * c)))
    except OverflowError:
        probe = (math.inf,)
    if not all(math.isfinite(t) and t >= 0 for t in probe):
        where = "hardware (hbm_bw, flops_*, mfu, mbu, link bandwidths)" if cfg.kind == "roofline" else "cost.params"
        raise ConfigError(f"{where}: a full pass of this instance takes {max(probe)} s under cost.kind={cfg.kind}; "
                          "the values must give a finite, non-negative time")
    cost.decode_kernel = compiled.decode_time(cost, engine)
    cost.prefill_kernel = compiled.prefill_time(cost, engine)
    cost.route_kernel = compiled.least_kv_route(engine)
    cost.finish_kernel = compiled.decode_finishes(engine)
    return cost


@COST_MODELS.register("roofline")
def _roofline(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, (), "cost.params", "kind=roofline")
    return RooflineCost(hw, model, inst)


@COST_MODELS.register("linear")
def _linear(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, LinearCost.KEYS + ("mean_prompt", "mean_ctx"), "cost.params", "kind=linear")
    coef = {k: _nonneg(params, k) for k in params}
    means = coef.pop("mean_prompt", DEFAULT_MEAN_PROMPT), coef.pop("mean_ctx", DEFAULT_MEAN_CTX)
    for k, v in zip(("mean_prompt", "mean_ctx"), means):
        check(v > 0, f"cost.params.{k}", f"got {v}; must be > 0")
    missing = [k for k in LinearCost.KEYS if k not in coef and k != "b_kv"]
    if missing:  # fill what was not given from the roofline of this hardware, model and shape
        fit = linear_coefficients(RooflineCost(hw, model, inst), *means)
        coef.update({k: fit[k] for k in missing})
    return LinearCost(inst.dp, coef)


@COST_MODELS.register("piecewise_linear")
def _piecewise_linear(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, ("c", "a", "b0"), "cost.params", "kind=piecewise_linear")
    for k in ("c", "a"):
        check(k in params, f"cost.params.{k}", "required for kind=piecewise_linear (c + a * max(0, b - b0))")
    return PiecewiseLinearCost(inst.dp, _nonneg(params, "c"), _nonneg(params, "a"),
                               _nonneg(params, "b0") if "b0" in params else 0.0)


@COST_MODELS.register("table")
def _table(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, ("path",), "cost.params", "kind=table")
    check(isinstance(params.get("path"), str), "cost.params.path", "required for kind=table: give +cost.params.path=FILE.csv")
    return TableCost(inst.dp, params["path"], hw.name, model.name)


def _nonneg(params: Mapping, k: str) -> float:
    v = params[k]
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    check(ok, f"cost.params.{k}", f"got {v!r}; must be a number >= 0")
    return float(v)
