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

from .classes import SLOClass, validate_classes
from .cluster_config import ClusterConfig, InstanceConfig  # noqa: F401  (InstanceConfig: also imported from here)
from .ordering import QueueConfig
from .prediction import PredictorConfig
from .validation import ENGINES, ConfigError, check, check_choice, check_float, check_positive  # ConfigError: also imported from here


def check_seed(value: Any, key: str = "seed") -> int:
    """A simulator seed: an integer in [0, 2**63) (numpy's SeedSequence takes any non-negative int)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    check(ok, key, f"got {value!r}; must be an integer in [0, 2**63)")
    return int(value)


# Above this many requests per second no cluster keeps up and arrival gaps fall below a microsecond.
MAX_RATE = 1e6


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
class ChatConfig:
    """Synthetic multi-turn chat with prefix blocks (workload.py "Prefix blocks"): sessions > 0 turns it on."""

    sessions: int = 0  # concurrent conversations; each request is the next turn of one, drawn uniformly
    system_tokens: int = 0  # a system prompt every conversation starts with
    system_prompts: int = 1  # distinct system prompts (conversation s uses s mod system_prompts)
    max_context: int = 32768  # a turn that would exceed this starts a new conversation in its session
    block_tokens: int = 512  # tokens per hashed prefix block (Mooncake's traces use 512)

    def validate(self, key: str) -> None:
        for name, lo in (("sessions", 0), ("system_tokens", 0), ("system_prompts", 1), ("max_context", 1),
                         ("block_tokens", 1)):
            v = getattr(self, name)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{key}.{name}",
                  f"got {v!r}; must be an integer >= {lo}")


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
    # seed around the trace's own rate curve; recorded = the recorded times (every seed identical); process = the
    # configured arrival process at `rate` (the trace gives lengths, blocks and order only).
    trace_arrivals: str = "redraw"
    trace_rate_rows: int = 32  # redraw: rows per piece of the trace's rate curve (32 keeps its burstiness)
    time_scale: float | None = None  # multiply trace inter-arrival times by this (alternative to rate)
    prefix_groups: int = 0  # > 0: each request gets a prefix key in [0, prefix_groups) ...
    prefix_frac: float = 0.5  # ... that covers this fraction of its prompt
    prefix_zipf: float = 0.0  # > 0: prefix keys Zipf-distributed with this exponent (0: uniform)
    chat: ChatConfig = field(default_factory=ChatConfig)  # synthetic multi-turn prefix blocks (sessions > 0)
    phases: list[WorkloadPhase] | None = None  # concatenated segments (distribution shift)
    classes: list[SLOClass] | None = None  # SLO tiers (classes.py); null: one class with the scenario's slo
    class_by: str = "share"  # how requests get a class: share | prompt | trace | label (classes.py)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)  # output-length predictions (prediction.py)

    TRACE_ARRIVALS = ("redraw", "recorded", "process")

    def validate(self, key: str = "workload") -> None:
        check(int(self.num_requests) >= 1, f"{key}.num_requests", f"got {self.num_requests}; must be >= 1")
        check_choice(self.trace_arrivals, f"{key}.trace_arrivals", self.TRACE_ARRIVALS)
        check(int(self.trace_rate_rows) >= 1, f"{key}.trace_rate_rows", f"got {self.trace_rate_rows}; must be >= 1")
        merged = bool(self.classes) and self.class_by == "trace"  # classes' traces merged (rate null: native)
        if self.arrival not in ("closed", "trace") and self.trace is None and not merged:
            check(isinstance(self.rate, (int, float)) and self.rate > 0, f"{key}.rate",
                  f"got {self.rate!r}; arrival={self.arrival} needs rate > 0 (rate: null only replays a trace's times)")
        if self.arrival == "trace":
            check(self.trace is not None, f"{key}.trace", "arrival=trace needs a trace (path or azure_conv, "
                  "azure_code, splitwise_conv)")
        if self.rate is not None:
            check_positive(self.rate, f"{key}.rate")
            check_float(self.rate, f"{key}.rate", 0, MAX_RATE)
        if self.time_scale is not None:
            check_positive(self.time_scale, f"{key}.time_scale")
        check(self.prefix_groups >= 0, f"{key}.prefix_groups", f"got {self.prefix_groups}; must be >= 0")
        check(self.prefix_zipf >= 0, f"{key}.prefix_zipf", f"got {self.prefix_zipf}; must be >= 0")
        check_positive(self.period_s, f"{key}.period_s")
        check_positive(self.cv, f"{key}.cv", allow_zero=self.arrival != "gamma")
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
        self.chat.validate(f"{key}.chat")
        validate_classes(self.classes, self.class_by, key)
        self.predictor.validate(f"{key}.predictor")
        if self.classes and self.class_by == "trace":
            check(self.trace is None and not self.phases and self.chat.sessions == 0, f"{key}.class_by",
                  "class_by=trace merges the classes' own traces; it cannot be combined with workload.trace, "
                  "phases or chat")
        if self.classes and self.class_by == "label":
            check(self.trace is not None, f"{key}.class_by",
                  "class_by=label reads the class column of workload.trace; set workload.trace (a trace file with a "
                  "class column)")
        if self.chat.sessions > 0:
            check(self.prefix_groups == 0, f"{key}.chat.sessions",
                  "cannot be combined with workload.prefix_groups (two prefix models); set one of them")
            check(not self.phases, f"{key}.chat.sessions", "cannot be combined with workload.phases")
            check(self.trace is None, f"{key}.chat.sessions",
                  "cannot be combined with workload.trace (a trace brings its own blocks, or none)")
        for i, ph in enumerate(self.phases or []):
            check(ph.num_requests >= 1, f"{key}.phases[{i}].num_requests", "must be >= 1")
            if ph.rate is not None:
                check_positive(ph.rate, f"{key}.phases[{i}].rate")
                check_float(ph.rate, f"{key}.phases[{i}].rate", 0, MAX_RATE)
            if ph.concurrency is not None:
                check(ph.concurrency >= 1, f"{key}.phases[{i}].concurrency", "must be >= 1")
            ph.prompt.validate(f"{key}.phases[{i}].prompt")
            ph.output.validate(f"{key}.phases[{i}].output")


# --------------------------------------------------------------------------- cost, faults, SLO (the cluster: cluster_config.py)
@dataclass
class CostConfig:
    """Which forward-time model to use and its parameters (see cost.py)."""

    kind: str = "roofline"  # a name in cost.COST_MODELS: roofline | linear | piecewise_linear | table
    params: dict[str, Any] = field(default_factory=dict)  # model-specific coefficients / CSV path


@dataclass
class FaultConfig:
    """Fault and scale events injected into the run."""

    drop_end_forward: float = 0.0  # probability that an EndForward signal never reaches the scheduler
    down: list[dict[str, Any]] = field(default_factory=list)  # [{instance, at, until}] prefill (disaggregated only)
    # [{at, count}] active prefill instances from `at` on. A count above cluster.prefill.count is a scale-up, by
    # design: the cluster is built with max(count) prefill instances, those beyond cluster.prefill.count down
    # until a scale event brings them up (an autoscaler's headroom), so their memory counts from the start
    scale: list[dict[str, Any]] = field(default_factory=list)
    detect_s: float = 5.0  # health checks report a down instance this long after it fails

    def validate(self, key: str = "faults") -> None:
        check(0 <= self.drop_end_forward < 1, f"{key}.drop_end_forward",
              f"got {self.drop_end_forward}; allowed [0, 1)")
        for i, d in enumerate(self.down):
            k = f"{key}.down[{i}]"
            check(isinstance(d, dict) and "instance" in d and "at" in d and set(d) <= {"instance", "at", "until"},
                  k, f"got {d!r}; need {{instance, at}} and optional until")
            check(_is_int(d["instance"]) and d["instance"] >= 0, f"{k}.instance",
                  f"got {d['instance']!r}; must be a prefill instance index >= 0")
            check_float(d["at"], f"{k}.at", 0, math.inf)
            if d.get("until") is not None:
                check_float(d["until"], f"{k}.until", 0, math.inf)
                check(d["until"] > d["at"], f"{k}.until", f"got {d['until']!r}; must be > at ({d['at']!r})")
        for i, s in enumerate(self.scale):
            k = f"{key}.scale[{i}]"
            check(isinstance(s, dict) and set(s) == {"at", "count"}, k, f"got {s!r}; need {{at, count}}")
            check(_is_int(s["count"]) and s["count"] >= 1, f"{k}.count", f"got {s['count']!r}; must be an integer >= 1")
            check_float(s["at"], f"{k}.at", 0, math.inf)
        check_positive(self.detect_s, f"{key}.detect_s", allow_zero=True)

    def check_topology(self, cluster: ClusterConfig, key: str = "faults") -> None:
        """Faults act on prefill instances and the scheduler's EndForward signals: disaggregated only."""
        if cluster.topology != "disaggregated":
            for name in ("down", "scale"):
                check(not getattr(self, name), f"{key}.{name}",
                      f"needs cluster.topology=disaggregated (prefill instances); this cluster is {cluster.topology}")
            check(self.drop_end_forward == 0, f"{key}.drop_end_forward",
                  f"needs cluster.topology=disaggregated (EndForward is a prefill signal); got {self.drop_end_forward} "
                  f"on a {cluster.topology} cluster")
            return
        n = max([cluster.prefill.count] + [int(s["count"]) for s in self.scale])
        for i, d in enumerate(self.down):
            check(d["instance"] < n, f"{key}.down[{i}].instance",
                  f"got {d['instance']}; allowed 0..{n - 1} (cluster.prefill.count={cluster.prefill.count})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
    queue: QueueConfig = field(default_factory=QueueConfig)  # queue discipline (ordering.py)
    oracle: bool = False  # expose true output lengths to policies
    max_sim_time_s: float = math.inf  # stop the clock here; unfinished requests are rejected("horizon")
    engine: str = "python"  # python, or numba: compiled kernels with the same results (compiled.py)
    check_policies: bool = False  # digest the engine's state around each policy call (tamper_check.py)

    def validate(self) -> SimConfig:
        _check_nested(self, "")  # a SimConfig built in Python (simulate(SimConfig(cluster=None)))
        self.cluster.validate()
        self.workload.validate()
        self.faults.validate()
        self.faults.check_topology(self.cluster)
        check_positive(self.slo.ttft_s, "slo.ttft_s")
        check_positive(self.slo.tpot_s, "slo.tpot_s")
        self.queue.validate()
        check_positive(self.max_sim_time_s, "max_sim_time_s")  # inf: no horizon
        check_choice(self.engine, "engine", ENGINES)
        check(isinstance(self.check_policies, bool), "check_policies", f"got {self.check_policies!r}; must be true or "
              "false (true: a policy that changes the engine's state outside its actions stops the run)")
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
            from .validation import did_you_mean
            raise ConfigError(f"{sub_key}: unknown key; {did_you_mean(k, fields)}allowed: {', '.join(fields)}")
        _check_type(fields[k], v, sub_key)
        sub = _NESTED.get((cls, k))
        if sub is not None and v is None and "None" not in str(fields[k].type):
            raise ConfigError(f"{sub_key}: got null; must be a mapping (keys: "
                              f"{', '.join(g.name for g in dataclasses.fields(sub))})")
        if sub is not None and v is not None:
            if k in _LISTS:
                v = [_build(sub, p, f"{sub_key}[{i}]") for i, p in enumerate(v)]
            else:
                v = _build(sub, v, sub_key)
        kwargs[k] = v
    return cls(**kwargs)


def _check_type(f: dataclasses.Field, v: Any, key: str) -> None:
    """Scalars must have the type their default has (ints may not be fractional; numbers finite unless the default
    is infinite, like max_sim_time_s: an infinite latency or rate ran to exit 0 with most requests rejected);
    lists and mappings must be lists and mappings (workload.phases=5 was a TypeError traceback)."""
    kind = str(f.type)
    if v is not None and kind.startswith(("list[", "dict[")):
        want = list if kind.startswith("list[") else dict
        check(isinstance(v, want), key, f"got {v!r}; must be a {'list' if want is list else 'mapping'}")
    default = f.default
    if v is None or default is dataclasses.MISSING or default is None or f.type == "Any":
        return
    if isinstance(default, bool):
        check(isinstance(v, bool), key, f"got {v!r}; must be true or false")
    elif isinstance(default, (int, float)):
        check(isinstance(v, (int, float)) and not isinstance(v, bool), key, f"got {v!r}; must be a number")
        check(not math.isnan(v) and (math.isfinite(v) or math.isinf(default)), key, f"got {v!r}; must be finite")
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
    (SimConfig, "queue"): QueueConfig,
    (ClusterConfig, "prefill"): InstanceConfig,
    (ClusterConfig, "decode"): InstanceConfig,
    (ClusterConfig, "colocated"): InstanceConfig,
    (WorkloadConfig, "prompt"): LengthConfig,
    (WorkloadConfig, "output"): LengthConfig,
    (WorkloadConfig, "phases"): WorkloadPhase,
    (WorkloadConfig, "chat"): ChatConfig,
    (WorkloadConfig, "classes"): SLOClass,
    (WorkloadConfig, "predictor"): PredictorConfig,
    (WorkloadPhase, "prompt"): LengthConfig,
    (WorkloadPhase, "output"): LengthConfig,
}


