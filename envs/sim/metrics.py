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

if TYPE_CHECKING:  # pandas loads when a table is built (0.37 s of import a Gymnasium user need not pay)
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
    return float(np.percentile(x, q)) if len(x) else math.nan


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


class SimResult:
    """What one run produced: `requests` and `steps` DataFrames and `summary()`."""

    def __init__(self, sim):
        self.config = sim.cfg
        self.seed = sim.seed
        self.stalled = sim.stalled
        self.tokens_out = sim.tokens_out
        self.dropped_signals = sim.dropped_signals
        self.wall_time_s = sim.wall_time_s
        self.slo = sim.cfg.slo
        self.classes = sim.classes  # the run's SLO classes (classes.py); requests' `class` names them
        self.requests = self._request_table(sim.req, share=sim.finished_run, names=sim.classes.names)
        self.steps = sim.steps.frame()
        self.cache = self._cache_counts(sim)
        self._summary: dict | None = None

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
    def _request_table(req: R.RequestTable, share: bool = False, names: tuple[str, ...] = ("default",)) -> pd.DataFrame:
        """One row per request. `share`: a finished run's arrays are final, so the table's plain columns
        are views of them rather than copies (at 1M requests ~110 MB not held twice); a table taken
        mid-run copies, so it stays what it was when taken."""
        out = req.output
        first = req.first_token
        finished = req.state == R.FINISHED
        multi = finished & (out > 1)  # finished with at least two tokens: tpot and itl are defined
        # The derived columns are computed in place, no full-length temporaries (each 8 MB at 1M requests).
        tpot = req.finish - first
        np.divide(tpot, out - 1, out=tpot, where=multi)
        tpot[~multi] = np.nan
        e2e = req.finish - req.arrival
        e2e[~finished] = np.nan
        extra = {} if req.predicted is None else {"predicted_output": req.predicted}
        import pandas as pd

        frame = pd.DataFrame({
            "id": np.arange(req.n),
            "arrival": req.arrival,
            "prompt": req.prompt,
            "output": out,
            "status": _names(R.STATE_NAMES, req.state),
            "reason": _names(R.REASONS, req.reason),
            "ttft": first - req.arrival,
            "tpot": tpot,
            "itl": np.where(multi, req.itl_max, np.nan),
            "e2e": e2e,
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
        }, copy=not share)
        # the class as a categorical: one byte a request (its codes), written as the class names
        frame.insert(1, "class", pd.Categorical.from_codes(req.cls.astype(np.int8, copy=not share), categories=names))
        return frame

    def summary(self) -> dict:
        """The DESIGN section 5 metrics, exactly those keys, as plain floats / ints (NaN if undefined)."""
        if self._summary is not None:
            return dict(self._summary)
        r = self.requests
        # Finished rows column by column, when a metric reads them (a view when every request finished): a
        # boolean frame index (r[mask]) copied every column of the table, ~170 MB at 1M requests.
        is_fin = (r.status == "finished").to_numpy()
        n_fin = int(is_fin.sum())

        def fin(col: str) -> np.ndarray:
            x = r[col].to_numpy()
            return x if n_fin == len(x) else x[is_fin]

        resolved_end = float(np.nanmax(r.finish.to_numpy())) if len(r) else 0.0  # arrays: no NaN-filled copy
        start = float(np.nanmin(r.arrival.to_numpy())) if len(r) else 0.0
        span = max(resolved_end - start, 1e-12)
        ttft = fin("ttft")
        tpot_all = fin("tpot")
        t = self.classes
        if t.single:
            good = (ttft <= t.ttft_s[0]) & (np.isnan(tpot_all) | (tpot_all <= t.tpot_s[0]))
        else:
            codes = r["class"].cat.codes.to_numpy()
            good = np.logical_and(*attainment(np.ones(n_fin, dtype=bool), ttft, tpot_all,
                                              codes if n_fin == len(codes) else codes[is_fin], t))
        tpot = tpot_all[~np.isnan(tpot_all)]  # a copy: the mean first, then p95 may reorder it in place
        tpot_mean = _mean(tpot)
        tpot_p95 = float(np.percentile(tpot, 95, overwrite_input=True)) if len(tpot) else math.nan
        del tpot, tpot_all  # before the step metrics' temporaries
        s = self.steps
        kind = s.kind.to_numpy()
        is_dec = kind == PassKind.DECODE
        if not is_dec.any():
            is_dec = kind == PassKind.COLOCATED
        is_pre = (kind != PassKind.DECODE) & (s.util.to_numpy() > 0)  # prefill and colocated passes with prefill work
        dur = s.dur.to_numpy()
        out = {
            "ttft_mean": _mean(ttft),
            "ttft_p50": _pct(ttft, 50),
            "ttft_p99": _pct(ttft, 99),
            "tpot_mean": tpot_mean,
            "tpot_p95": tpot_p95,
            "e2e_p99": _pct(fin("e2e"), 99),
            "throughput_tok_s": float(fin("output").sum()) / span,
            "total_tok_s": float(fin("output").sum() + fin("prompt").sum()) / span,
            "rps": n_fin / span,
            "goodput_rps": float(good.sum()) / span,
            "goodput_per_gpu": float(good.sum()) / span / self.config.cluster.gpus,
            "imbalance_mean": _imbalance(s.kv_max.to_numpy(), s.kv_min.to_numpy(), is_dec),
            "barrier_idle_frac": float(np.dot(s.idle_frac, dur) / dur.sum()) if dur.sum() > 0 else 0.0,
            "chunk_util_mean": _mean(s.util.to_numpy()[is_pre]),
            "sched_queue_s": _mean(fin("sched_queue")),
            "device_queue_s": _mean(fin("device_queue")),
            "finished": n_fin,
            "rejected": int((r.status == "rejected").sum()),
            "sim_time_s": span,
            "wall_time_s": float(self.wall_time_s),
            "prefix_hit_ratio": float(r.cached.sum()) / max(float(r.prompt.sum()), 1.0),
            **self.cache,
            **slo_metrics(is_fin, r.ttft.to_numpy(), r.tpot.to_numpy(), r["class"].cat.codes.to_numpy(), t,
                          r.preemptions.to_numpy(), (r.reason == "slo").to_numpy(),
                          r.predicted_output.to_numpy() if "predicted_output" in r else None, r.output.to_numpy()),
        }
        self._summary = out
        return dict(out)

    def metrics(self) -> dict:
        """summary() plus num_requests: what metrics.json holds."""
        m = self.summary()
        m["num_requests"] = len(self.requests)
        return m

    def write(self, out_dir: str | Path, tables: str = "csv") -> Path:
        """Write requests.<fmt>, steps.<fmt>, then metrics.json (the mark of a complete result) into `out_dir`.

        Each file goes to a temporary name and is renamed, so an interrupted write leaves no
        complete-looking file; metrics.json last, so it never stands beside a missing table.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").unlink(missing_ok=True)  # a previous run's mark would outlive a failed write
        for name, table in (("requests", self.requests), ("steps", self.step_table())):
            write_table(table, out / name, tables)
        write_json(out / "metrics.json", self.metrics())
        return out

    def step_table(self) -> pd.DataFrame:
        """The step table as steps.csv holds it: pass kinds by name (prefill, decode, colocated), the integer
        columns 64-bit. In memory `steps.kind` stays a PassKind value, cheap to compare, and `inst` / `reqs`
        keep the step log's narrow types (steplog.row_dtype)."""
        s = self.steps
        wide = {c: s[c].astype(np.int64) for c in ("inst", "reqs") if s[c].dtype.kind == "i"}
        return s.assign(kind=s.kind.map(PASS_KIND_NAMES), **wide)


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
