"""`pdgym-table DIR [metric ...]`: one table from a multirun's jobs (pdgym-sim, pdgym-eval or pdgym-train).

    pdgym-sim -m policy/decode=least_kv,br0 seed=0,1,2 scenario=decode_tier_n8 hydra.sweep.dir=DIR
    pdgym-eval -m policy=least_kv,br0 scenario=decode_tier_n8 workload.num_requests=300 hydra.sweep.dir=DIR
    pdgym-train -m agent.kwargs.learning_rate=1e-4,3e-4 seed=0,1 hydra.sweep.dir=DIR    (metric: objective)
    pdgym-table DIR [metric ...]

Every complete job (DIR/*/metrics.json; a job without it was interrupted and is skipped, counted)
is grouped by its overrides minus `seed`; per group and metric: mean, 95% percentile-bootstrap
interval of the mean over seeds (inside [min, max] of the values, so never below zero for a
non-negative metric), the number of jobs and of seeds. A job's values are pdgym-sim's metric, each of a
pdgym-eval job's seeds (its per_seed values: one job of 3 seeds is 3 values, not their mean alone) or pdgym-train's
best validation value (`objective`) and final validation metrics. A metric the jobs lack is one line, exit 2, and
so is a null, NaN or infinite value of a job or of one of its seeds (a mean over the values left would pass for one
over all); no table is written then. Writes DIR/sweep_table.csv and prints the table.

A stall is never hidden (agents/evaluation/stalls.py): a group holding a pdgym-eval job with a stopped-early seed
has no mean for any metric but the counts and times (its cells say STALLED (k/n jobs); the csv's `stalled` column
counts those jobs), since a mean over the other seeds' jobs would pass for one over all; pdgym-table then exits 1
once the table is written and printed, unless `--allow-stalled` is given.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pandas as pd
from pdgym.agents.errors import fail
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import atomic_path
from pdgym.envs.sim.validation import did_you_mean

STALLED = "stalled"  # a job row's count of stopped-early seeds (pdgym-eval's stopped_early); a group row's of such jobs
PER_SEED = "per_seed"  # a pdgym-eval job row's {metric: its seeds' values}: the group's interval is over those seeds
ALLOW = "--allow-stalled"
TABLE = "sweep_table.csv"  # what pdgym-table writes into DIR
DEFAULT_METRICS = ("ttft_mean", "ttft_p99", "tpot_mean", "throughput_tok_s", "imbalance_mean")


MAX_OVERRIDES_BYTES = safe_files.MiB  # a job's .hydra/overrides.yaml: a list of key=value strings
MAX_METRICS_BYTES = 16 * safe_files.MiB  # a job's metrics.json: pdgym-sim's summary, a few kB


def read_job(job: Path) -> tuple[list[str], dict]:
    """A job's overrides and metrics, read bounded inside the job folder: the overrides a YAML list of strings,
    the metrics a JSON object (its numbers are checked where a metric is chosen); anything else one line."""
    path = job / ".hydra" / "overrides.yaml"
    overrides = safe_files.read_yaml(path, MAX_OVERRIDES_BYTES, "DIR", within=job)
    overrides = [] if overrides is None else overrides
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"DIR: {path} holds {str(overrides)[:60]}, not the list of key=value strings Hydra writes")
    path = job / "metrics.json"
    metrics = safe_files.read_json(path, MAX_METRICS_BYTES, "DIR", within=job)
    if not isinstance(metrics, dict):
        raise ConfigError(f"DIR: {path} holds a JSON {type(metrics).__name__}, not the object pdgym-sim writes")
    return overrides, flat(metrics)


def flat(doc: dict) -> dict:
    """A job's metrics as {metric: value}: pdgym-sim's as written; pdgym-eval's {metrics: {m: {mean, ...}}} as each
    mean; pdgym-train's {objective, val_final: {m: value}} as the objective and the final validation values."""
    inner = doc.get("metrics")
    if isinstance(inner, dict) and inner and all(isinstance(v, dict) and "mean" in v for v in inner.values()):
        stopped = doc.get("stopped_early")
        per_seed = doc.get("per_seed")
        seeds = list(per_seed.values()) if isinstance(per_seed, dict) and per_seed else []
        values = {k: [m.get(k) for m in seeds] for k in inner} if all(isinstance(m, dict) for m in seeds) else {}
        return {**{k: v["mean"] for k, v in inner.items()}, STALLED: len(stopped) if isinstance(stopped, dict) else 0,
                PER_SEED: values}
    if isinstance(doc.get("val_final"), dict):
        return {"objective": doc.get("objective"), **doc["val_final"]}
    return doc


