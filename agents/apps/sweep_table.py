"""`python -m pdgym.agents.apps.sweep_table DIR`: one table from a pdgym-sim multirun's jobs.

    pdgym-sim -m policy/decode=least_kv,br0 seed=0,1,2 scenario=decode_tier_n8 hydra.sweep.dir=DIR
    python -m pdgym.agents.apps.sweep_table DIR [metric ...]

Every complete job (DIR/*/metrics.json; a job without it was interrupted and is skipped, counted)
is grouped by its overrides minus `seed`; per group and metric: mean, 95% percentile-bootstrap
interval of the mean over seeds (inside [min, max] of the values, so never below zero for a
non-negative metric) and the number of seeds. Writes DIR/sweep_table.csv and prints the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import yaml
from pdgym.agents.common import fail
from pdgym.envs.sim.metrics import atomic_path

DEFAULT_METRICS = ("ttft_mean", "ttft_p99", "tpot_mean", "throughput_tok_s", "imbalance_mean")


def collect(sweep_dir: Path) -> tuple[pd.DataFrame, int]:
    """(one row per complete job: its group, seed and metrics; jobs skipped as incomplete)."""
    rows, skipped = [], 0
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        overrides_file = job / ".hydra" / "overrides.yaml"
        if not overrides_file.exists():
            continue
        if not (job / "metrics.json").exists():
            skipped += 1
            continue
        overrides = yaml.safe_load(overrides_file.read_text()) or []
        seed = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "seed"), "0")
        group = " ".join(o for o in overrides if o.split("=", 1)[0] not in ("seed", "hydra.run.dir")) or "(defaults)"
        rows.append({"group": group, "seed": seed, **json.loads((job / "metrics.json").read_text())})
    return pd.DataFrame(rows), skipped


def table(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    from pdgym.agents.evaluation.evaluate import interval

    out = []
    for group, sub in runs.groupby("group", sort=False):
        row = {"group": group, "seeds": len(sub)}
        for m in metrics:
            iv = interval(sub[m].tolist())
            row.update({m: iv["mean"], f"{m}_ci_low": iv["ci_low"], f"{m}_ci_high": iv["ci_high"]})
        out.append(row)
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    app = "pdgym-sweep-table"
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print((__doc__ or "").strip())
        raise SystemExit(0 if argv else 2)
    sweep_dir = Path(argv[0])
    if not sweep_dir.is_dir():
        fail(app, f"DIR: {str(sweep_dir)!r} is not a folder (give a multirun's hydra.sweep.dir)")
    runs, skipped = collect(sweep_dir)
    if runs.empty:
        fail(app, f"DIR: no complete job in {str(sweep_dir)!r} (no */metrics.json beside */.hydra/overrides.yaml)")
    metrics = argv[1:] or [m for m in DEFAULT_METRICS if m in runs]
    unknown = [m for m in metrics if m not in runs]
    if unknown:
        fail(app, f"metric: unknown {unknown}; allowed: {', '.join(c for c in runs if c not in ('group', 'seed'))}")
    out = table(runs, metrics)
    with atomic_path(sweep_dir / "sweep_table.csv") as tmp:
        out.to_csv(tmp, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(out.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    note = f"; {skipped} incomplete job(s) skipped" if skipped else ""
    print(f"{len(runs)} jobs in {len(out)} groups{note}; table in {sweep_dir / 'sweep_table.csv'}")
    return out


if __name__ == "__main__":
    main()
