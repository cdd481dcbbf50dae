"""Traffic for the simulator: arrival processes, token-length distributions and trace replay
(reading trace files is `traces.py`).

`make_workload(cfg, rng)` turns a `WorkloadConfig` into a struct-of-arrays `Workload`. Everything is
drawn from the one `numpy.random.Generator` passed in, so the same seed gives identical arrays, and
everything is vectorised (20k requests take a few milliseconds; thinning-based `diurnal` a little more).

Rules (the config docstrings are short; this is the reference):

Arrivals (`workload.arrival`)
    poisson        exponential inter-arrival times at `rate`.
    deterministic  arrivals at k / rate, k = 1, 2, ... (exact spacing 1 / rate).
    gamma          gamma inter-arrival times with mean 1 / rate and coefficient of variation `cv`.
    onoff          alternating exponential on / off periods (means `on_s` / `off_s`), starting "on";
                   Poisson arrivals at rate * (on_s + off_s) / on_s while on, none while off, so the
                   long-run rate is `rate` and inter-arrival CV > 1 (bursty).
    steps          piecewise-constant rate from `steps = [[t_start_s, rate], ...]` (t_start strictly
                   increasing, rates >= 0, the last one > 0); `rate` applies before the first t_start.
                   Non-homogeneous Poisson by exact inversion of the cumulative intensity.
    diurnal        rate(t) = rate * (1 + amplitude * sin(2 pi t / period_s)), by thinning.
    closed         closed loop: `arrival` is None, `concurrency` is `concurrency` for every request
                   and `think_s` is the delay from a completion to the next release.
    trace          the times of the trace file (see below).
    Open-loop processes start at t = 0; the first request arrives one inter-arrival gap later (the
    trace starts exactly at 0).

Lengths (`LengthConfig`, see `sample_lengths`): fixed (mean), uniform [low, high], geometric (support
>= 1, p = 1 / mean), gamma (mean, cv), lognormal (mean, cv; sigma^2 = ln(1 + cv^2),
mu = ln(mean) - sigma^2 / 2), empirical (`values`, or a column of the trace `source`); all rounded to
integers and clipped to [min, max].

Trace replay (`workload.trace` set: a shipped name azure_conv / azure_code / splitwise_conv, or a CSV
path in the Azure format TIMESTAMP,ContextTokens,GeneratedTokens or the vidur format
num_prefill_tokens,num_decode_tokens[,arrived_at]):
    * rows `trace_offset` .. `trace_offset + num_requests`; a trace with fewer rows gives fewer
      requests and a `WorkloadWarning` (no wrap-around, so no request is replayed twice);
    * prompt / output lengths come from the trace; `workload.prompt` / `workload.output` are ignored;
    * a trace with times replays them (whatever open-loop `arrival` says: `workload.trace=PATH`
      replaces the whole workload, and `rate: null` is then allowed with any arrival), relative to
      the first replayed row. `time_scale`, if set, multiplies every inter-arrival time; otherwise,
      if `rate` is set (not null), the times are rescaled so that the recorded mean rate
      (n - 1) / span equals `rate`. Native speed: `rate: null` (or `time_scale: 1.0`);
    * the seed (`trace_arrivals: redraw`, the default) re-draws the arrival times; the rows, hence
      every prompt / output length and its order, stay those of the window. The recorded times
      define a rate curve, piecewise constant over every `trace_rate_rows` rows (the cumulative
      count Lambda(t) interpolated linearly through (t[jK], jK)); the replay is a Poisson process
      on that curve (arrival i at Lambda^-1(E_1 + ... + E_i), E ~ Exp(1), the first at 0; beyond
      the last row at the window's mean rate). K = 32 keeps the recorded burstiness: on the full
      azure_conv trace the variance / mean of arrivals counted per 0.1 / 1 / 10 / 60 s is
      1.06 / 1.39 / 4.0 / 20.6 recorded and 1.05 / 1.47 / 4.6 / 19 re-drawn (seeds 1, 2; K = 8
      over-disperses short windows, 1.88 per second, K = 64 flattens the minutes). Seeds therefore give distinct replicates of the same
      traffic. The window itself is chosen by `trace_offset` (conf/splits gives each run of a
      train / val / test split its own rows, so splits stay disjoint whatever the seed).
      `trace_arrivals: recorded` replays the recorded times exactly (every seed identical);
      `trace_arrivals: process` ignores them: the rows (lengths, blocks, order) arrive by the configured
      open-loop `arrival` process at `rate` (e.g. deterministic spacing, so no two prefills overlap);
    * a numeric TIMESTAMP column is seconds (Azure traces export seconds since the start); any
      other TIMESTAMP is parsed as date-times;
    * a trace without times (vidur without arrived_at) gets arrivals from the configured process
      (arrival=trace falls back to Poisson at `rate`, with a warning); `time_scale` is then unused;
    * closed loop uses only the trace's lengths. To draw trace lengths under another arrival
      process, use empirical length distributions with `source` instead of `trace`.

Prefixes: with `prefix_groups` G > 0 every request gets a key drawn uniformly from [0, G) and
prefix_len = floor(prefix_frac * prompt). A request whose prefix_len would be 0 gets key -1 (no
prefix), so key == -1 exactly when prefix_len == 0. (If the config ever grows a `prefix_zipf`
exponent s >= 0, keys follow P(k) ~ 1 / (k + 1)^s instead; s = 0 is uniform.)

Prefix blocks: a request may carry the hashes of its prompt's blocks (`block_tokens` tokens each, the last
one partial): two requests whose first k hashes agree share the KV of their first k blocks. They live
as two flat arrays (`block_ids`, `block_off`: request i's hashes are block_ids[block_off[i]:block_off[i+1]]).
A Mooncake trace brings them (every replay mode keeps the row order, so a conversation's turns stay in
order); `workload.chat.sessions` S > 0 draws them: each request is the next turn of one of S sessions
(uniform), its prompt = the session's system prompt (`system_tokens`, one of `system_prompts`) + the
conversation so far (earlier prompts and outputs) + a new message of the drawn prompt length; a turn
that would pass `max_context` starts a new conversation. A block's hash is shared exactly when its whole
content and everything before it is: complete system-prompt blocks across every session with that
system prompt, complete blocks of a conversation across its turns; a prompt's last, partial block is
its own.

Classes and predictions (`workload.classes`, `workload.predictor`; classes.py and prediction.py are the
reference): every request gets a class code `cls` and, with a predictor, a predicted output length, both drawn
from `labels_rng`, a generator apart from the traffic's, so one class and no predictor leave every array above
as it was. class_by=trace merges the classes' traces on their timestamps (`_merged_traces`); class_by=label reads
the replayed rows' `class` column (traces.py) and maps each label onto the class of that name.

Phases (`workload.phases` non-empty): the workload is the concatenation of the phases, each with its
own `num_requests` and prompt / output lengths; `workload.num_requests` is ignored (the total is the
sum). Open loop: a phase's `rate` (default: `workload.rate`) drives the configured arrival process,
whose times continue from the previous phase's last arrival (steps / diurnal schedules are in
absolute time; `rate` per phase is not allowed with steps; onoff restarts with an on-period at each
boundary). Closed loop: a phase's `concurrency` (default: `workload.concurrency`) fills the
`concurrency` array for its requests, so the cap shifts at the boundary; per-phase `rate` is unused.
Phases cannot be combined with `workload.trace` (use empirical lengths with `source` per phase).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
from pdgym.envs.sim.arrivals import ARRIVALS, LOOP_MODES, redraw, steps_schedule
from pdgym.envs.sim.arrivals import arrivals as draw_arrivals
from pdgym.envs.sim.classes import assign_classes, label_classes
from pdgym.envs.sim.config import LengthConfig, WorkloadConfig
from pdgym.envs.sim.notices import PdgymWarning, held_warnings
from pdgym.envs.sim.prediction import predict_lengths
from pdgym.envs.sim.traces import COLUMN_ALIASES, SHIPPED_TRACES, read_lengths, read_trace
from pdgym.envs.sim.validation import ConfigError, check, check_choice, check_positive

__all__ = ["Workload", "WorkloadWarning", "make_workload", "sample_lengths"]


class WorkloadWarning(PdgymWarning):
    """The workload differs from what the config literally asked for (e.g. a short trace)."""


@dataclass
class Workload:
    """All requests of one run as parallel arrays (struct of arrays), in release order."""

    prompt: np.ndarray  # int64 [n] prompt tokens (>= 1)
    output: np.ndarray  # int64 [n] output tokens (>= 1); hidden from policies by the simulator
    arrival: np.ndarray | None  # float64 [n] seconds, non-decreasing; None for closed loop
    prefix_key: np.ndarray  # int64 [n], -1 = no shared prefix
    prefix_len: np.ndarray  # int64 [n], prompt tokens covered by the prefix (0 if none), <= prompt
    concurrency: np.ndarray | None  # int64 [n] closed loop: requests allowed in flight at release of i
    think_s: float = 0.0  # closed loop: delay from a completion to the next release
    block_ids: np.ndarray | None = None  # int64 flat prefix-block hashes (None: no block data)
    block_off: np.ndarray | None = None  # int64 [n + 1] offsets into block_ids
    block_tokens: int = 0  # tokens per block (0: no block data)
    cls: np.ndarray | None = None  # int8 [n] class code (classes.py); None: every request class 0
    predicted: np.ndarray | None = None  # int64 [n] predicted output length (prediction.py); None: no predictor

    def __post_init__(self) -> None:
        self.prompt = np.asarray(self.prompt, dtype=np.int64)
        self.output = np.asarray(self.output, dtype=np.int64)
        self.prefix_key = np.asarray(self.prefix_key, dtype=np.int64)
        self.prefix_len = np.asarray(self.prefix_len, dtype=np.int64)
        if self.arrival is not None:
            self.arrival = np.asarray(self.arrival, dtype=np.float64)
        if self.concurrency is not None:
            self.concurrency = np.asarray(self.concurrency, dtype=np.int64)
        self.think_s = float(self.think_s)

    @property
    def n(self) -> int:
        return int(self.prompt.shape[0])


# --------------------------------------------------------------------------- lengths
def sample_lengths(cfg: LengthConfig, n: int, rng: np.random.Generator, key: str = "length") -> np.ndarray:
    """Draw `n` int64 token lengths from `cfg`, rounded and clipped to [cfg.min, cfg.max].

    `key` names the config entry in error messages (e.g. "workload.prompt"). For `empirical` with a
    `source` trace and no `column`, the column is the last part of `key` when it is prompt / output.
    """
    cfg.validate(key)
    n = int(n)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    d = cfg.dist
    if d == "fixed":
        x = np.full(n, float(cfg.mean))
    elif d == "uniform":
        x = rng.integers(int(cfg.low), int(cfg.high), size=n, endpoint=True).astype(np.float64)
    elif d == "geometric":
        x = rng.geometric(1.0 / float(cfg.mean), size=n).astype(np.float64)
    elif d == "gamma":
        cv2 = float(cfg.cv) ** 2
        x = rng.gamma(1.0 / cv2, float(cfg.mean) * cv2, size=n)
    elif d == "lognormal":
        s2 = math.log1p(float(cfg.cv) ** 2)
        x = rng.lognormal(math.log(float(cfg.mean)) - s2 / 2.0, math.sqrt(s2), size=n)
    else:  # empirical
        pool = _empirical_pool(cfg, key)
        x = pool[rng.integers(0, pool.shape[0], size=n)]
    return np.clip(np.rint(x), int(cfg.min), int(cfg.max)).astype(np.int64)


def _empirical_pool(cfg: LengthConfig, key: str) -> np.ndarray:
    if cfg.values:
        try:
            pool = np.asarray(cfg.values, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ConfigError(f"{key}.values: must be a list of numbers, got {cfg.values!r}") from None
        check(pool.size > 0 and bool(np.isfinite(pool).all()), f"{key}.values",
              "must be a non-empty list of finite numbers")
        return pool
    col = cfg.column
    if col is None:
        col = key.rsplit(".", 1)[-1]
        check(col in ("prompt", "output"), f"{key}.column",
              "empirical with `source` needs column: prompt or output")
    check(col in COLUMN_ALIASES, f"{key}.column", f"got {col!r}; allowed: {', '.join(COLUMN_ALIASES)}")
    return read_lengths(cfg.source, col, f"{key}.source").astype(np.float64)


# --------------------------------------------------------------------------- prefixes
def _prefixes(cfg: WorkloadConfig, prompt: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = prompt.shape[0]
    groups = int(cfg.prefix_groups)
    check(groups >= 0, "workload.prefix_groups", f"got {cfg.prefix_groups}; must be >= 0")
    if groups == 0:  # no prefixes: every key -1, a read-only stride-0 view (8 MB not written at 1M requests)
        return np.broadcast_to(np.int64(-1), (n,)), np.zeros(n, dtype=np.int64)
    zipf = float(getattr(cfg, "prefix_zipf", 0.0) or 0.0)
    check(zipf >= 0, "workload.prefix_zipf", f"got {zipf}; must be >= 0")
    if zipf == 0.0:
        key = rng.integers(0, groups, size=n, dtype=np.int64)
    else:
        w = np.cumsum(1.0 / np.arange(1, groups + 1, dtype=np.float64) ** zipf)
        key = np.minimum(np.searchsorted(w / w[-1], rng.random(n), side="right"), groups - 1).astype(np.int64)
    plen = np.floor(float(cfg.prefix_frac) * prompt).astype(np.int64)
    plen = np.minimum(plen, prompt)
    key[plen == 0] = -1
    return key, plen


def _chat_blocks(cfg: WorkloadConfig, new: np.ndarray, output: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Multi-turn sessions (module docstring): prompts grown by their conversation, and their block hashes."""
    ch = cfg.chat
    n, bt, sys_t = new.shape[0], int(ch.block_tokens), int(ch.system_tokens)
    session = rng.integers(0, int(ch.sessions), size=n)
    hist = [0] * int(ch.sessions)  # tokens of the conversation so far (after the system prompt)
    conv = list(range(int(ch.sessions)))  # conversation id of each session (a restart takes a new one)
    next_conv = int(ch.sessions)
    ids: dict[tuple, int] = {}
    prompt = np.empty(n, dtype=np.int64)
    flat: list[int] = []
    off = [0]
    for i in range(n):
        s = int(session[i])
        m = int(new[i])
        if sys_t + hist[s] + m > int(ch.max_context) and hist[s] > 0:
            hist[s] = 0
            conv[s] = next_conv
            next_conv += 1
        length = sys_t + hist[s] + m
        prompt[i] = length
        sp = s % int(ch.system_prompts)
        full = length // bt
        for k in range(-(-length // bt)):
            if k < full:
                key = ("s", sp, k) if (k + 1) * bt <= sys_t else ("c", conv[s], sp, k)
            else:
                key = ("p", i)  # the partial last block: its content is this prompt's alone
            flat.append(ids.setdefault(key, len(ids)))
        off.append(len(flat))
        hist[s] += m + int(output[i])
    return prompt, np.asarray(flat, dtype=np.int64), np.asarray(off, dtype=np.int64)


# --------------------------------------------------------------------------- workload
LABELS_SEED = 0x51C1A55  # classes and predictions of a workload built without the engine's generator for them


def make_workload(cfg: WorkloadConfig, rng: np.random.Generator,
                  labels_rng: np.random.Generator | None = None) -> Workload:
    """Build the requests of one run from `cfg`, drawing the traffic from `rng` and the requests' classes and
    length predictions from `labels_rng` (spawned apart, so neither changes the traffic; None: a fixed seed)."""
    rng = np.random.default_rng(rng)  # a Generator passes through unchanged
    check_choice(cfg.arrival, "workload.arrival", ARRIVALS.names() + LOOP_MODES)
    cfg.validate("workload")
    with held_warnings():  # a workload refused says so alone, without the warnings of its first steps
        if cfg.classes and cfg.class_by == "trace":
            wl, cls = _merged_traces(cfg, rng)
        else:
            wl, cls = _traffic(cfg, rng), None
    class_rng, pred_rng = np.random.default_rng(LABELS_SEED if labels_rng is None else labels_rng).spawn(2)
    if cls is None and wl.cls is None:  # class_by=label: the trace's rows brought theirs
        cls = assign_classes(cfg.classes, cfg.class_by, wl.prompt, class_rng)
    if cls is not None:
        wl.cls = cls
    wl.predicted = predict_lengths(cfg.predictor, wl.output, pred_rng)
    return wl


def _traffic(cfg: WorkloadConfig, rng: np.random.Generator) -> Workload:
    """The arrivals and lengths of `cfg` (everything but the classes and predictions)."""
    if cfg.arrival == "trace":
        check(cfg.trace is not None, "workload.trace",
              "arrival=trace needs a trace: a CSV path or a shipped name: " + ", ".join(SHIPPED_TRACES))
    if cfg.trace is not None:
        check(not cfg.phases, "workload.phases",
              "cannot be combined with workload.trace; use phases[i].prompt/output with dist=empirical "
              "and source=<trace> instead")
        return _trace_workload(cfg, rng)

    closed = cfg.arrival == "closed"
    phases = list(cfg.phases or [])
    if cfg.arrival == "steps":
        steps_schedule(cfg, "workload")  # a bad schedule fails before any sampling
    if phases:
        segs = []
        for i, ph in enumerate(phases):
            pk = f"workload.phases[{i}]"
            check(int(ph.num_requests) >= 1, f"{pk}.num_requests", f"got {ph.num_requests}; must be >= 1")
            if ph.rate is not None:
                check_positive(ph.rate, f"{pk}.rate")
                check(cfg.arrival != "steps", f"{pk}.rate",
                      "not allowed with arrival=steps (the steps schedule sets the rate)")
            if ph.concurrency is not None:
                check(int(ph.concurrency) >= 1, f"{pk}.concurrency", f"got {ph.concurrency}; must be >= 1")
            segs.append((int(ph.num_requests), ph.prompt, ph.output,
                         ph.rate if ph.rate is not None else cfg.rate,
                         int(ph.concurrency if ph.concurrency is not None else cfg.concurrency), pk))
    else:
        segs = [(int(cfg.num_requests), cfg.prompt, cfg.output, cfg.rate, int(cfg.concurrency), "workload")]

    prompts, outputs, arrivals, concs = [], [], [], []
    t0 = 0.0
    for n, pcfg, ocfg, rate, conc, pk in segs:
        prompts.append(sample_lengths(pcfg, n, rng, key=f"{pk}.prompt"))
        outputs.append(sample_lengths(ocfg, n, rng, key=f"{pk}.output"))
        if closed:
            concs.append(np.full(n, conc, dtype=np.int64))
        else:
            rate_key = f"{pk}.rate" if pk != "workload" and rate is not None else "workload.rate"
            a = draw_arrivals(cfg.arrival, n, rate, t0, cfg, rate_key, rng)
            arrivals.append(a)
            t0 = float(a[-1])
    prompt = np.concatenate(prompts)
    output = np.concatenate(outputs)
    blocks = {}
    if cfg.chat.sessions > 0:  # drawn after everything else, so a run without chat draws what it always did
        prompt, ids, off = _chat_blocks(cfg, prompt, output, rng)
        check(int(prompt.max()) <= int(cfg.prompt.max) + int(cfg.chat.max_context), "workload.chat.max_context",
              "a turn grew past max_context")
        blocks = {"block_ids": ids, "block_off": off, "block_tokens": int(cfg.chat.block_tokens)}
    key, plen = _prefixes(cfg, prompt, rng)
    return Workload(prompt=prompt, output=output,
                    arrival=None if closed else np.concatenate(arrivals),
                    prefix_key=key, prefix_len=plen,
                    concurrency=np.concatenate(concs) if closed else None,
                    think_s=float(cfg.think_s) if closed else 0.0, **blocks)


def _merged_traces(cfg: WorkloadConfig, rng: np.random.Generator) -> tuple[Workload, np.ndarray]:
    """class_by=trace: each class's trace at its native speed (its first `num_requests` rows from
    `trace_offset`), merged on the timestamps, the first `num_requests` of the merge kept, each labelled by the
    class whose trace it came from; then rescaled to `rate` / `time_scale` as one trace replay would be."""
    parts = [_trace_workload(replace(cfg, trace=c.trace, rate=None, time_scale=None, classes=None), rng)
             for c in cfg.classes]
    for c, w in zip(cfg.classes, parts):
        check(w.arrival is not None, f"workload.classes[{cfg.classes.index(c)}].trace",
              f"{c.trace!r} has no arrival times to merge on; class_by=trace needs traces with times")
    arrival = np.concatenate([w.arrival for w in parts])
    order = np.argsort(arrival, kind="stable")[:int(cfg.num_requests)]
    cls = np.concatenate([np.full(w.n, i, dtype=np.int8) for i, w in enumerate(parts)])[order]
    arrival = arrival[order] - arrival[order[0]]
    n = order.shape[0]
    if cfg.time_scale is not None:
        arrival = arrival * float(cfg.time_scale)
    elif cfg.rate is not None and n >= 2 and arrival[-1] > 0:
        arrival = arrival * (((n - 1) / float(arrival[-1])) / float(cfg.rate))
    cat = {f: np.concatenate([getattr(w, f) for w in parts])[order] for f in ("prompt", "output", "prefix_key",
                                                                          "prefix_len")}
    return Workload(arrival=arrival, concurrency=None, **cat), cls


def _trace_workload(cfg: WorkloadConfig, rng: np.random.Generator) -> Workload:
    tr = read_trace(cfg.trace, "workload.trace")
    n_all = tr.prompt.shape[0]
    off = int(cfg.trace_offset)
    check(off < n_all, "workload.trace_offset", f"got {off}; the trace {cfg.trace!r} has {n_all} rows")
    want = int(cfg.num_requests)
    n = min(want, n_all - off)
    if n < want:
        warnings.warn(f"workload.num_requests: trace {cfg.trace!r} has only {n} rows from trace_offset {off}; "
                      f"replaying {n} requests instead of {want}", WorkloadWarning, stacklevel=3)
    prompt = tr.prompt[off:off + n].copy()
    output = tr.output[off:off + n].copy()
    if cfg.time_scale is not None:
        check_positive(cfg.time_scale, "workload.time_scale")
    closed = cfg.arrival == "closed"
    arrival = None
    if not closed and tr.times is not None and cfg.trace_arrivals != "process":
        recorded = tr.times[off:off + n] - tr.times[off]
        span = float(recorded[-1])
        arrival = recorded if cfg.trace_arrivals == "recorded" else redraw(recorded, int(cfg.trace_rate_rows), rng)
        if cfg.time_scale is not None:
            arrival = arrival * float(cfg.time_scale)
        elif cfg.rate is not None and n >= 2 and span > 0:
            arrival = arrival * (((n - 1) / span) / float(cfg.rate))
        elif cfg.rate is not None and n >= 2:
            warnings.warn(f"workload.rate: every replayed row of trace {cfg.trace!r} has the same time, so there is "
                          f"no span to rescale to {cfg.rate} requests/s; they all arrive at once (use arrival=poisson "
                          "with dist=empirical lengths from the trace for a rate)", WorkloadWarning, stacklevel=3)
    elif not closed:
        kind = cfg.arrival
        check(not (kind == "trace" and cfg.trace_arrivals == "process"), "workload.arrival",
              "trace_arrivals=process needs an open-loop arrival process (poisson, deterministic, ...), not trace")
        if kind == "trace":
            warnings.warn(f"workload.arrival: trace {cfg.trace!r} has no arrival times; using poisson arrivals "
                          f"at workload.rate={cfg.rate}", WorkloadWarning, stacklevel=3)
            kind = "poisson"
        elif cfg.time_scale is not None:
            warnings.warn(f"workload.time_scale: unused with arrival={kind} (it only scales a trace's own times)",
                          WorkloadWarning, stacklevel=3)
        arrival = draw_arrivals(kind, n, cfg.rate, 0.0, cfg, "workload.rate", rng)
    key, plen = _prefixes(cfg, prompt, rng)
    blocks = {}
    if tr.block_ids is not None:
        lo, hi = int(tr.block_off[off]), int(tr.block_off[off + n])
        blocks = {"block_ids": tr.block_ids[lo:hi].copy(), "block_off": tr.block_off[off:off + n + 1] - lo,
                  "block_tokens": tr.block_tokens}
    if cfg.classes and cfg.class_by == "label":
        check(tr.label_codes is not None, "workload.trace", f"{cfg.trace!r} has no class column; class_by=label "
              "maps each row's class label (a `class` column or JSON field) onto workload.classes")
        blocks["cls"] = label_classes(cfg.classes, tr.label_codes[off:off + n], tr.label_names)
    return Workload(prompt=prompt, output=output, arrival=arrival, prefix_key=key, prefix_len=plen,
                    concurrency=np.full(n, int(cfg.concurrency), dtype=np.int64) if closed else None,
                    think_s=float(cfg.think_s) if closed else 0.0, **blocks)