def read_jobs(sweep_dir: Path) -> tuple[list[tuple[Path, dict]], int]:
    """([(the job's metrics.json, its row: group, seed and metrics)] of every complete job, jobs skipped as
    incomplete)."""
    jobs, skipped = [], 0
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not os.path.lexists(job / ".hydra" / "overrides.yaml"):
            continue
        if not os.path.lexists(job / "metrics.json"):
            skipped += 1
            continue
        overrides, metrics = read_job(job)
        seed = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "seed"), "0")
        group = " ".join(o for o in overrides if o.split("=", 1)[0] not in ("seed", "hydra.run.dir")) or "(defaults)"
        jobs.append((job / "metrics.json", {"group": group, "seed": seed, **metrics}))
    return jobs, skipped


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def check_metrics(jobs: list[tuple[Path, dict]], metrics: list[str]) -> None:
    """Every chosen metric in every job, and each of a pdgym-eval job's seeds, a finite number: a job without it,
    with a string or a list there, or (a job with no stalled seed) with null, NaN or an infinity, is one line naming
    its file, since a mean over the values that are left would pass for one over all (the interval skips them). A
    stalled job's values may be missing: its group's cells say STALLED, with no mean."""
    for path, row in jobs:
        stalled = bool(row.get(STALLED))
        for m in metrics:
            v = row.get(m)
            if m not in row or isinstance(v, bool) or not isinstance(v, (int, float, type(None))):
                got = "has none" if m not in row else f"holds {str(v)[:40]!r}, not a number"
                raise ConfigError(f"metric: {path} {got} for {m}")
            per = (row.get(PER_SEED) or {}).get(m) or []
            for x in per:  # a pdgym-eval job's seeds, which the interval reads
                if isinstance(x, bool) or not isinstance(x, (int, float, type(None))):
                    raise ConfigError(f"metric: {path} per_seed holds {str(x)[:40]!r} for {m}, not a number")
            if stalled:
                continue
            bad = next(((f" in per_seed (seed #{i})", x) for i, x in enumerate(per) if not _finite(x)), None)
            if bad is None and not _finite(v):
                bad = ("", v)
            if bad is not None:
                where, x = bad
                what = "null (missing)" if x is None else repr(x)
                raise ConfigError(f"metric: {path} holds {what} for {m}{where}; a table needs a finite value from "
                                  "every job and seed (a mean over the others "
                                  "would pass for one over all): rerun that job, or leave the metric out")


