"""What pdgym-sim writes next to a run's metrics so a person can see the run (vidur-style outputs).

- latency_cdf.png / latency_cdf.csv: CDFs of TTFT, TPOT, end-to-end latency and scheduling
  delay of finished requests, policy sets overlaid (`compare=[...]`); the csv holds each
  metric's percentiles 0..100 per set.
- instance_timeseries.png (one per run directory): per-instance prefill tokens, decode batch,
  KV per DP unit, utilisation and barrier idle over time, from the step table.
- trace.json + timeline.png (with `trace=true`): every pass on every DP unit as a Chrome /
  Perfetto trace (agents/trace.py) and a static timeline of a few passes per pass kind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from pdgym.agents import plots
from pdgym.agents.trace import PassRecord, write_trace
from pdgym.envs.sim.metrics import atomic_path

PERCENTILES = np.append(np.arange(0, 101), 99.9)


def latency_table(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Percentiles (rows) of each latency metric (columns) per policy set; NaN where a set has no sample."""
    rows = []
    for label, req in tables.items():
        samples = plots.latency_samples(req)
        cols = {k: np.percentile(x, PERCENTILES) if len(x) else np.full(len(PERCENTILES), np.nan)
                for k, x in samples.items()}
        rows.append(pd.DataFrame({"policy_set": label, "percentile": PERCENTILES, **cols}))
    return pd.concat(rows, ignore_index=True).sort_values(["policy_set", "percentile"], kind="stable")


def by_class(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Each policy set's requests split by SLO class ("<set>/<class>") when a run has more than one class."""
    out = {}
    for label, req in tables.items():
        names = req["class"].cat.categories if "class" in req and hasattr(req["class"], "cat") else ()
        if len(names) <= 1:
            out[label] = req
            continue
        for name in names:
            out[f"{label}/{name}"] = req[req["class"] == name]
    return out


def write_latency_cdfs(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """latency_cdf.png and latency_cdf.csv in `out` (one curve per policy set, and per SLO class when there are
    several)."""
    tables = by_class(tables)
    with atomic_path(out / "latency_cdf.csv") as tmp:
        latency_table(tables).to_csv(tmp, index=False)
    with atomic_path(out / "latency_cdf.png") as tmp:
        plots.latency_cdfs(tables, tmp)
    return [out / "latency_cdf.csv", out / "latency_cdf.png"]


def write_run_views(result, out: Path, passes: list[PassRecord] | None = None, title: str = "") -> list[Path]:
    """One run's time series, and with `passes` (a PassRecorder's) its trace and timeline, in `out`.
    Every file is written under a temporary name and renamed when complete."""
    written = []
    steps = result.step_table()
    if len(steps):
        with atomic_path(out / "instance_timeseries.png") as tmp:
            plots.instance_timeseries(steps, tmp, title, result.requests)
        written.append(out / "instance_timeseries.png")
    if passes is not None:
        write_trace(out / "trace.json", passes, result.requests, meta={"title": title, "seed": result.seed})
        written.append(out / "trace.json")
        if passes:
            with atomic_path(out / "timeline.png") as tmp:
                plots.timeline(passes, tmp, title=title)
            written.append(out / "timeline.png")
    return written
