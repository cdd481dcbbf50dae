"""`pdgym-leaderboard`: every registered baseline and every listed agent on every leaderboard scenario.

    pdgym-leaderboard                    # conf/leaderboard.yaml: the full board (4 scenarios, 10 seeds)
    pdgym-leaderboard preset=quick       # the `make run` demonstration: fewer requests and seeds + a quick agent

Each board goes to its own dated directory OUT_DIR/<YYYY-mm-dd_HH-MM-SS>/ and OUT_DIR/latest points at the
newest good one (a board where some scenario, or some agent, has no successful run exits 1 and leaves `latest` alone
unless `tolerate_failures=true`; a run that stopped early marks its row STALLED, with no mean, and the board exits
1 once written unless `allow_stalled=true`). It holds leaderboard.{csv,md,html} (csv columns: scenario, policy,
kind, metric, mean, ci_low, ci_high, seeds, stalled), paired.csv (each policy against the scenario's reference),
aggregate.csv (IQM and probability of improvement across seeds and scenarios), regime.csv, runs.csv (every
seed's metrics) and plots/. The HTML page is self-contained (images inline, tables sortable).

Statistics (Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice"): every policy of a
scenario replays the same traffic per seed (common random numbers: the workload comes from the seed
alone), so each policy is compared with the reference (the best heuristic: the best-ranked baseline that
is not a headroom row) by a paired bootstrap interval of mean(policy) / mean(reference) - 1 over seeds.
Across seeds and scenarios: the interquartile mean of the normalised score (reference mean / value for a
lower-is-better metric, value / reference mean otherwise; 1 = the reference) and the probability of
improvement over the reference (rliable.metrics). Rule for enough seeds: on each scenario the widest
paired interval on the primary metric must be narrower than the scenario's `effect` (the smallest relative
difference the board exists to show); the board says whether it holds (`seeds_enough`) per scenario.

Regime (issue: every experiment states it): each scenario declares `regime` (offered load relative to
measured capacity; decode: pool occupancy and the fraction of decode steps with an empty pool, over the
loaded window) and it is measured on the runs of its `regime_policy`; a scenario outside is flagged in
every output. `load: X` sets the arrival rate to X times the capacity measured by a burst run (every
request at once) of the regime policy. `headroom` rows (oracle / hindsight policies, e.g. BR-H with the
true output lengths) show the gap a learned policy can close; they are never the reference.

The board's pieces live in agents/evaluation: leaderboard_run (scenarios, candidates, runs, capacity),
leaderboard_stats (every statistic above), leaderboard_render (tables, Markdown, HTML, console) and
leaderboard_plots (figures). This module is the app that checks the config, trains the `train:` entries with
pdgym-train's code, runs the pieces in order and writes the board directory; it sits in apps, above both
training and evaluation, because it uses both.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pandas as pd
from pdgym.agents import run_folder
from pdgym.agents.common import check_label, commit_id
from pdgym.agents.evaluation import candidates, stalls, transfer
from pdgym.agents.evaluation.leaderboard_plots import make_plots
from pdgym.agents.evaluation.leaderboard_render import Board, print_board, write_html, write_markdown
from pdgym.agents.evaluation.leaderboard_run import (
    BOUND_ROW,
    BoardScenario,
    agent_point,
    board_candidates,
    board_scenarios,
    measure_capacity,
    regime_policy,
    resolve_cached,
    run_board,
    workers,
)
from pdgym.agents.evaluation.leaderboard_stats import (
    aggregate,
    measure_regime,
    merge_aliases,
    paired,
    seeds_rule,
    standings,
    summarise,
)
from pdgym.agents.evaluation.metric_keys import check_metric_names
from pdgym.agents.evaluation.runner import check_budget, check_policies
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import atomic_path, write_json
from pdgym.envs.sim.validation import check_bool, check_seed_list

# The app, and the board's pieces importable from it as before the split (tests, notebooks).
__all__ = ["main", "build", "check_config", "train_agents", "agent_point", "regime_policy", "board_candidates",
           "resolve_cached"]


# --------------------------------------------------------------------------- training entries
def train_agents(entries: list[dict], out: Path, progress: bool = True) -> list[dict]:
    """Train each `train:` entry with pdgym-train's code (in this process) and list it as an agent; the board's
    `progress` applies to the training's bars too unless the entry sets its own."""
    agents = []
    if not entries:
        return agents
    from pdgym.agents.training import train

    for e in entries:
        e = dict(e)
        label = e.pop("label")
        run = out / "agents" / label
        overrides = list(e.pop("overrides", []))
        if not any(str(o).lstrip("+~").startswith("progress=") for o in overrides):
            overrides.append(f"progress={str(bool(progress)).lower()}")
        train.train_from_overrides(overrides, run, name=label)
        agents.append({"label": label, "path": str(run), "scenarios": e.pop("scenarios", None)})
    return agents


