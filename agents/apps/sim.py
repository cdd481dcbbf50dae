"""`pdgym-sim`: run one scenario (or several policy sets head to head on the same traffic).

    pdgym-sim scenario=NAME seed=S workload.num_requests=N hydra.run.dir=DIR

writes DIR/requests.csv, steps.csv (`tables=parquet`: .parquet), plots (latency CDFs, per-instance time series;
`trace=true` adds trace.json and timeline.png: agents/run_views.py) and, last, metrics.json
(DESIGN section 5 keys + num_requests): tables and metrics go to a temporary name and are
renamed, so an interrupted run leaves no metrics.json and no complete-looking table. With
`compare=[...]` every policy set runs on the same seeded traffic; the first set's files go
to DIR, the others to DIR/compare/<label>/ (labels: letters, digits, `_ - .`), and
compare.csv / the CDFs put them side by side. A set may also name the queue discipline it runs under
(`queue: edf` or `queue: {order: ltr, starve_s: 2}`, envs/sim/ordering.py) and `oracle: true` (a hindsight set:
true output lengths exposed to it alone; its column is headed `(hindsight)`). With several SLO classes the table
adds the SLO rows and each class's attainment and TTFT p99.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig
from pdgym.agents.common import check_label, inside, policy_spec, run_dir, sim_config_from, to_container
from pdgym.agents.front_door import hydra_cli
from pdgym.agents.trace import simulate_traced, write_trace
from pdgym.baselines import make_policies
from pdgym.envs.sim import Simulator, safe_files, simulate
from pdgym.envs.sim.config import ConfigError, check, check_seed
from pdgym.envs.sim.metrics import PREFIX_KEYS, atomic_path, check_table_format
from pdgym.envs.sim.points import POINTS
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

SHOWN = ("ttft_mean", "ttft_p99", "tpot_mean", "tpot_p95", "throughput_tok_s", "rps", "imbalance_mean",
         "chunk_util_mean", "sched_queue_s", "device_queue_s", "finished", "rejected", "wall_time_s")
SLO_SHOWN = ("slo_attainment", "goodput_rps", "early_rejections", "preemptions", "predictor_kendall_tau")
CLASS_SHOWN = ("slo_attainment", "ttft_p99")  # per class (envs/sim/slo.py's PER_CLASS keys)
SET_KEYS = ("queue", "oracle")  # what a compare entry may set beside the decision points: the run's, per set


def policy_sets(cfg) -> list[tuple[str, dict]]:
    """(label, policy spec) for every set to run; the configured `policy` group fills gaps. A spec may hold
    `queue` / `oracle` (SET_KEYS): that set's own simulator settings (set_config).

    Labels become folder names (DIR/compare/<label>): validated, and unique.
    """
    base = policy_spec(cfg)
    entries = to_container(cfg.get("compare")) or []
    check(isinstance(entries, list), "compare", f"got {entries!r}; must be a list of {{label: ..., prefill: ...}}")
    if not entries:
        return [("configured", base)]
    out = []
    for i, e in enumerate(entries):
        check(isinstance(e, dict), f"compare[{i}]", f"got {e!r}; must be a mapping {{label: ..., prefill: ...}}")
        e = dict(e)
        label = check_label(e.pop("label", f"set{i}"), f"compare[{i}].label")
        check(label not in [lb for lb, _ in out], f"compare[{i}].label",
              f"duplicate label {label!r}; every policy set needs its own")
        unknown = set(e) - set(POINTS) - set(SET_KEYS)
        check(not unknown, f"compare[{i}]", f"unknown keys {sorted(unknown)}; allowed: label, {', '.join(POINTS)}, "
              f"{', '.join(SET_KEYS)}")
        spec = dict(base)
        spec.update(e)
        out.append((label, spec))
    return out


def set_config(sim_cfg, spec: dict, i: int | None):
    """(the simulator config of one compare set: `sim_cfg` with the set's `queue` / `oracle` over it, the policy
    spec without them). `queue: NAME` is `queue: {order: NAME}`; a bad value names compare[i]."""
    from pdgym.envs.scenario import merge_sim_config

    spec = dict(spec)
    own = {k: spec.pop(k) for k in SET_KEYS if k in spec}
    if not own:
        return sim_cfg, spec
    where = f"compare[{i}]"
    if isinstance(own.get("queue"), str):
        own["queue"] = {"order": own["queue"]}
    check(isinstance(own.get("queue", {}), dict), f"{where}.queue",
          f"got {own.get('queue')!r}; must be an order name (queue: edf) or {{order: ..., starve_s: ...}}")
    check(isinstance(own.get("oracle", False), bool), f"{where}.oracle", f"got {own.get('oracle')!r}; must be true "
          "or false")
    try:
        return merge_sim_config(sim_cfg, own), spec
    except ConfigError as e:
        raise ConfigError(f"{where}.{e}") from None


def validate(cfg: DictConfig) -> tuple:
    """Every check before anything runs or is written: seed, table format, simulator config, memory, policy
    sets."""
    seed = check_seed(to_container(cfg).get("seed"))
    check(isinstance(cfg.get("plots", True), bool), "plots", f"got {cfg.get('plots')!r}; must be true or false")
    check(isinstance(cfg.get("trace", False), bool), "trace", f"got {cfg.get('trace')!r}; must be true or false")
    tables = check_table_format(cfg.get("tables", "csv"))
    sim_cfg = sim_config_from(cfg)
    specs = []
    for i, (label, spec) in enumerate(policy_sets(cfg)):
        own_cfg, spec = set_config(sim_cfg, spec, i)
        specs.append((label, own_cfg, spec))
    sets = []
    for i, (label, own_cfg, spec) in enumerate(specs):
        try:
            sets.append((label, own_cfg, make_policies(spec)))
        except ConfigError as e:  # name the compare entry the bad policy came in, not the policy group
            if not cfg.get("compare"):
                raise
            raise ConfigError(str(e).replace("policy.", f"compare[{i}].", 1)) from None
    for i, (_, own_cfg, spec) in enumerate(specs):  # instances built (capacity checks), each set's policies (fresh:
        # a policy keeps per-run state) bound to them up to the first instant (SBS on a colocated cluster fails here)
        try:
            Simulator(own_cfg, make_policies(spec), seed=seed).run(until=0.0)
        except ConfigError as e:  # a set's queue order or oracle-only policy: name the entry
            if not cfg.get("compare") or str(e).startswith("compare["):
                raise
            raise ConfigError(f"compare[{i}]: {e}") from None
    return seed, tables, sim_cfg, sets


def left_unresolved(res) -> int:
    """Requests a run left unresolved at its end (rejected 'stalled': no event left; 'horizon': max_sim_time_s)."""
    return res.reason_count(("stalled", "horizon"))


def shown_keys(rows: dict[str, dict], classes: list[str]) -> tuple[str, ...]:
    """The table's rows: SHOWN, the prefix-cache keys where a run has a cache, and with several SLO classes the SLO
    keys and each class's CLASS_SHOWN (slo_attainment_chat, ttft_p99_chat, ...)."""
    cache = any(m.get(k) for m in rows.values() for k in PREFIX_KEYS)
    slo = SLO_SHOWN + tuple(f"{k}_{c}" for c in classes for k in CLASS_SHOWN) if len(classes) > 1 else ()
    return SHOWN + (PREFIX_KEYS if cache else ()) + slo