def table(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Per group: seeds, stalled (jobs with a stopped-early seed) and per metric mean and interval; a group with a
    stalled job has NaN for every metric but the counts and times (stalls.KEPT)."""
    from pdgym.agents.evaluation import stalls
    from pdgym.agents.evaluation.stats import interval

    out = []
    for group, sub in runs.groupby("group", sort=False):
        n_stalled = int((sub[STALLED].fillna(0) > 0).sum()) if STALLED in sub else 0
        seed_values = sub[PER_SEED].tolist() if PER_SEED in sub else [None] * len(sub)
        row = {"group": group, "jobs": len(sub), STALLED: n_stalled}
        for m in metrics:  # a pdgym-eval job counts each of its seeds (their mean alone hid their spread)
            values = [x for v, per in zip(sub[m].tolist(), seed_values)
                      for x in (per[m] if isinstance(per, dict) and isinstance(per.get(m), list) else [v])]
            row.setdefault("seeds", len(values))
            iv = interval(values)
            if n_stalled and m not in stalls.KEPT:
                iv = dict(iv, mean=math.nan, ci_low=math.nan, ci_high=math.nan)
            row.update({m: iv["mean"], f"{m}_ci_low": iv["ci_low"], f"{m}_ci_high": iv["ci_high"]})
        out.append(row)
    return pd.DataFrame(out)


def shown(out: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """The printed table: a stalled group's cells say STALLED (k/n jobs) instead of a NaN."""
    from pdgym.agents.evaluation import stalls

    view = out.astype(object)
    for i, r in out.iterrows():
        if r[STALLED]:
            for m in metrics:
                if m not in stalls.KEPT:
                    view.loc[i, [m, f"{m}_ci_low", f"{m}_ci_high"]] = [f"{stalls.MARK} ({r[STALLED]}/{r['jobs']} jobs)",
                                                                         "-", "-"]
    return view


def main(argv: list[str] | None = None) -> pd.DataFrame:
    app = "pdgym-table"
    argv = sys.argv[1:] if argv is None else list(argv)
    allow = ALLOW in argv
    argv = [a for a in argv if a != ALLOW]
    if argv and argv[0] in ("-h", "--help"):
        print((__doc__ or "").strip())
        raise SystemExit(0)
    if not argv:
        fail(app, f"DIR: missing; usage: {app} DIR [metric ...] [{ALLOW}] (DIR: a multirun's hydra.sweep.dir; "
                  "--help says more)")
    sweep_dir = Path(argv[0])
    if not sweep_dir.is_dir():
        fail(app, f"DIR: {str(sweep_dir)!r} is not a folder (give a multirun's hydra.sweep.dir)")
    target = sweep_dir / TABLE
    # a folder (or another non-file) there is refused; a link is replaced by the atomic write, never written through
    if os.path.lexists(target) and not target.is_symlink() and not target.is_file():
        fail(app, f"DIR: {target} is not a regular file, where {app} writes its table; move it away")
    try:
        jobs, skipped = read_jobs(sweep_dir)
    except ConfigError as exc:
        fail(app, str(exc))
    runs = pd.DataFrame([row for _, row in jobs])
    if runs.empty:
        fail(app, f"DIR: no complete job in {str(sweep_dir)!r} (no */metrics.json beside */.hydra/overrides.yaml)")
    bad = [a for a in argv[1:] if a.startswith("-")]
    if bad:
        fail(app, f"option: unknown {bad[0]!r}; allowed: {ALLOW}")
    metrics = argv[1:] or [m for m in (*DEFAULT_METRICS, "objective") if m in runs]
    if not metrics:
        fail(app, f"metric: none of {', '.join(DEFAULT_METRICS)} in these jobs; give one of: "
             f"{', '.join(c for c in runs if c not in ('group', 'seed', PER_SEED))}")
    unknown = [m for m in metrics if m not in runs or m in (STALLED, PER_SEED)]
    if unknown:
        allowed = [c for c in runs if c not in ("group", "seed", STALLED, PER_SEED)]
        fail(app, f"metric: unknown {unknown}; {did_you_mean(unknown[0], allowed)}allowed: {', '.join(allowed)}")
    try:
        check_metrics(jobs, metrics)
    except ConfigError as exc:
        fail(app, str(exc))
    out = table(runs, metrics)
    try:
        with atomic_path(target) as tmp:
            out.to_csv(tmp, index=False)
    except ConfigError as exc:
        fail(app, str(exc))
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(shown(out, metrics).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    note = f"; {skipped} incomplete job(s) skipped" if skipped else ""
    few = int(out.seeds.max()) <= 2
    how = ("*_ci_low / *_ci_high: with 2 seeds or fewer, their [min, max] (an interval needs more seeds)" if few
           else "*_ci_low / *_ci_high: 95% percentile-bootstrap interval of the mean over seeds")
    print(f"{len(runs)} jobs in {len(out)} groups{note}; {how}; table in {target}")
    stalled = [str(g) for g, n in zip(out.group, out[STALLED]) if n]
    if stalled and not allow:
        print(f"{app}: {len(stalled)} group(s) hold a job with a stopped-early seed ({', '.join(stalled[:4])}"
              f"{' and more' if len(stalled) > 4 else ''}); their cells say STALLED with no mean; {ALLOW} accepts them",
              file=sys.stderr)
        raise SystemExit(1)
    return out


if __name__ == "__main__":
    main()