# --------------------------------------------------------------------------- the app
def check_config(cfg: dict) -> dict:
    """Every input checked before anything runs or is written: one ConfigError line naming the key."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config: got {type(cfg).__name__}; must be the composed leaderboard config as a dict, e.g. "
                          "OmegaConf.to_container(compose('leaderboard', overrides=['preset=quick']), resolve=True)")
    seeds = check_seed_list(cfg.get("seeds"), "seeds")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds: got {seeds!r}; each seed once")
    mx = cfg.get("max_seeds")
    if mx is not None and (isinstance(mx, bool) or not isinstance(mx, int) or mx < len(seeds)):
        raise ConfigError(f"max_seeds: got {mx!r}; must be an integer >= the number of seeds ({len(seeds)}), or null")
    splits = cfg.get("splits") or {}
    if cfg.get("split") is not None and cfg["split"] not in splits:
        raise ConfigError(f"split: got {cfg['split']!r}; allowed: {', '.join(splits)}, null")
    n_jobs = cfg.get("n_jobs")
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or not (n_jobs >= 1 or n_jobs == -1)):
        raise ConfigError(f"n_jobs: got {n_jobs!r}; must be an integer >= 1, or -1 / null: one per core")
    check_metric_names("metrics", cfg.get("metrics"))
    for key in ("allow_stalled", "tolerate_failures"):
        check_bool(cfg.get(key, False), key)
    check_budget("budget_s", cfg.get("budget_s"))
    for key in ("plots", "print", "progress"):  # `maybe`, 3: not a truth value
        check_bool(cfg.get(key, False), key)
    cap = cfg.get("capacity_requests")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError(f"capacity_requests: got {cap!r}; must be an integer >= 1 (the capacity burst's size), or "
                          "null (the scenario's num_requests)")
    if not isinstance(cfg.get("banner") or "", str):
        raise ConfigError(f"banner: got {cfg.get('banner')!r}; must be a line of text (or empty)")
    for key in ("agents", "train"):
        if not isinstance(cfg.get(key) or [], list):
            raise ConfigError(f"{key}: got {cfg.get(key)!r}; must be a list of entries")
    labels = []
    for a in cfg.get("agents") or []:
        if not isinstance(a, dict) or set(a) - {"label", "path", "scenarios"} or "label" not in a or "path" not in a:
            raise ConfigError(f"agents: entry {a!r} must be {{label, path, scenarios (optional)}}")
        labels.append(check_label(a["label"], "agents.label"))
        if not str(a["path"]).startswith("zoo:") and not Path(str(a["path"])).exists():  # zoo: a shipped agent
            raise ConfigError(f"agents.{a['label']}.path: {a['path']} does not exist")
    for e in cfg.get("train") or []:
        if not isinstance(e, dict) or "label" not in e or set(e) - {"label", "overrides", "scenarios"}:
            raise ConfigError(f"train: entry {e!r} must be {{label, overrides, scenarios (optional)}}")
        labels.append(check_label(e["label"], "train.label"))
    if len(set(labels)) != len(labels):
        raise ConfigError(f"agents / train: duplicate labels in {labels}")
    scenarios = board_scenarios(cfg.get("scenarios") or {})
    if not scenarios:
        raise ConfigError("scenarios: none left to run")
    for sc in scenarios:  # compose each scenario once: a bad override fails here, before any run
        sc.raw()
        check_policies({k: v for k, v in sc.raw()["policy"].items() if k != sc.point})
        check_candidates(sc)
    for a in cfg.get("agents") or []:  # a broken agent fails the board here, not inside it
        try:
            candidates.load_agent(str(a["path"]))
        except (ConfigError, FileNotFoundError) as exc:
            raise ConfigError(f"agents.{a['label']}.path: {exc}") from None
    if not isinstance(cfg.get("out_dir"), str) or not cfg["out_dir"].strip():
        raise ConfigError(f"out_dir: {'empty' if cfg.get('out_dir') in ('', None) else repr(cfg['out_dir'])}; give "
                          "the folder that holds the boards (default runs/leaderboard)")
    out = Path(os.path.abspath(Path(str(cfg["out_dir"])).expanduser()))
    for d in (out, *out.parents):  # a board nested in another app's run (a pdgym-sim run's files beside it)
        try:
            run_folder.check_owner(d, "out_dir", "pdgym-leaderboard")
        except ConfigError:
            raise ConfigError(f"out_dir: {cfg['out_dir']!r} is {'' if d == out else f'inside {d}, '}another app's run "
                              "folder; a board's folder is one of its own (default runs/leaderboard)") from None
    latest = Path(str(cfg.get("out_dir"))) / "latest"
    if os.path.lexists(latest) and not latest.is_symlink():
        raise ConfigError(f"out_dir: {latest} exists and is not the board's link; pdgym will not replace it: move it "
                          "or give another out_dir")
    return {"seeds": seeds, "scenarios": scenarios}


def check_candidates(sc: BoardScenario) -> None:
    """Every baseline and headroom row of a scenario names a policy of its decision point (`baselines=[nope]` ran
    to a board that noted the failure inside it, exit 0); their parameters are checked by each run."""
    for label, kind, spec in board_candidates(sc, []):
        if kind == "headroom" and spec["name"] == BOUND_ROW:  # no policy: checked by board_scenarios
            continue
        try:
            candidates.resolve({k: v for k, v in spec.items() if k != "overrides"}, sc.point, label=label)
        except ConfigError as exc:
            where = "baselines" if kind == "baseline" else "headroom"
            raise ConfigError(f"scenarios.{sc.key}.{where}: {str(exc).removeprefix('policy: ')}") from None


def board_dir(out: Path) -> run_folder.RunFolder:
    """A new dated directory under `out` (never an existing one), claimed (agents/run_folder.py)."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    d = out / stamp
    k = 1
    while os.path.lexists(d):
        d = out / f"{stamp}_{k}"
        k += 1
    return run_folder.claim(d, "out_dir", "pdgym-leaderboard")