def metrics_table(rows: dict[str, dict], title: str, stopped: dict[str, int] | None = None,
                  classes: list[str] = (), hindsight: set[str] = frozenset()) -> Table:
    """Metrics as rows, policy sets as columns (fits a terminal whatever the number of metrics); a set whose run
    left requests unresolved (`stopped`: label -> how many) is headed STALLED (its means cover the rest only), a
    set run with oracle: true (`hindsight`) is headed so."""
    t = Table(title=title)
    t.add_column("metric")
    for label in rows:
        head = f"{label} (hindsight)" if label in hindsight else label
        t.add_column(f"{head} (STALLED)" if (stopped or {}).get(label) else head, justify="right")
    for k in shown_keys(rows, list(classes)):
        t.add_row(k, *[_fmt(m.get(k)) for m in rows.values()])
    return t


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.4g}"


class _NothingToDraw(Exception):
    """A plot function returned None: its figure has nothing to show (decode KV on a colocated cluster)."""


def _plot(fn, data: dict, path: Path) -> None:
    """`fn`'s figure at `path`, written atomically; no file (and none left from an earlier run in the folder)
    when `fn` has nothing to draw."""
    try:
        with atomic_path(path) as tmp:
            if fn(data, tmp) is None:
                raise _NothingToDraw
    except _NothingToDraw:
        path.unlink(missing_ok=True)


