"""KV memory and transfers: the KV tokens a DP unit holds, and the time to move KV cache over a link."""

from __future__ import annotations

from collections.abc import Callable

from .config import InstanceConfig
from .hardware import HardwareProfile
from .models import ModelProfile
from .roofline import kv_shards
from .validation import check, check_choice


def kv_capacity_tokens(hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig,
                       key: str = "cluster.*") -> int:
    """KV tokens one DP unit can hold: inst.kv_capacity_tokens if set, else what HBM x mem_util
    leaves after the resident weights (non-routed / tp, routed experts / max(ep, tp))."""
    if inst.kv_capacity_tokens is not None:
        return int(inst.kv_capacity_tokens)
    shard = max(inst.ep, inst.tp)
    resident = (model.nonrouted_params / inst.tp + model.routed_params / shard) * model.weight_bytes
    usable = hw.hbm_bytes * inst.mem_util
    per_token = model.kv_bytes_per_token / kv_shards(model, inst.tp)  # bytes per device
    tokens = int((usable - resident) // per_token)
    check(tokens >= 1, f"{key}.kv_capacity_tokens",
          f"{model.name} weights need {resident / 1e9:.1f} GB per device (tp={inst.tp}, ep={inst.ep}) but "
          f"{hw.name} has {usable / 1e9:.1f} GB usable (mem_util {inst.mem_util}); "
          "set kv_capacity_tokens explicitly or raise ep/tp")
    return tokens


def kv_transfer_time(tokens: float, hw: HardwareProfile, model: ModelProfile, link: str,
                     base_s: float) -> float:
    """Seconds to move `tokens` tokens of KV cache over one device's `link` (scaleout | scaleup)."""
    return kv_transfer_fn(hw, model, link, base_s)(tokens)


def kv_transfer_fn(hw: HardwareProfile, model: ModelProfile, link: str,
                   base_s: float) -> Callable[[float], float]:
    """`kv_transfer_time` with the link checked and its bandwidth resolved once: the engine calls the
    returned function once per finished prefill (same arithmetic, so the same floats)."""
    check_choice(link, "cluster.kv_link", ("scaleout", "scaleup"))
    bw = hw.scaleout_bw if link == "scaleout" else hw.scaleup_bw
    kvb = model.kv_bytes_per_token

    def transfer(tokens: float) -> float:
        return base_s + tokens * kvb / bw

    return transfer