def point_latest(out: Path, target: Path) -> None:
    """OUT/latest -> target, replaced atomically."""
    import secrets

    link = out / "latest"
    tmp = out / f".latest.{secrets.token_hex(6)}.partial"  # a fresh name: os.symlink never replaces what is there
    os.symlink(target.name, tmp)
    os.replace(tmp, link)


def requests_a_run(sc) -> int | None:
    """The requests of one run of a board scenario (the phases' sum for a phased workload), None when unknown."""
    wl = sc.raw().get("workload") or {}
    phases = wl.get("phases") or []
    n = sum(int(p.get("num_requests") or 0) for p in phases) if phases else wl.get("num_requests")
    return int(n) if n else None


def effective_banner(banner: str, seeds: list[int], added: dict, scenarios: list) -> str:
    """The preset's banner line (what the board is) followed by what this run used: the seeds (with any the seeds
    rule added) and each scenario's requests a run, so an override (seeds=[0,1]) is never misreported."""
    if not banner:
        return ""
    more = sorted({s for extra in added.values() for s in extra})
    sizes = ", ".join(f"{sc.key} {n:,}" for sc in scenarios if (n := requests_a_run(sc)))
    used = f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} {list(seeds)}" + (
        f" (+ seeds {more} on some scenarios)" if more else "")
    return f"{banner} [this run: {used}; requests a run: {sizes or 'as configured'}]"