_LISTS = ("phases", "classes")  # nested sections that are lists of their class


def _check_nested(obj: Any, key: str) -> None:
    """Every nested section of a dataclass config is of its own class (recursively; optional ones may be None)."""
    for f in dataclasses.fields(obj):
        sub, v, k = _NESTED.get((type(obj), f.name)), getattr(obj, f.name), f"{key}.{f.name}" if key else f.name
        if sub is None or (v is None and "None" in str(f.type)):
            continue
        if f.name in _LISTS:
            check(isinstance(v, list), k, f"got {v!r}; must be a list of {f.name}")
        for i, item in enumerate(v if f.name in _LISTS else [v]):
            at = f"{k}[{i}]" if f.name in _LISTS else k
            check(isinstance(item, sub), at, f"got {item!r}; must be a {sub.__name__} (or a mapping of its keys)")
            _check_nested(item, at)


def sim_config(data: Any) -> SimConfig:
    """Build and validate a SimConfig from a SimConfig, a dict or an OmegaConf node."""
    if not isinstance(data, (SimConfig, dict)) and data is not None:
        from omegaconf import OmegaConf

        if not OmegaConf.is_config(data):
            hint = "; a Scenario's simulator config is its .sim (load_scenario(NAME).sim)" if hasattr(data, "sim") else (
                "; a scenario name goes through load_scenario(NAME).sim (pdgym.envs.scenario)" if isinstance(data, str)
                else "")
            raise ConfigError(f"config: expected a SimConfig, a dict or an OmegaConf node, got {type(data).__name__}{hint}")
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
            from .validation import did_you_mean
            raise ConfigError(f"{'.'.join(parts[:i + 1])}: unknown key; {did_you_mean(part, names)}allowed: "
                              f"{', '.join(names)}")
        sub = _NESTED.get((cls, part))
        if sub is None:
            return
        cls = sub