@hydra_cli("pdgym-sim", "config", validate=validate)
def main(cfg: DictConfig) -> dict:
    seed, tables, sim_cfg, sets = validate(cfg)
    out = run_dir()
    for stale in ("metrics.json", "compare.csv"):  # a reused run folder: its old result must not stand
        (out / stale).unlink(missing_ok=True)
    dirs = {label: out if i == 0 else inside(out, "compare", label) for i, (label, _, _) in enumerate(sets)}
    if len(sets) > 1:  # folders of pdgym's own, never through a link planted at their names: checked before the runs
        safe_files.make_dir(out / "compare", "compare")
        for label, _, _ in sets[1:]:
            safe_files.make_dir(out / "compare" / label, "compare")
    results, passes = {}, {}
    for label, own_cfg, pols in tqdm(sets, desc="policy sets", disable=len(sets) == 1 or None):
        if cfg.get("trace", False):
            results[label], passes[label] = simulate_traced(own_cfg, pols, seed=seed)
        else:
            results[label] = simulate(own_cfg, pols, seed=seed)
    first = next(iter(results))
    rows = {label: res.metrics() for label, res in results.items()}
    for label, res in results.items():
        if label != first:
            res.write(dirs[label], tables)
    if len(rows) > 1:
        import pandas as pd

        with atomic_path(out / "compare.csv") as tmp:
            pd.DataFrame.from_dict(rows, orient="index").rename_axis("policy_set").to_csv(tmp)
    if cfg.get("plots", True):
        from pdgym.agents import plots, run_views  # matplotlib only when plotting (import cost: tests/test_import_cost.py)

        run_views.write_latency_cdfs({k: r.requests for k, r in results.items()}, out)
        _plot(plots.decode_kv_spread, {k: r.steps for k, r in results.items()}, out / "decode_kv_spread.png")
        for label, res in results.items():
            run_views.write_run_views(res, dirs[label], passes.get(label),
                                      title=f"{cfg.get('scenario_name', 'scenario')}, {label}, seed {seed}")
    else:
        for label in passes:
            write_trace(dirs[label] / "trace.json", passes[label], results[label].requests)
    results[first].write(out, tables)  # metrics.json of the run: the last file written
    scenario = cfg.get("scenario_name", "scenario")
    console = Console()  # not a terminal (a pipe, a log): rich's 80 columns would cut the names; the table's own width
    stopped = {label: left_unresolved(res) for label, res in results.items()}
    classes = list(results[first].classes.names)
    hindsight = {label for label, own_cfg, _ in sets if own_cfg.oracle}
    Console(width=None if console.is_terminal else 400).print(
        metrics_table(rows, f"{scenario} (seed {seed}, {sim_cfg.workload.num_requests} requests)", stopped, classes,
                      hindsight))
    for label, n in stopped.items():
        if n:  # a policy that stops serving (or a horizon) is never read as a fast one (agents/evaluation/stalls.py)
            print(f"pdgym-sim: warning: {label}: {n} of {len(results[label].requests)} requests never resolved "
                  "(rejected as stalled / horizon), so its latency and throughput cover the finished ones only",
                  file=sys.stderr)
    print(f"results in {out}")
    return rows


if __name__ == "__main__":
    main()