def add_seeds_until_enough(scenarios: list[BoardScenario], agents: list[dict], seeds: list[int], split: dict | None,
                           cfg: dict, budget: float | None, rates: dict) -> tuple[pd.DataFrame, list[dict], dict]:
    """Run the board on `seeds`, then apply the seeds rule: while a scenario's widest paired interval is not
    narrower than its `effect` and it has fewer than `max_seeds` seeds, run it on the next len(seeds) seed
    indices. Returns all runs, all failures and {scenario: seeds added}."""
    max_seeds = int(cfg.get("max_seeds") or len(seeds))
    n_jobs = workers(cfg.get("n_jobs"))
    runs, failures = run_board(scenarios, agents, seeds, split, n_jobs, bool(cfg["progress"]), budget, rates)
    added: dict = {}
    count = {sc.key: len(seeds) for sc in scenarios}
    nxt = max(seeds) + 1
    while True:
        merged, _ = merge_aliases(runs, scenarios)
        pairs = paired(merged, scenarios)
        short = [sc for sc in scenarios if count[sc.key] < max_seeds and not seeds_rule(pairs, sc)["seeds_enough"]
                 and len(pairs) and (pairs.scenario == sc.key).sum() > 1]
        if not short:
            return runs, failures, added
        more = list(range(nxt, nxt + min(len(seeds), max_seeds - min(count[sc.key] for sc in short))))
        nxt += len(more)
        print(f"seeds rule not met on {', '.join(sc.key for sc in short)}: adding seeds {more}", file=sys.stderr)
        r2, f2 = run_board(short, agents, more, split, n_jobs, bool(cfg["progress"]), budget, rates)
        runs = pd.concat([runs, r2], ignore_index=True)
        failures += f2
        for sc in short:
            count[sc.key] += len(more)
            added.setdefault(sc.key, []).extend(more)


def build(cfg: dict) -> dict:
    """Run the whole board from a plain config dict; returns paths and the standings."""
    t0, commit = time.perf_counter(), commit_id()  # the code the board starts from
    checked = check_config(cfg)
    scenarios, seeds = checked["scenarios"], checked["seeds"]
    split = cfg["splits"][cfg["split"]] if cfg.get("split") else None
    budget = check_budget("budget_s", cfg.get("budget_s"))
    root = Path(cfg["out_dir"])
    folder = board_dir(root)
    out = folder.path
    try:
        summary = _board(cfg, t0, commit, scenarios, seeds, split, budget, root, out)
    except BaseException:  # a failed or interrupted board leaves no dated folder of tables without a summary
        folder.discard()
        raise
    folder.release()
    if not summary.pop("good"):
        raise SystemExit(1)
    stalls.refuse("pdgym-leaderboard", summary["stopped_early"], bool(cfg.get("allow_stalled")))  # board written
    return summary


