"""`pdgym-sim`: run one scenario (or several policy sets head to head on the same traffic).

    pdgym-sim scenario=NAME seed=S workload.num_requests=N hydra.run.dir=DIR

writes DIR/metrics.json (DESIGN section 5 keys + num_requests), requests.csv, steps.csv
and plots (latency CDFs, per-instance time series; `trace=true` adds trace.json and
timeline.png: agents/run_views.py). With `compare=[...]` every policy set runs on the same
seeded traffic; the first set's files go to DIR, the others to DIR/compare/<label>/, and
compare.csv / the CDFs put them side by side.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig
from pdgym.agents import plots, run_views
from pdgym.agents.common import check_group_choices, one_line_errors, policy_spec, run_dir, sim_config_from, to_container
from pdgym.baselines import make_policies
from pdgym.envs.sim import simulate
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

SHOWN = ("ttft_mean", "ttft_p99", "tpot_mean", "tpot_p95", "throughput_tok_s", "rps", "imbalance_mean",
         "chunk_util_mean", "sched_queue_s", "device_queue_s", "finished", "rejected", "wall_time_s")


def policy_sets(cfg) -> list[tuple[str, dict]]:
    """(label, policy spec) for every set to run; the configured `policy` group fills gaps."""
    base = policy_spec(cfg)
    entries = to_container(cfg.get("compare")) or []
    if not entries:
        return [("configured", base)]
    out = []
    for i, e in enumerate(entries):
        e = dict(e)
        label = str(e.pop("label", f"set{i}"))
        spec = dict(base)
        spec.update(e)
        out.append((label, spec))
    return out


def metrics_table(rows: dict[str, dict], title: str) -> Table:
    """Metrics as rows, policy sets as columns (fits a terminal whatever the number of metrics)."""
    t = Table(title=title)
    t.add_column("metric")
    for label in rows:
        t.add_column(label, justify="right")
    for k in SHOWN:
        t.add_row(k, *[_fmt(m.get(k)) for m in rows.values()])
    return t


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.4g}"


@one_line_errors("pdgym-sim")
def run(cfg: DictConfig) -> dict:
    sim_cfg = sim_config_from(cfg)
    sets = [(label, make_policies(spec)) for label, spec in policy_sets(cfg)]  # validate all before running
    out = run_dir()
    results = {}
    for label, pols in tqdm(sets, desc="policy sets", disable=len(sets) == 1):
        results[label] = simulate(sim_cfg, pols, seed=int(cfg.seed))
    first = next(iter(results))
    for label, res in results.items():
        res.write(out if label == first else out / "compare" / label)
    rows = {label: res.metrics() for label, res in results.items()}
    if len(rows) > 1:
        import pandas as pd

        pd.DataFrame.from_dict(rows, orient="index").rename_axis("policy_set").to_csv(out / "compare.csv")
    if cfg.get("plots", True):
        run_views.write_latency_cdfs({k: r.requests for k, r in results.items()}, out)
        plots.decode_kv_spread({k: r.steps for k, r in results.items()}, out / "decode_kv_spread.png")
        for label, res in results.items():
            run_views.write_run_views(res, out if label == first else out / "compare" / label,
                                      title=f"{cfg.get('scenario_name', 'scenario')}, {label}, seed {cfg.seed}")
    scenario = cfg.get("scenario_name", "scenario")
    Console().print(metrics_table(rows, f"{scenario} (seed {cfg.seed})"))
    print(f"results in {out}")
    return rows


@hydra.main(version_base=None, config_path="pkg://pdgym.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    check_group_choices(sys.argv[1:], "pdgym-sim")
    _hydra_main()


if __name__ == "__main__":
    main()
