"""Chrome / Perfetto trace of a run: every pass on every DP unit, so the barrier idle can be seen.

A forward pass of an instance ends at a barrier across its DP units: the pass lasts as long
as its slowest unit, and every faster unit waits. The step table keeps one row per pass (its
`idle_frac`); this module keeps what a timeline needs, one `PassRecord` per pass with each
unit's busy seconds, and writes them in the Trace Event Format (JSON object form) that
ui.perfetto.dev and chrome://tracing load:

- one process per instance (pid; "prefill 0", "decode 0", ...), one thread per DP unit
  (tid = unit + 1) and one "pass" thread (tid 0) with the whole pass [t, t + dur];
- each pass is a complete ('X') slice per unit starting at the pass start and lasting the
  unit's busy time; the rest of the pass, until the barrier releases, is a gap: the barrier
  idle (`idle_slices=True` draws it as an explicit "barrier idle" slice instead);
- optionally each request's lifetime as nestable async slices (queued at the scheduler,
  prefill, decode) on a "requests" process, with its prefix-cache hit tokens;
- with prefix-block caches, a counter track per prefill instance: the blocks each DP unit's HBM
  cache holds at every pass start (its fill and its evictions over time).

Where the idle sits inside a pass is a drawing choice: the cost models aggregate the per-layer
waits of DP attention + EP MoE into one barrier per pass, so the gap is drawn at its end.
Times are microseconds (the format's unit); a run's t = 0 is ts = 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pdgym.envs.sim import SimResult, Simulator
from pdgym.envs.sim.metrics import atomic_path
from pdgym.envs.sim.observers import Observer, PassStart

if TYPE_CHECKING:  # pandas loads with a table (pdgym-sim imports this module; issue 46)
    import pandas as pd

KIND_ORDER = ("prefill", "decode", "colocated")


@dataclass(frozen=True, slots=True)
class PassRecord:
    """One pass of one instance: start `t` and length `dur` (s), the pass kind's name, the
    instance index, and per DP unit its busy seconds (<= dur; dur - busy is its barrier
    wait), prefill tokens and decode requests."""

    t: float
    dur: float
    kind: str
    inst: int
    busy: np.ndarray
    prefill_tokens: np.ndarray
    decode_reqs: np.ndarray
    cache_blocks: np.ndarray | None = None  # prefill with prefix-block caches: blocks each unit's HBM cache holds

    @property
    def idle(self) -> np.ndarray:
        """Seconds each unit waits at the barrier."""
        return self.dur - self.busy


class PassRecorder(Observer):
    """Collects one PassRecord per pass; `record` is what a simulator's pass-end hook calls."""

    def __init__(self):
        self.passes: list[PassRecord] = []

    def record(self, t: float, dur: float, kind: str, inst: int, busy: Sequence[float],
               prefill_tokens: Sequence[float] | None = None, decode_reqs: Sequence[float] | None = None,
               cache_blocks: Sequence[int] | None = None) -> None:
        """Keep one pass (the vectors are copied: the engine's arrays are live)."""
        busy = np.minimum(np.array(busy, dtype=float), dur)  # float noise must not push busy past the barrier
        zero = np.zeros(len(busy))
        pt = zero if prefill_tokens is None else np.array(prefill_tokens, dtype=float)
        dr = zero if decode_reqs is None else np.array(decode_reqs, dtype=float)
        cb = None if cache_blocks is None else np.array(cache_blocks, dtype=np.int64)
        self.passes.append(PassRecord(float(t), float(dur), str(kind), int(inst), busy, pt, dr, cb))

    def on_pass_start(self, sim, p: PassStart) -> None:
        """Observer hook: a pass starts with known duration and per-unit compute times."""
        kind = p.kind.name.lower()
        blocks = sim.prefill[p.inst].cache_blocks() if kind == "prefill" else None
        self.record(p.t, p.dur, kind, p.inst, busy_from_unit_times(p.dur, p.unit_time),
                    p.prefill_tokens, p.decode_reqs, blocks)


def simulate_traced(config, policies: dict | None = None, seed: int = 0) -> tuple[SimResult, list[PassRecord]]:
    """`simulate()` with a PassRecorder observing the run: the result and every pass."""
    sim = Simulator(config, policies, seed)
    rec = PassRecorder()
    sim.observe(rec)
    sim.run()
    return SimResult(sim), rec.passes


def busy_from_unit_times(dur: float, unit: np.ndarray) -> np.ndarray:
    """Per-unit busy seconds of a pass whose cost model gave per-unit compute times `unit`.

    The pass lasts fixed costs + max(unit) (+ communication every unit takes part in), so a
    unit waits max(unit) - unit at the barrier and is busy for the rest of the pass.
    """
    unit = np.asarray(unit, dtype=float)
    return dur - (unit.max() - unit) if unit.size else unit


def instance_keys(passes: Iterable[PassRecord]) -> dict[tuple[str, int], int]:
    """(kind, instance) -> pid, in a stable order: prefill instances, then decode, then colocated."""
    keys = {(p.kind, p.inst) for p in passes}
    order = sorted(keys, key=lambda k: (KIND_ORDER.index(k[0]) if k[0] in KIND_ORDER else len(KIND_ORDER), k))
    return {k: i + 1 for i, k in enumerate(order)}


def _ns(x: float) -> int:
    return round(x * 1e9)


def _us(x: float) -> float:
    """Seconds as microseconds at nanosecond resolution (what Perfetto keeps: llround(ts * 1000))."""
    return _ns(x) / 1000


