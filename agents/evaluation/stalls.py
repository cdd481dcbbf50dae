"""Runs that stopped early (an agent's decision budget spent, the wall budget, the simulated-time horizon) are
never hidden behind a mean. A stopped run rejected what it left unresolved, so its latencies, throughput and
imbalance are those of the requests it chose to finish: averaging them with (or instead of) a finished run's
would rank a router that drops its hardest traffic above one that serves it. So:

- a policy with any stopped-early seed has no headline value for such metrics (NaN, shown as STALLED with the
  count of stopped seeds); the counts and times (finished, rejected, sim_time_s, wall_time_s) stay, so the
  rejected count is still reported;
- pdgym-eval and pdgym-leaderboard exit 1 with one line naming the stopped runs, after writing their files,
  unless `allow_stalled=true` accepts them (the tables still say STALLED);
- in a pdgym-eval multirun (`-m`) a job with a stopped run says so in its line and the sweep goes on (one stalled
  job would otherwise cancel the jobs after it); once every job has run, the sweep exits 1 with one line naming
  the jobs (`sweep_check`, from each job's metrics.json), unless those jobs had allow_stalled=true. pdgym-table
  marks such a job's group STALLED (agents/apps/sweep_table.py).

Small functions; evaluate.py, the leaderboard and sweep_table call them.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

KEPT = ("finished", "rejected", "sim_time_s", "wall_time_s")  # honest whatever the run left unresolved
MARK = "STALLED"
ALLOW = "allow_stalled=true accepts stopped-early runs (the tables still mark them STALLED)"


def n_stopped(stopped) -> int:
    """How many of the per-seed `stopped` reasons are non-empty ('' or None: the seed ran to its end)."""
    return sum(1 for s in stopped if isinstance(s, str) and s)


def honest(metric: str, interval: dict, n_stop: int) -> dict:
    """`interval` (mean, std, ci_low, ci_high, n) with `stalled`: the number of stopped seeds; when some seed
    stopped, every value but the counts and times (KEPT) is NaN: no mean over the requests a stall left."""
    out = dict(interval, stalled=int(n_stop))
    if n_stop and metric not in KEPT:
        out.update(mean=math.nan, std=math.nan, ci_low=math.nan, ci_high=math.nan)
    return out


def mask_runs(runs: pd.DataFrame, metrics) -> pd.DataFrame:
    """The per-seed runs table with every metric but KEPT set to NaN for every seed of a (scenario, policy)
    that has a stopped-early seed: it ranks last, compares to nothing and has no mean (a mean over its other
    seeds would hide the stall as well)."""
    if not len(runs) or "stopped" not in runs:
        return runs
    bad = runs.stopped.fillna("").astype(str) != ""
    if not bad.any():
        return runs
    groups = set(zip(runs.scenario[bad], runs.policy[bad]))
    rows = [(s, p) in groups for s, p in zip(runs.scenario, runs.policy)]
    cols = [m for m in metrics if m in runs and m not in KEPT]
    out = runs.copy()
    out.loc[rows, cols] = math.nan
    return out


def cell(n_stop: int, n_seeds: int) -> str:
    """The table cell of a value a stall took away."""
    return f"{MARK} ({n_stop}/{n_seeds} seeds)"


def _shown(items: list[str]) -> str:
    return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")


def in_multirun() -> bool:
    """Whether this process runs a job of a Hydra multirun (a launcher's worker included)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def refuse(app: str, what: list[str], allow: bool, sweep_checked: bool = False) -> None:
    """Exit 1 with one line when runs stopped early (`what`: 'POLICY seed S' items) and `allow` is false.
    `sweep_checked`: the app checks its multirun's jobs at the end (`sweep_check`), so a job of one prints its
    line and returns, and the sweep's other jobs still run."""
    if not what or allow:
        return
    line = f"{app}: {len(what)} run(s) stopped early ({_shown(what)}); their rows are marked {MARK} with no mean; {ALLOW}"
    if sweep_checked and in_multirun():
        print(f"{line}; the sweep goes on and exits 1 at its end", file=sys.stderr, flush=True)
        return
    print(line, file=sys.stderr)
    raise SystemExit(1)


def sweep_check(app: str, jobs: list[Path]) -> None:
    """After a multirun: exit 1 with one line naming its jobs (`jobs`: their folders) whose metrics.json holds a
    stopped-early seed (`stopped_early`) without allow_stalled=true."""
    from pdgym.agents.errors import fail
    from pdgym.envs.sim import safe_files
    from pdgym.envs.sim.config import ConfigError

    bad = []
    for job in sorted(Path(j) for j in jobs):
        if not (job / "metrics.json").is_file():
            continue
        try:
            doc = safe_files.read_json(job / "metrics.json", 64 * safe_files.MiB, "hydra.sweep.dir", within=job)
        except ConfigError as exc:  # a file this sweep wrote, replaced meanwhile: one line, as any bad file
            fail(app, str(exc))
        if isinstance(doc, dict) and doc.get("stopped_early") and not doc.get("allow_stalled"):
            bad.append(job.name)
    if bad:
        print(f"{app}: {len(bad)} job(s) of the sweep had runs that stopped early ({_shown(bad)}); their rows are "
              f"marked {MARK} with no mean; {ALLOW}", file=sys.stderr)
        raise SystemExit(1)