def _board(cfg: dict, t0: float, commit: str, scenarios: list[BoardScenario], seeds: list[int], split: dict | None,
           budget: float | None, root: Path, out: Path) -> dict:
    """The board's runs, tables, plots and summary.json in `out` (claimed by `build`); summary["good"]: whether
    every scenario has runs (else `latest` stays and the app exits 1)."""
    agents = [dict(a) for a in cfg.get("agents") or []]
    agents += train_agents(list(cfg.get("train") or []), out, bool(cfg["progress"]))
    scheduled = set()  # agents with at least one scenario on this board (one whose scenarios are all null has none)
    transfers = []  # an agent ranked on another scenario than its training one: one line each, kept in the board
    for sc in scenarios:
        for label, kind, spec in board_candidates(sc, agents):
            if kind == "agent":
                scheduled.add(label)
                note = transfer.warn_transfer("pdgym-leaderboard", label,
                                              resolve_cached(label, kind, spec, sc.point), sc.scenario)
                transfers += [f"{note} (board scenario {sc.key})"] if note else []
    capacity = {sc.key: measure_capacity(sc, split, cfg.get("capacity_requests")) for sc in scenarios
                if sc.regime or sc.load}
    rates = {sc.key: sc.load * capacity[sc.key] for sc in scenarios
             if sc.load and math.isfinite(capacity.get(sc.key, math.nan))}
    runs, failures, added = add_seeds_until_enough(scenarios, agents, seeds, split, cfg, budget, rates)
    runs, aliases = merge_aliases(runs, scenarios)
    metrics = list(cfg["metrics"])
    table = summarise(runs, scenarios, metrics)
    pairs = paired(runs, scenarios)
    agg = aggregate(runs, scenarios)
    regimes = [measure_regime(runs, sc, capacity.get(sc.key, math.nan), rates.get(sc.key)) for sc in scenarios]
    rules = [seeds_rule(pairs, sc) for sc in scenarios]
    meta = {"seeds": seeds, "split": cfg.get("split"), "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
            "commit": commit, "n_jobs": workers(cfg.get("n_jobs")), "seeds_added": added, "budget_s": budget,
            "banner": effective_banner(cfg.get("banner") or "", seeds, added, scenarios), "transfers": transfers}
    b = Board(scenarios, metrics, meta, table, runs, pairs, agg, regimes, rules, aliases, failures)
    b.standings = standings(table, scenarios, pairs)
    for name, frame in (("leaderboard.csv", table), ("runs.csv", runs), ("paired.csv", pairs),
                        ("aggregate.csv", agg), ("regime.csv", pd.DataFrame(regimes))):
        with atomic_path(out / name) as tmp:
            frame.to_csv(tmp, index=False)
    plot_dir = out / "plots"
    if cfg["plots"]:
        make_plots(runs, table, scenarios, plot_dir)
    write_markdown(b, out / "leaderboard.md")
    write_html(b, plot_dir, out / "leaderboard.html")
    empty = [sc.key for sc in scenarios if not len(runs) or not (runs.scenario == sc.key).any()]
    ran = set(runs.policy) if len(runs) else set()
    dead = [a["label"] for a in agents if a["label"] in scheduled and a["label"] not in ran]  # every run failed
    stopped = ([f"{r.policy} on {r.scenario} seed {r.seed}" for r in runs.itertuples() if r.stopped]
               if len(runs) and "stopped" in runs else [])
    good = not (empty or dead) or bool(cfg.get("tolerate_failures"))
    summary = {"out_dir": str(out), "scenarios": [s.key for s in scenarios], "seeds": seeds,
               "runs": len(runs), "failures": failures, "failed_scenarios": empty, "failed_agents": dead,
               "stopped_early": stopped, "standings": b.standings,
               "regimes": regimes, "seeds_rule": rules, "aliases": {f"{k[0]}/{k[1]}": v for k, v in aliases.items()},
               "meta": meta, "wall_time_s": time.perf_counter() - t0}
    write_json(out / "summary.json", summary)
    if good:
        point_latest(root, out)
    if cfg.get("print", True):
        if meta["banner"]:
            print(meta["banner"])
        print_board(b)
        print(f"\nleaderboard: {out / 'leaderboard.md'} | {out / 'leaderboard.html'} | {out / 'leaderboard.csv'}; "
              f"plots in {plot_dir}/ ({summary['wall_time_s']:.0f} s)" + (f"; {root / 'latest'} -> {out.name}"
                                                                          if good else ""))
    if not good:
        what = "; ".join([*(f"every run failed on {k}" for k in empty), *(f"every run of agent {a} failed" for a in dead)])
        print(f"pdgym-leaderboard: {what} (see {out / 'leaderboard.md'}); {root / 'latest'} left unchanged; "
              "tolerate_failures=true accepts such a board", file=sys.stderr)
    return dict(summary, good=good)


def _app_task(cfg) -> dict:
    """The board in Hydra's run (looked up by name: launchers may run it elsewhere)."""
    from pdgym.agents.common import to_container

    return build(to_container(cfg))


def validate(cfg) -> None:
    """`check_config` before Hydra creates the run folder (agents/front_door.hydra_cli): seeds, split, n_jobs,
    metrics, budget_s, agents / train entries, and every scenario composed once."""
    from pdgym.agents.common import to_container

    check_config(to_container(cfg))


def main(argv: list[str] | None = None) -> None:
    """pdgym-leaderboard: one-line errors, no run folder before the config is checked (agents/front_door.hydra_cli)."""
    from pdgym.agents.front_door import hydra_cli

    hydra_cli("pdgym-leaderboard", "leaderboard", validate=validate)(_app_task)(argv)


if __name__ == "__main__":
    sys.exit(main())