def _span(t0: float, t1: float) -> tuple[float, float]:
    """(ts, dur) of [t0, t1] with the end rounded on its own, so slices that touch in seconds
    touch exactly in the trace and a slice inside a pass never pokes out of it."""
    a = _ns(t0)
    return a / 1000, (_ns(t1) - a) / 1000


def chrome_trace(passes: Sequence[PassRecord], requests: pd.DataFrame | None = None,
                 idle_slices: bool = False, meta: dict | None = None) -> dict:
    """The Trace Event Format object (`{"traceEvents": [...], ...}`) of a run's passes.

    `requests` (the run's request table) adds each request's lifetime as async slices.
    """
    pids = instance_keys(passes)
    units: dict[tuple[str, int], int] = {}
    for p in passes:
        units[(p.kind, p.inst)] = max(units.get((p.kind, p.inst), 0), len(p.busy))
    ev: list[dict] = []
    for (kind, inst), pid in pids.items():
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": f"{kind} {inst} (DP {units[(kind, inst)]})"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "pass (barrier)"}})
        for u in range(units[(kind, inst)]):
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": u + 1, "args": {"name": f"DP unit {u}"}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": u + 1, "args": {"sort_index": u + 1}})
    n_pass: dict[tuple[str, int], int] = {}
    for p in passes:
        key = (p.kind, p.inst)
        pid = pids[key]
        n = n_pass[key] = n_pass.get(key, -1) + 1
        ts, dur = _span(p.t, p.t + p.dur)
        idle = p.idle
        idle_frac = float(idle.mean() / p.dur) if p.dur > 0 and idle.size else 0.0
        ev.append({"ph": "X", "name": p.kind, "cat": "pass", "pid": pid, "tid": 0, "ts": ts, "dur": dur,
                   "args": {"pass": n, "kind": p.kind, "prefill_tokens": float(p.prefill_tokens.sum()),
                            "decode_requests": float(p.decode_reqs.sum()),
                            "idle_share_of_unit_time": round(idle_frac, 6)}})
        for u, (b, w, pt, dr) in enumerate(zip(p.busy.tolist(), idle.tolist(), p.prefill_tokens.tolist(),
                                               p.decode_reqs.tolist())):
            if b > 0:
                ev.append({"ph": "X", "name": p.kind, "cat": "pass", "pid": pid, "tid": u + 1, "ts": ts,
                           "dur": _span(p.t, p.t + b)[1], "args": {"pass": n, "prefill_tokens": pt,
                                                                   "decode_requests": dr, "idle_ms": round(w * 1e3, 6)}})
            if idle_slices and w > 0:
                its, idur = _span(p.t + b, p.t + p.dur)
                ev.append({"ph": "X", "name": "barrier idle", "cat": "idle", "pid": pid, "tid": u + 1,
                           "ts": its, "dur": idur, "args": {"pass": n, "idle_ms": round(w * 1e3, 6)}})
        if p.cache_blocks is not None:
            ev.append({"ph": "C", "name": "prefix cache blocks (HBM)", "pid": pid, "tid": 0, "ts": ts,
                       "args": {f"unit {u}": int(c) for u, c in enumerate(p.cache_blocks.tolist())}})
    if requests is not None and len(requests):
        ev.extend(request_events(requests, pid=len(pids) + 1))
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"source": "pdgym", "time_unit": "us", **(meta or {})}}


def request_events(requests: pd.DataFrame, pid: int) -> list[dict]:
    """Each request as a nestable async slice with its phases: scheduler (arrival to first
    dispatch), prefill (to the first token), decode (to the finish); rejected requests show
    as one 'rejected: REASON' slice."""
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "requests"}},
          {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    if "cached" not in requests:  # a table from before the prefix cache (or made by hand): no hits
        requests = requests.assign(cached=0)
    cols = ["id", "arrival", "dispatch", "first_token", "finish", "status", "reason", "prompt", "output", "cached"]
    for rid, arr, disp, first, fin, status, reason, prompt, out, hit in requests[cols].itertuples(index=False):
        if not np.isfinite(arr) or not np.isfinite(fin):
            continue
        name = f"request {rid}"
        common = {"cat": "request", "pid": pid, "tid": 0, "id": int(rid)}
        ev.append({"ph": "b", "name": name, "ts": _us(arr), **common,
                   "args": {"prompt": int(prompt), "output": int(out), "status": status, "prefix_hit": int(hit)}})
        if status != "finished":
            ev.append({"ph": "b", "name": f"rejected: {reason}", "ts": _us(arr), **common})
            ev.append({"ph": "e", "name": f"rejected: {reason}", "ts": _us(fin), **common})
        else:
            marks = [("scheduler", arr, disp), ("prefill", disp, first), ("decode", first, fin)]
            for phase, a, b in marks:
                if np.isfinite(a) and np.isfinite(b) and b > a:
                    ev.append({"ph": "b", "name": phase, "ts": _us(a), **common})
                    ev.append({"ph": "e", "name": phase, "ts": _us(b), **common})
        ev.append({"ph": "e", "name": name, "ts": _us(fin), **common})
    return ev


def write_trace(path: str | Path, passes: Sequence[PassRecord], requests: pd.DataFrame | None = None,
                idle_slices: bool = False, meta: dict | None = None) -> Path:
    """Write the trace JSON atomically (temp file + rename)."""
    # json.dumps (C encoder) then one write: json.dump to a file runs the pure-Python encoder, ~10x slower
    text = json.dumps(chrome_trace(passes, requests, idle_slices, meta), separators=(",", ":"))
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)