# --------------------------------------------------------------------------- memory footprint
# Bytes per DP unit and per request, measured with tracemalloc (peak of Simulator construction and of
# simulate() + metrics() at 4000 requests on ds_v3_h800_3p1d / decode_tier_n8 / coloc_h100_qwen3_8b:
# 800 B per prefill or colocated unit, 430 B per decode unit, 0.8-1.0 KiB per request with its results).
_BYTES_PER_UNIT = {"prefill": 800, "decode": 450, "colocated": 800}
_BYTES_PER_REQUEST = 1024


def footprint_bytes(cfg: SimConfig) -> int:
    """A lower estimate of the memory one run of `cfg` needs (instances' DP units plus requests)."""
    cl = cfg.cluster
    kinds = ("prefill", "decode") if cl.topology == "disaggregated" else ("colocated",)
    units = 0
    for kind in kinds:
        inst = getattr(cl, kind)
        count = inst.count
        if kind == "prefill":
            count = max([count] + [int(s["count"]) for s in cfg.faults.scale])
        units += _BYTES_PER_UNIT[kind] * int(count) * int(inst.dp)
    wl = cfg.workload
    n = sum(int(p.num_requests) for p in wl.phases) if wl.phases else int(wl.num_requests)
    return units + _BYTES_PER_REQUEST * n


def check_footprint(cfg: SimConfig, limit_gb: float, key: str = "memory_limit_gb") -> None:
    """Refuse a run whose estimated footprint exceeds `limit_gb` GiB (before anything is allocated)."""
    check_positive(limit_gb, key)
    need = footprint_bytes(cfg)
    check(need <= limit_gb * 2**30, "cluster",
          f"this run needs at least {need / 2**30:.3g} GiB (DP units x instances and requests; "
          f"{key}={limit_gb:g}); shrink cluster.*.count / dp or workload.num_requests, or raise {key}")
