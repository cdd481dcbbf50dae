"""Typed configuration of a cluster: its instance kinds (InstanceConfig) and how they connect (ClusterConfig).

Part of the simulator's typed configuration (config.py: SimConfig holds a ClusterConfig as `cluster`); the
same rules hold here: dataclasses as the single source of truth, one ConfigError line per bad value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .validation import check, check_choice, check_float, check_positive


@dataclass
class InstanceConfig:
    """One kind of instance (prefill, decode or colocated): parallelism and capacities."""

    count: int = 1
    dp: int = 1  # DP attention units (= workers on decode); each is one barrier participant
    tp: int = 1
    ep: int = 1  # expert-parallel degree (usually dp * tp)
    chunk_tokens: int = 4096  # prefill tokens per DP unit per pass (colocated: token budget per iteration)
    batch_limit: int = 256  # running requests per DP unit (decode / colocated slots)
    kv_capacity_tokens: int | None = None  # per DP unit; None = derived from HBM left after weights
    mem_util: float = 0.9  # fraction of HBM usable for weights + KV when kv_capacity_tokens is None
    prefix_cache_entries: int = 0  # per-DP LRU prefix cache size (prefix keys of workload.prefix_groups); 0 = off
    # prefix-block KV cache per DP unit (prefill instances; used when the requests carry block hashes: a Mooncake
    # trace or workload.chat), in tokens: null = what HBM leaves after the weights and the running KV (the longest
    # prompt plus one chunk, prefix_cache.py); 0 = off; a huge value = unbounded
    cache_tokens: int | None = None
    cache_eviction: str = "lru"  # lru | fifo | belady (hindsight: evicts the block reused furthest in the future)
    host_cache_tokens: int = 0  # second tier in host DRAM per DP unit (Mooncake's pool), tokens; 0 = off
    host_cache_gbps: float = 50.0  # host -> HBM bandwidth per DP unit for a host-tier hit, GB/s (PCIe 5 x16 ~ 50)
    # prefill: after a pass that leaves work queued (a long prompt's next chunk), hold the next pass this long so
    # a batch the scheduler releases on the EndForward joins its idle DP units (> net_latency_s to catch it); 0 = off
    batch_form_s: float = 0.0
    # prefill: the engine's DP unit for a request sent without one (immediate dispatch): least_loaded (an ideal
    # balancer that sees every unit's tokens) | round_robin (SGLang's default load_balance_method for DP attention)
    dp_dispatch: str = "least_loaded"
    # mixed-batch interference of this engine's kernels (cost.py), x decode KV-read time; null: the hardware
    # profile's value, which the EB study measured on ITS serving engine. An engine property, not a hardware law:
    # two separate attention kernels make a mixed batch cheaper per token than pure decode almost up to r = 1 on
    # an H100 (data/calibration/SOURCES.md), i.e. interference 0
    interference: float | None = None
    # this engine's kernels (the roofline, roofline.py): achievable fractions of the hardware's FLOP / bandwidth peaks
    # and fixed seconds per pass; null: the hardware profile's assumed values. Engine properties as interference is:
    # on an H200, torch's kernels reach mfu 0.25 on a DeepSeek-V3 prefill pass where the h800 profile assumes 0.6,
    # and a Qwen3-30B-A3B decode step of 48 small layers carries an 8.9 ms floor where it assumes 2 ms
    # (data/calibration/SOURCES.md)
    mfu: float | None = None
    mbu: float | None = None
    pass_overhead_s: float | None = None
    # this engine's attention kernel: achievable fraction of the BF16 peak on the attention products (prefill pairs,
    # compute-bound decode attention); null: the hardware profile's (conf/hardware/*.yaml says which engine class
    # each value describes: FlashAttention-3 / cuDNN-class near mfu, PyTorch SDPA's FlashAttention-2 0.34 on an H200)
    attn_mfu: float | None = None

    @property
    def gpus(self) -> int:
        """GPUs of all `count` instances: each DP unit spans `tp` GPUs, and the experts are spread over `ep` of
        them (an EP group wider than dp x tp needs that many)."""
        return int(self.count) * max(int(self.dp) * int(self.tp), int(self.ep))

    def validate(self, key: str, allow_zero_count: bool = False) -> None:
        check(self.count >= (0 if allow_zero_count else 1), f"{key}.count", f"got {self.count}; must be >= 1")
        for name in ("dp", "tp", "ep", "chunk_tokens", "batch_limit"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, f"{key}.{name}", f"got {v!r}; must be an integer >= 1")
        if self.kv_capacity_tokens is not None:
            check(self.kv_capacity_tokens >= 1, f"{key}.kv_capacity_tokens",
                  f"got {self.kv_capacity_tokens}; must be >= 1 (or null to derive it from HBM)")
        check(0 < self.mem_util <= 1, f"{key}.mem_util", f"got {self.mem_util}; allowed (0, 1]")
        check(self.prefix_cache_entries >= 0, f"{key}.prefix_cache_entries", "must be >= 0")
        if self.cache_tokens is not None:
            check(isinstance(self.cache_tokens, int) and self.cache_tokens >= 0, f"{key}.cache_tokens",
                  f"got {self.cache_tokens!r}; must be an integer >= 0 (0: off; null: derived from HBM)")
        check_choice(self.cache_eviction, f"{key}.cache_eviction", ("lru", "fifo", "belady"))
        check(isinstance(self.host_cache_tokens, int) and self.host_cache_tokens >= 0, f"{key}.host_cache_tokens",
              f"got {self.host_cache_tokens!r}; must be an integer >= 0 (0: no host tier)")
        check_float(self.host_cache_gbps, f"{key}.host_cache_gbps", 0.0, math.inf, lo_open=True, hi_open=True)
        check_positive(self.batch_form_s, f"{key}.batch_form_s", allow_zero=True)
        check_choice(self.dp_dispatch, f"{key}.dp_dispatch", ("least_loaded", "round_robin"))
        if self.interference is not None:
            check_positive(self.interference, f"{key}.interference", allow_zero=True)
        for name in ("mfu", "mbu", "attn_mfu"):
            if getattr(self, name) is not None:
                check_float(getattr(self, name), f"{key}.{name}", 0.0, 1.0, lo_open=True)
        if self.pass_overhead_s is not None:
            check_positive(self.pass_overhead_s, f"{key}.pass_overhead_s", allow_zero=True)


@dataclass
class ClusterConfig:
    topology: str = "disaggregated"  # disaggregated | colocated
    # Defaults that hold the default model (DeepSeek-V3 on H800): a DP-8 prefill instance needs two nodes
    # (TP 2, EP 16), a decode instance EP >= 16 (conf/cluster/disagg_3p1d.yaml has the arithmetic).
    prefill: InstanceConfig = field(default_factory=lambda: InstanceConfig(count=1, dp=8, tp=2, ep=16))
    decode: InstanceConfig = field(default_factory=lambda: InstanceConfig(count=1, dp=32, ep=32))
    colocated: InstanceConfig = field(default_factory=lambda: InstanceConfig(count=1, dp=1))
    kv_policy: str = "preempt"  # preempt (recompute) | reject, when a worker's KV would overflow
    net_latency_s: float = 1e-3  # scheduler -> instance dispatch latency (L_net)
    kv_link: str = "scaleout"  # scaleout | scaleup: which link carries the P -> D KV transfer
    kv_transfer_base_s: float = 2e-3  # fixed setup latency of one KV transfer

    TOPOLOGIES = ("disaggregated", "colocated")
    KV_POLICIES = ("preempt", "reject")

    @property
    def gpus(self) -> int:
        """GPUs of the cluster as configured (prefill + decode instances, or the colocated ones); autoscaling
        (faults.scale) does not change it."""
        if self.topology == "colocated":
            return self.colocated.gpus
        return self.prefill.gpus + self.decode.gpus

    def validate(self, key: str = "cluster") -> None:
        check_choice(self.topology, f"{key}.topology", self.TOPOLOGIES)
        check_choice(self.kv_policy, f"{key}.kv_policy", self.KV_POLICIES)
        check_choice(self.kv_link, f"{key}.kv_link", ("scaleout", "scaleup"))
        check_positive(self.net_latency_s, f"{key}.net_latency_s", allow_zero=True)
        check_positive(self.kv_transfer_base_s, f"{key}.kv_transfer_base_s", allow_zero=True)
        if self.topology == "disaggregated":
            self.prefill.validate(f"{key}.prefill")
            self.decode.validate(f"{key}.decode")
        else:
            self.colocated.validate(f"{key}.colocated")
        for kind in ("decode", "colocated"):  # the prefix-block cache is a prefill-instance mechanism
            inst = getattr(self, kind)
            check(inst.cache_tokens is None and inst.host_cache_tokens == 0, f"{key}.{kind}.cache_tokens",
                  "prefix-block caches are modelled on prefill instances only (cluster.prefill.cache_tokens)")
