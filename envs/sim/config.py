"""Typed configuration of one simulation.

These dataclasses are the single source of truth for what a scenario may say: the
Hydra app uses them as structured configs and `simulate()` validates them, so a bad
value fails with one line that names the key and what is allowed (`ConfigError`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .validation import ConfigError, check, check_choice, check_positive  # ConfigError: also imported from here


# --------------------------------------------------------------------------- workload
@dataclass
class LengthConfig:
    """A token-length distribution (prompt or output). Samples are clipped to [min, max]."""

    dist: str = "fixed"  # fixed | uniform | geometric | gamma | lognormal | empirical
    mean: float = 512.0  # fixed: the value; geometric/gamma/lognormal: the mean
    cv: float = 1.0  # gamma / lognormal coefficient of variation
    low: int = 1  # uniform lower bound (inclusive)
    high: int = 1024  # uniform upper bound (inclusive)
    min: int = 1
    max: int = 1_000_000
    values: list[int] | None = None  # empirical: sample with replacement from these
    column: str | None = None  # empirical: take values from this column of the trace at `source`
    source: str | None = None  # empirical: a trace path or a shipped trace name ("azure_conv", ...)

    DISTS = ("fixed", "uniform", "geometric", "gamma", "lognormal", "empirical")

    def validate(self, key: str) -> None:
        check_choice(self.dist, f"{key}.dist", self.DISTS)
        check_positive(self.mean, f"{key}.mean")
        check_positive(self.min, f"{key}.min")
        check(self.max >= self.min, f"{key}.max", f"got {self.max}; must be >= {key}.min ({self.min})")
        if self.dist in ("gamma", "lognormal"):
            check_positive(self.cv, f"{key}.cv")
        if self.dist == "uniform":
            check(1 <= self.low <= self.high, f"{key}.low", f"need 1 <= low <= high, got {self.low}, {self.high}")
        if self.dist == "geometric":
            check(self.mean >= 1, f"{key}.mean", f"got {self.mean}; geometric mean must be >= 1")
        if self.dist == "empirical":
            check(bool(self.values) or bool(self.source), key, "empirical needs `values` or `source`")


@dataclass
class WorkloadPhase:
    """A segment of a workload with its own lengths (used for distribution shifts)."""

    num_requests: int = 1000
    prompt: LengthConfig = field(default_factory=LengthConfig)
    output: LengthConfig = field(default_factory=lambda: LengthConfig(mean=128))
    rate: float | None = None  # overrides the workload rate for this phase (open loop)
    concurrency: int | None = None  # overrides the workload concurrency for this phase (closed loop)


@dataclass
class WorkloadConfig:
    """Traffic: an arrival process and length distributions, or a trace replay."""

    num_requests: int = 1000
    arrival: str = "poisson"  # a process in workload.ARRIVALS (poisson, gamma, ...) | closed | trace
    rate: float | None = 10.0  # mean requests/s (open loop); with a trace: rescale to this rate (null: as recorded)
    cv: float = 2.0  # gamma inter-arrival coefficient of variation
    on_s: float = 5.0  # onoff: mean on-period (arrivals at rate / duty) ...
    off_s: float = 5.0  # ... and mean off-period (no arrivals)
    steps: list[list[float]] | None = None  # steps: [[t_start_s, rate], ...]
    period_s: float = 3600.0  # diurnal: period of the sinusoid
    amplitude: float = 0.5  # diurnal: relative amplitude in [0, 1)
    concurrency: int = 64  # closed: requests in flight
    think_s: float = 0.0  # closed: delay between a completion and the next request
    prompt: LengthConfig = field(default_factory=LengthConfig)
    output: LengthConfig = field(default_factory=lambda: LengthConfig(mean=128))
    trace: str | None = None  # CSV path or shipped name (azure_conv, azure_code, splitwise_conv)
    trace_offset: int = 0  # first trace row used (for held-out splits)
    # How a seed varies a trace replay (workload.py docstring): redraw = arrival times re-drawn by the
    # seed around the trace's own rate curve; recorded = the recorded times (every seed identical).
    trace_arrivals: str = "redraw"
    trace_rate_rows: int = 32  # redraw: rows per piece of the trace's rate curve (32 keeps its burstiness)
    time_scale: float | None = None  # multiply trace inter-arrival times by this (alternative to rate)
    prefix_groups: int = 0  # > 0: each request gets a prefix key in [0, prefix_groups) ...
    prefix_frac: float = 0.5  # ... that covers this fraction of its prompt
    prefix_zipf: float = 0.0  # > 0: prefix keys Zipf-distributed with this exponent (0: uniform)
    phases: list[WorkloadPhase] | None = None  # concatenated segments (distribution shift)

    TRACE_ARRIVALS = ("redraw", "recorded")

    def validate(self, key: str = "workload") -> None:
        check(int(self.num_requests) >= 1, f"{key}.num_requests", f"got {self.num_requests}; must be >= 1")
        check_choice(self.trace_arrivals, f"{key}.trace_arrivals", self.TRACE_ARRIVALS)
        check(int(self.trace_rate_rows) >= 1, f"{key}.trace_rate_rows", f"got {self.trace_rate_rows}; must be >= 1")
        if self.arrival not in ("closed", "trace") and self.trace is None:
            check(isinstance(self.rate, (int, float)) and self.rate > 0, f"{key}.rate",
                  f"got {self.rate!r}; arrival={self.arrival} needs rate > 0 (rate: null only replays a trace's times)")
        if self.arrival == "trace":
            check(self.trace is not None, f"{key}.trace", "arrival=trace needs a trace (path or azure_conv, "
                  "azure_code, splitwise_conv)")
        if self.rate is not None:
            check_positive(self.rate, f"{key}.rate")
        if self.time_scale is not None:
            check_positive(self.time_scale, f"{key}.time_scale")
        check(self.prefix_groups >= 0, f"{key}.prefix_groups", f"got {self.prefix_groups}; must be >= 0")
        check(self.prefix_zipf >= 0, f"{key}.prefix_zipf", f"got {self.prefix_zipf}; must be >= 0")
        check_positive(self.period_s, f"{key}.period_s")
        if self.arrival == "gamma":
            check_positive(self.cv, f"{key}.cv")
        if self.arrival == "onoff":
            check_positive(self.on_s, f"{key}.on_s")
            check_positive(self.off_s, f"{key}.off_s", allow_zero=True)
        if self.arrival == "steps":
            check(bool(self.steps), f"{key}.steps", "arrival=steps needs [[t_start_s, rate], ...]")
        if self.arrival == "diurnal":
            check(0 <= self.amplitude < 1, f"{key}.amplitude", f"got {self.amplitude}; allowed [0, 1)")
        if self.arrival == "closed":
            check(int(self.concurrency) >= 1, f"{key}.concurrency", f"got {self.concurrency}; must be >= 1")
            check_positive(self.think_s, f"{key}.think_s", allow_zero=True)
        check(0 <= self.prefix_frac <= 1, f"{key}.prefix_frac", f"got {self.prefix_frac}; allowed [0, 1]")
        check(self.trace_offset >= 0, f"{key}.trace_offset", "must be >= 0")
        self.prompt.validate(f"{key}.prompt")
        self.output.validate(f"{key}.output")
        for i, ph in enumerate(self.phases or []):
            check(ph.num_requests >= 1, f"{key}.phases[{i}].num_requests", "must be >= 1")
            if ph.rate is not None:
                check_positive(ph.rate, f"{key}.phases[{i}].rate")
            if ph.concurrency is not None:
                check(ph.concurrency >= 1, f"{key}.phases[{i}].concurrency", "must be >= 1")
            ph.prompt.validate(f"{key}.phases[{i}].prompt")
            ph.output.validate(f"{key}.phases[{i}].output")


# --------------------------------------------------------------------------- cluster
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
    prefix_cache_entries: int = 0  # per-DP LRU prefix cache size (prefix keys); 0 = off
    # prefill: after a pass that leaves work queued (a long prompt's next chunk), hold the next pass this long so
    # a batch the scheduler releases on the EndForward joins its idle DP units (> net_latency_s to catch it); 0 = off
    batch_form_s: float = 0.0

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
        check_positive(self.batch_form_s, f"{key}.batch_form_s", allow_zero=True)


@dataclass
class ClusterConfig:
    topology: str = "disaggregated"  # disaggregated | colocated
    prefill: InstanceConfig = field(default_factory=lambda: InstanceConfig(count=1, dp=8, ep=8))
    decode: InstanceConfig = field(default_factory=lambda: InstanceConfig(count=1, dp=8, ep=8))
    colocated: InstanceConfig = field(default_factory=lambda: InstanceConfig(count=1, dp=1))
    kv_policy: str = "preempt"  # preempt (recompute) | reject, when a worker's KV would overflow
    net_latency_s: float = 1e-3  # scheduler -> instance dispatch latency (L_net)
    kv_link: str = "scaleout"  # scaleout | scaleup: which link carries the P -> D KV transfer
    kv_transfer_base_s: float = 2e-3  # fixed setup latency of one KV transfer

    TOPOLOGIES = ("disaggregated", "colocated")
    KV_POLICIES = ("preempt", "reject")

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


@dataclass
class CostConfig:
    """Which forward-time model to use and its parameters (see cost.py)."""

    kind: str = "roofline"  # a name in cost.COST_MODELS: roofline | linear | piecewise_linear | table
    params: dict[str, Any] = field(default_factory=dict)  # model-specific coefficients / CSV path


@dataclass
class FaultConfig:
    """Fault and scale events injected into the run."""

    drop_end_forward: float = 0.0  # probability that an EndForward signal never reaches the scheduler
    down: list[dict[str, Any]] = field(default_factory=list)  # [{instance, at, until}] prefill (or colocated)
    scale: list[dict[str, Any]] = field(default_factory=list)  # [{at, count}] active prefill instances
    detect_s: float = 5.0  # health checks report a down instance this long after it fails

    def validate(self, key: str = "faults") -> None:
        check(0 <= self.drop_end_forward < 1, f"{key}.drop_end_forward",
              f"got {self.drop_end_forward}; allowed [0, 1)")
        for i, d in enumerate(self.down):
            check("instance" in d and "at" in d, f"{key}.down[{i}]", "needs keys instance, at (and optional until)")
            check(d.get("until") is None or d["until"] > d["at"], f"{key}.down[{i}].until", "must be > at")
        for i, s in enumerate(self.scale):
            check("at" in s and "count" in s and s["count"] >= 1, f"{key}.scale[{i}]",
                  "needs keys at and count >= 1")
        check_positive(self.detect_s, f"{key}.detect_s", allow_zero=True)


@dataclass
class SLOConfig:
    ttft_s: float = 2.0
    tpot_s: float = 0.1


@dataclass
class SimConfig:
    """Everything one `simulate()` call needs besides the policies and the seed."""

    hardware: Any = "h800"  # profile name (conf/hardware/NAME.yaml) or a mapping of its fields
    model: Any = "deepseek_v3"  # profile name (conf/model/NAME.yaml) or a mapping
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    oracle: bool = False  # expose true output lengths to policies
    max_sim_time_s: float = math.inf  # stop the clock here; unfinished requests are rejected("horizon")

    def validate(self) -> SimConfig:
        self.cluster.validate()
        self.workload.validate()
        self.faults.validate()
        check_positive(self.slo.ttft_s, "slo.ttft_s")
        check_positive(self.slo.tpot_s, "slo.tpot_s")
        return self


def _build(cls, data: Any, key: str):
    """Recursively build dataclass `cls` from a mapping, rejecting unknown keys with a clear line."""
    if isinstance(data, cls):
        return data
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        sub_key = f"{key}.{k}" if key else k
        if k not in fields:
            raise ConfigError(f"{sub_key}: unknown key; allowed: {', '.join(fields)}")
        _check_type(fields[k], v, sub_key)
        sub = _NESTED.get((cls, k))
        if sub is not None and v is not None:
            if k == "phases":
                v = [_build(sub, p, f"{sub_key}[{i}]") for i, p in enumerate(v)]
            else:
                v = _build(sub, v, sub_key)
        kwargs[k] = v
    return cls(**kwargs)


def _check_type(f: dataclasses.Field, v: Any, key: str) -> None:
    """Scalars must have the type their default has (ints may not be fractional)."""
    default = f.default
    if v is None or default is dataclasses.MISSING or default is None or f.type == "Any":
        return
    if isinstance(default, bool):
        check(isinstance(v, bool), key, f"got {v!r}; must be true or false")
    elif isinstance(default, (int, float)):
        check(isinstance(v, (int, float)) and not isinstance(v, bool), key, f"got {v!r}; must be a number")
        if isinstance(default, int):
            check(float(v).is_integer(), key, f"got {v!r}; must be an integer")
    elif isinstance(default, str):
        check(isinstance(v, str), key, f"got {v!r}; must be a string")


_NESTED = {
    (SimConfig, "cluster"): ClusterConfig,
    (SimConfig, "workload"): WorkloadConfig,
    (SimConfig, "cost"): CostConfig,
    (SimConfig, "faults"): FaultConfig,
    (SimConfig, "slo"): SLOConfig,
    (ClusterConfig, "prefill"): InstanceConfig,
    (ClusterConfig, "decode"): InstanceConfig,
    (ClusterConfig, "colocated"): InstanceConfig,
    (WorkloadConfig, "prompt"): LengthConfig,
    (WorkloadConfig, "output"): LengthConfig,
    (WorkloadConfig, "phases"): WorkloadPhase,
    (WorkloadPhase, "prompt"): LengthConfig,
    (WorkloadPhase, "output"): LengthConfig,
}


def sim_config(data: Any) -> SimConfig:
    """Build and validate a SimConfig from a SimConfig, a dict or an OmegaConf node."""
    if not isinstance(data, (SimConfig, dict)) and data is not None:
        from omegaconf import OmegaConf

        if not OmegaConf.is_config(data):
            raise ConfigError(f"config: expected a SimConfig, a dict or an OmegaConf node, got {type(data).__name__}")
        data = OmegaConf.to_container(data, resolve=True)
    return _build(SimConfig, data, "").validate()


def check_key_path(path: str) -> None:
    """Raise ConfigError if a dotted key (e.g. 'workload.prompt.mean') names no SimConfig field.

    Keys under free-form mappings (hardware, model, cost.params) are not checked here.
    """
    cls = SimConfig
    parts = path.split(".")
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            raise ConfigError(f"{'.'.join(parts[:i + 1])}: unknown key; allowed: {', '.join(names)}")
        sub = _NESTED.get((cls, part))
        if sub is None:
            return
        cls = sub
