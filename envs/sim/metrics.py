"""Per-request and per-step tables of a finished run, and the named summary metrics (DESIGN section 5).

Definitions (every table and leaderboard uses these names):
- ttft: first output token minus arrival (the first token comes out of the prefill pass).
- tpot: (finish - first token) / (output - 1), for outputs longer than one token.
- itl: the longest gap between two consecutive output tokens of the request (its worst stall).
- e2e: finish minus arrival.
- imbalance_mean: mean over decode steps of max minus min worker KV tokens (colocated runs:
  over iterations, across DP units; 0 with one unit).
- barrier_idle_frac: duration-weighted mean over all passes of the fraction of DP-unit time
  spent waiting at the barrier for the slowest unit.
- chunk_util_mean: mean over passes with prefill work of prefill tokens / (DP units x chunk).
- sched_queue_s / device_queue_s: mean over finished requests of the time buffered at the
  scheduler / queued on a prefill device before the first pass.
- throughput_tok_s, total_tok_s, rps, goodput_rps: per second of makespan (first arrival to
  last resolution); goodput counts finished requests meeting both SLOs (of their class).
- goodput_per_gpu: goodput_rps / the cluster's GPUs as configured (ClusterConfig.gpus: count x
  max(dp x tp, ep) per instance kind), so clusters of different sizes compare per GPU.
- prefix_hit_ratio: prompt tokens served by prefix-cache hits / all prompt tokens (token-weighted;
  a hit is min(block_tokens x longest cached prefix, prompt - 1)); 0 without a cache.
- recomputed_tokens: prompt tokens computed although one cluster-wide unbounded cache, replayed in
  request order, would have served them (per request max(0, ideal hit - hit), summed): the
  redundant prefill a cache-aware router or a larger cache could remove.
- cache_evictions: blocks evicted from the prefill units' HBM prefix caches.
- slo_attainment and the other SLO keys (per class, weighted, preemptions, early rejections, the predictor's
  Kendall tau): slo.py. A request meets the SLO of its own class (requests.csv `class`); with one class, the
  scenario's `slo`. requests.csv also holds `predicted_output` when the workload has a predictor.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import requests as R
from .events import PassKind
from .prefix_cache import sequential_hit_tokens
from .safe_files import atomic_path  # noqa: F401 -- the one atomic writer, used here and by the apps
from .slo import SLO_KEYS, attainment, slo_metrics
from .validation import ConfigError, check_choice

if TYPE_CHECKING:  # pandas loads when a frame is asked for (a plain run and its summary() never need it)
    import pandas as pd

PREFIX_KEYS = ("prefix_hit_ratio", "recomputed_tokens", "cache_evictions")  # prefix-cache metrics
PASS_KIND_NAMES = {int(k): k.name.lower() for k in PassKind}  # how steps.csv spells the kind column
TABLE_FORMATS = ("csv", "parquet")  # `tables`: how requests / steps tables are written
SUMMARY_KEYS = (
    "ttft_mean", "ttft_p50", "ttft_p99", "tpot_mean", "tpot_p95", "e2e_p99", "throughput_tok_s",
    "total_tok_s", "rps", "goodput_rps", "goodput_per_gpu", "imbalance_mean", "barrier_idle_frac", "chunk_util_mean",
    "sched_queue_s", "device_queue_s", "finished", "rejected", "sim_time_s", "wall_time_s",
) + PREFIX_KEYS + SLO_KEYS


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if len(x) else math.nan


def _pct(x: np.ndarray, q: float) -> float:
    """The q-th percentile, NaN without values; reorders `x` in place (callers pass arrays they own)."""
    return float(np.percentile(x, q, overwrite_input=True)) if len(x) else math.nan


def _names(names: tuple[str, ...], codes: np.ndarray):
    """The string column of `codes`: the names as pandas stores strings (object, or pandas 3's str dtype), taken
    by code. An object array of the names first cost 8 bytes a row more at the peak, then a conversion."""
    import pandas as pd

    return pd.Series(np.asarray(names, dtype=object)).array.take(codes)


def _imbalance(kv_max: np.ndarray, kv_min: np.ndarray, rows: np.ndarray) -> float:
    """imbalance_mean over the selected passes, the difference built in place (two step-length arrays live, not three)."""
    if not rows.any():
        return 0.0
    gap = kv_max[rows]
    np.subtract(gap, kv_min[rows], out=gap)
    return _mean(gap)


def _snapshot(req: R.RequestTable) -> R.RequestTable:
    """A copy of a running table's arrays: what the result reads stays what it was when taken."""
    snap = copy.copy(req)
    for k, v in vars(req).items():
        if isinstance(v, np.ndarray):
            setattr(snap, k, v.copy())
    return snap


def _tpot(req: R.RequestTable, multi: np.ndarray) -> np.ndarray:
    """(finish - first token) / (output - 1) where `multi` (finished with >= 2 tokens), else NaN; in place."""
    tpot = req.finish - req.first_token
    np.divide(tpot, req.output - 1, out=tpot, where=multi)
    tpot[~multi] = np.nan
    return tpot


def _e2e(req: R.RequestTable, finished: np.ndarray) -> np.ndarray:
    e2e = req.finish - req.arrival
    e2e[~finished] = np.nan
    return e2e


class SimResult:
    """What one run produced: `requests` and `steps` DataFrames and `summary()`.

    summary() reads the run's NumPy arrays (the request table and the step log's columns) and never loads pandas;
    the `requests` / `steps` frames are built on first use. A finished run's arrays are final, so the frames and
    the summary read them in place; a result taken mid-run (an env's summary) copies them when taken."""

    def __init__(self, sim):
        self.config = sim.cfg
        self.seed = sim.seed
        self.stalled = sim.stalled
        self.tokens_out = sim.tokens_out
        self.dropped_signals = sim.dropped_signals
        self.wall_time_s = sim.wall_time_s
        self.slo = sim.cfg.slo
        self.classes = sim.classes  # the run's SLO classes (classes.py); requests' `class` names them
        self._share = bool(sim.finished_run)
        self._req = sim.req if self._share else _snapshot(sim.req)
        self._step_cols = sim.steps.columns()  # never written again (steplog.StepLog.columns)
        self._requests: pd.DataFrame | None = None
        self._steps: pd.DataFrame | None = None
        self.cache = self._cache_counts(sim)
        self._summary: dict | None = None

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request (built on first use)."""
        if self._requests is None:
            self._requests = self._request_table(self._req, share=True, names=self.classes.names)
        return self._requests

    @property
    def steps(self) -> pd.DataFrame:
        """One row per pass (steplog.COLUMNS; built on first use, sharing the step log's columns)."""
        if self._steps is None:
            if "kind" not in self._step_cols:
                raise RuntimeError("this run kept no step table (Simulator(step_log=False)): only its summary()")
            import pandas as pd

            self._steps = pd.DataFrame(self._step_cols, copy=False)
        return self._steps

    def reason_count(self, reasons: tuple[str, ...]) -> int:
        """Requests whose `reason` is one of `reasons` (names in requests.REASONS), read from the arrays."""
        return int(np.isin(self._req.reason, [R.reason_code(r) for r in reasons]).sum())

    @property
    def num_requests(self) -> int:
        return int(self._req.n)

    @staticmethod
    def _cache_counts(sim) -> dict:
        """recomputed_tokens and cache_evictions (module docstring), from the run's block caches."""
        req = sim.req
        out = {"recomputed_tokens": 0, "cache_evictions": 0}
        if req.block_ids is None:
            return out
        ideal = sequential_hit_tokens(req.block_ids, req.block_off, req.prompt, sim.block_tokens)
        out["recomputed_tokens"] = int(np.maximum(ideal - req.cached, 0).sum())
        out["cache_evictions"] = int(sum(c.hbm.evictions for p in sim.prefill for c in (p.bcaches or ())))
        return out

    @staticmethod
    def _request_columns(req: R.RequestTable, share: bool = False, names: tuple[str, ...] = ("default",)) -> dict:
        """The request table's columns in order (requests.csv's): NumPy arrays, and (names, codes) for the three
        named columns (class, status, reason). `share`: the arrays are final (a finished run's, or a result's
        snapshot), so plain columns are the run's arrays themselves, not copies (at 1M requests ~110 MB not held
        twice). Read by the frame (`_request_table`) and by the CSV writer, which needs no pandas."""
        out = req.output
        first = req.first_token
        finished = req.state == R.FINISHED
        multi = finished & (out > 1)  # finished with at least two tokens: tpot and itl are defined
        # The derived columns are computed in place, no full-length temporaries (each 8 MB at 1M requests).
        extra = {} if req.predicted is None else {"predicted_output": req.predicted}
        return {
            "id": np.arange(req.n),
            # the class as a categorical in the frame: one byte a request (its codes), written as the class names
            "class": (names, req.cls.astype(np.int8, copy=not share)),
            "arrival": req.arrival,
            "prompt": req.prompt,
            "output": out,
            "status": (R.STATE_NAMES, req.state),
            "reason": (R.REASONS, req.reason),
            "ttft": first - req.arrival,
            "tpot": _tpot(req, multi),
            "itl": np.where(multi, req.itl_max, np.nan),
            "e2e": _e2e(req, finished),
            "sched_queue": req.sched_wait,
            "device_queue": req.device_wait,
            "dispatch": req.dispatch,
            "first_token": first,
            "finish": req.finish,
            "prefill_inst": req.prefill_inst,
            "prefill_dp": req.prefill_dp,
            "decode_inst": req.decode_inst,
            "worker": req.worker,
            "cached": req.cached,
            "preemptions": req.preemptions,
            **extra,
        }

    @staticmethod
    def _request_table(req: R.RequestTable, share: bool = False, names: tuple[str, ...] = ("default",)) -> pd.DataFrame:
        """One row per request (`_request_columns` as a DataFrame)."""
        import pandas as pd

        cols = SimResult._request_columns(req, share, names)
        cls_names, cls = cols.pop("class")
        for k in ("status", "reason"):
            cols[k] = _names(*cols[k])
        frame = pd.DataFrame(cols, copy=not share)
        frame.insert(1, "class", pd.Categorical.from_codes(cls, categories=cls_names))
        return frame

    def summary(self) -> dict:
        """The DESIGN section 5 metrics, exactly those keys, as plain floats / ints (NaN if undefined). Computed
        from the run's arrays with the `requests` columns' definitions (_request_table), no frame built."""
        if self._summary is not None:
            return dict(self._summary)
        req = self._req
        n = int(req.n)
        is_fin = req.state == R.FINISHED
        n_fin = int(is_fin.sum())

        def fin(x: np.ndarray) -> np.ndarray:  # the finished rows (a view when every request finished)
            return x if n_fin == len(x) else x[is_fin]

        resolved_end = float(np.nanmax(req.finish)) if n else 0.0
        start = float(np.nanmin(req.arrival)) if n else 0.0
        span = max(resolved_end - start, 1e-12)
        # Each full-length temporary is dropped once read (at 1M requests each is 8 MB at the summary's peak):
        # the SLO keys first, while TTFT and TPOT are whole; percentiles then reorder the arrays this method owns.
        tpot_all = _tpot(req, is_fin & (req.output > 1))  # first: its divisor is a full-length temporary too
        ttft_all = req.first_token - req.arrival
        codes = req.cls.astype(np.int8, copy=False)
        t = self.classes
        slo = slo_metrics(is_fin, ttft_all, tpot_all, codes, t, req.preemptions, req.reason == R.REASONS.index("slo"),
                          req.predicted, req.output)
        ttft = fin(ttft_all)
        tpot_fin = fin(tpot_all)
        del ttft_all, tpot_all
        if t.single:
            good = (ttft <= t.ttft_s[0]) & (np.isnan(tpot_fin) | (tpot_fin <= t.tpot_s[0]))
        else:
            good = np.logical_and(*attainment(np.ones(n_fin, dtype=bool), ttft, tpot_fin, fin(codes), t))
        n_good = float(good.sum())
        del good
        tpot = tpot_fin[~np.isnan(tpot_fin)]  # a copy: the mean first, then p95 may reorder it in place
        del tpot_fin
        tpot_mean = _mean(tpot)
        tpot_p95 = _pct(tpot, 95)
        del tpot
        ttft_mean = _mean(ttft)  # before the percentiles reorder it
        ttft_p50 = _pct(ttft, 50)
        ttft_p99 = _pct(ttft, 99)
        del ttft
        e2e = fin(_e2e(req, is_fin))
        e2e_p99 = _pct(e2e, 99)
        del e2e
        s = self._step_cols
        dur = s["dur"]
        if "kind" in s:  # the full step log
            kind = s["kind"]
            is_dec = kind == PassKind.DECODE
            if not is_dec.any():
                is_dec = kind == PassKind.COLOCATED
            imbalance = _imbalance(s["kv_max"], s["kv_min"], is_dec)
            del is_dec
            pre_util = s["util"][(kind != PassKind.DECODE) & (s["util"] > 0)]  # passes with prefill work
        else:  # steplog.SummaryLog: the same selections, taken as the rows came
            gap = s["dec_gap"] if len(s["dec_gap"]) else s["coloc_gap"]
            imbalance = _mean(gap) if len(gap) else 0.0
            pre_util = s["pre_util"]
        out_fin = fin(req.output)
        out = {
            "ttft_mean": ttft_mean,
            "ttft_p50": ttft_p50,
            "ttft_p99": ttft_p99,
            "tpot_mean": tpot_mean,
            "tpot_p95": tpot_p95,
            "e2e_p99": e2e_p99,
            "throughput_tok_s": float(out_fin.sum()) / span,
            "total_tok_s": float(out_fin.sum() + fin(req.prompt).sum()) / span,
            "rps": n_fin / span,
            "goodput_rps": n_good / span,
            "goodput_per_gpu": n_good / span / self.config.cluster.gpus,
            "imbalance_mean": imbalance,
            "barrier_idle_frac": float(np.dot(s["idle_frac"], dur) / dur.sum()) if dur.sum() > 0 else 0.0,
            "chunk_util_mean": _mean(pre_util),
            "sched_queue_s": _mean(fin(req.sched_wait)),
            "device_queue_s": _mean(fin(req.device_wait)),
            "finished": n_fin,
            "rejected": int((req.state == R.REJECTED).sum()),
            "sim_time_s": span,
            "wall_time_s": float(self.wall_time_s),
            "prefix_hit_ratio": float(req.cached.sum()) / max(float(req.prompt.sum()), 1.0),
            **self.cache,
            **slo,
        }
        self._summary = out
        return dict(out)

    def metrics(self) -> dict:
        """summary() plus num_requests: what metrics.json holds."""
        m = self.summary()
        m["num_requests"] = self.num_requests
        return m

    def write(self, out_dir: str | Path, tables: str = "csv") -> Path:
        """Write requests.<fmt>, steps.<fmt>, then metrics.json (the mark of a complete result) into `out_dir`.

        Each file goes to a temporary name and is renamed, so an interrupted write leaves no
        complete-looking file; metrics.json last, so it never stands beside a missing table. CSV tables are
        written from the arrays (`write_csv`: pandas' bytes, without importing pandas); parquet through pandas.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").unlink(missing_ok=True)  # a previous run's mark would outlive a failed write
        if tables == "csv":
            req = self._request_columns(self._req, share=True, names=self.classes.names)
            for name in ("class", "status", "reason"):
                req[name] = _taken(*req[name])
            write_csv(req, out / "requests.csv")
            write_csv(self._step_columns(), out / "steps.csv")
        else:
            for name, table in (("requests", self.requests), ("steps", self.step_table())):
                write_table(table, out / name, tables)
        write_json(out / "metrics.json", self.metrics())
        return out

    def _step_columns(self) -> dict[str, np.ndarray]:
        """The step table's columns as steps.csv holds them (`step_table`), without pandas."""
        if "kind" not in self._step_cols:
            raise RuntimeError("this run kept no step table (Simulator(step_log=False)): only its summary()")
        cols = dict(self._step_cols)
        cols["kind"] = _taken(tuple(PASS_KIND_NAMES.get(k, "") for k in range(max(PASS_KIND_NAMES) + 1)),
                              cols["kind"])
        for c in ("inst", "reqs"):
            if cols[c].dtype.kind == "i":
                cols[c] = cols[c].astype(np.int64)
        return cols

    def step_table(self) -> pd.DataFrame:
        """The step table as steps.csv holds it: pass kinds by name (prefill, decode, colocated), the integer
        columns 64-bit. In memory `steps.kind` stays a PassKind value, cheap to compare, and `inst` / `reqs`
        keep the step log's narrow types (steplog.row_dtype)."""
        s = self.steps
        wide = {c: s[c].astype(np.int64) for c in ("inst", "reqs") if s[c].dtype.kind == "i"}
        return s.assign(kind=s.kind.map(PASS_KIND_NAMES), **wide)


def _taken(names: tuple[str, ...], codes: np.ndarray) -> np.ndarray:
    """The names of `codes` as an object array (a CSV column)."""
    return np.asarray(names, dtype=object)[codes]


CSV_CHUNK = 100_000  # cells formatted at a time (pandas' own chunk: 100,000 // columns rows), a few MB of strings


def write_csv(columns: dict[str, np.ndarray], path: Path) -> Path:
    """`columns` (name -> equal-length arrays) to the CSV file `path`, atomically, byte for byte what pandas'
    `DataFrame(columns).to_csv(path, index=False)` writes (tests/test_table_writer.py), without importing pandas
    (0.3 s of pdgym-sim, issue 46): pandas formats a float column with NumPy's `astype(str)` and NaN as the empty
    string, every other value with `str`, then hands the rows to the csv module's writer (minimal quoting, the
    platform's line end); this does the same, a chunk of rows at a time (pandas' chunk size)."""
    import csv
    import os

    n = len(next(iter(columns.values()))) if columns else 0
    rows = max(CSV_CHUNK // max(len(columns), 1), 1)
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator=os.linesep)
        writer.writerow(list(columns))
        for lo in range(0, n, rows):
            writer.writerows(zip(*(_csv_strings(c[lo:lo + rows]) for c in columns.values())))
    return path


def _csv_strings(col: np.ndarray):
    """One column's cells as pandas' to_csv writes them (write_csv)."""
    if col.dtype.kind == "f":
        out = col.astype(str).astype(object)
        out[np.isnan(col)] = ""
        return out
    if col.dtype.kind == "O":
        return col
    return col.tolist()


def json_safe(obj):
    """NaN/inf become null, numpy scalars become Python numbers, so the file is strict JSON."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    return obj


def check_table_format(fmt, key: str = "tables") -> str:
    """`csv` or `parquet`; parquet needs pyarrow (the `parquet` extra): one-line error without it."""
    check_choice(fmt, key, TABLE_FORMATS)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigError(f"{key}: parquet needs pyarrow, which is not installed; "
                              "pip install 'pdgym[parquet]'") from None
    return fmt


def write_table(frame: pd.DataFrame, stem: Path, fmt: str = "csv") -> Path:
    """`frame` to `stem`.csv or `stem`.parquet (columnar, typed, ~5x smaller and faster to write), atomically."""
    path = stem.with_name(f"{stem.name}.{fmt}")
    with atomic_path(path) as tmp:
        if fmt == "parquet":
            frame.to_parquet(tmp, index=False, engine="pyarrow")
        else:
            frame.to_csv(tmp, index=False)
    return path


def write_json(path: str | Path, data) -> None:
    """Write atomically (temp file + rename) so no half-written result is ever left behind."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(json_safe(data), indent=2, sort_keys=False) + "\n")
