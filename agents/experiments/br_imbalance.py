"""BalanceRoute on a decode tier near saturation (ALGORITHMS.md s6): BR-0 and BR-H against the classic routers.

For each N (decode_tier_n{N}: N DP workers, Azure conversation trace, or `workload.trace=PATH`) the
arrival rate is set to `load` x the least-KV router's measured capacity (a calibration run with every
request arriving at once; completions per second between the 20% and 80% completion quantiles), so
every router works a saturated tier with a pool to choose from. Each router then replays the same
traffic. Figures come from the loaded part of the run, decode steps starting between the arrival of
the `window_start` quantile request and the last arrival (no ramp-up, no drain, the same interval for
every router): mean worker-KV imbalance (max - min), output tokens per second of decode time, the
per-step standard deviation of worker KV. TPOT p95 is over all finished requests (pool wait included).

Load across N: the rate is the same multiple of each tier's own measured capacity, and the capacity
per worker (summary `capacity_per_worker`) stays within about 10% across N = 8..32 (the EP all-to-all
grows with N), so the N columns compare tiers at the same utilisation. The heavy-tailed tier replays
max(heavy_tail_requests, heavy_tail_per_worker x N) requests so every N reaches steady state.
The prefill side is sized per N too: `scale_prefill` grows its instances with N, and the same calibration
run measures what one prefill instance feeds (prompt tokens per pass-second), so that prefill capacity is
at least `feed_margin` x the arrival rate (summary `prefill_instances`). Capacity and prefill are found
together (`measure.saturated`): where the prefill is grown, the burst runs again with it, until no instance
is added (at most `calibration_rounds` bursts), since a burst that cannot keep the slots full under-reads the
capacity. A calibration that did not reach its fixed point, a burst with too few full steps, or a tier whose
pool still empties, is flagged out of regime, and summary `regime_causes` (results.md, the fidelity report) names
why in numbers: "prefill bound at P instances", "trace too short: R rows arrive in T s ... for S decode slots",
or a pool that still empties at the calibrated rate.

Two regimes (see the scenario files): the Azure conversation tier (mean prompt 1.2K) is KV-light, the KV
read is about 30% of a decode step, so even a large cut in imbalance moves throughput by a few percent;
the heavy-tailed tier carries long-context traffic (mean prompt 4K, KV about 60% of a step, batch held at
64 with half the KV pool in use), BalanceRoute's regime, where the throughput gain reaches the 9-12% band.

BR-H runs with the oracle (`oracle: true` for that run only) and with the deployable predictors,
survival and memo (also with `hold_full: true`, rows brh_*_hold: see baselines/balance_route.py),
fitted on the trace rows outside the evaluated ones, and the oracle again at each discount of `oracle_gammas`
(rows brh_oracle_g<gamma>, summary `imb_ratio_brh_oracle_by_gamma`): the lookahead's value at N = 4 needs a
shorter effective horizon than the default's (docs/fidelity.md). `overflow_per_pick` (BR-0 and the oracle rows):
tokens admitted past today's margin per admission, the router's own count (how much a lookahead overfills
today). The same comparison runs on the heavy-tailed synthetic tier (decode_tier_ht_n{N}) unless `heavy_tail_scenario` is null.
`sweep: true` adds the parameter sweeps behind the BR-0 / BR-H defaults (N = sweep_n, both workloads).
Two more of the paper's claims: BR-H's TPOT p95 against the lowest classic router's and against BR-0's
(`tpot_p95_ratio_brh_classic`, `tpot_p95_ratio_brh_br0`), and the dispatch cost: each BalanceRoute router's
mean wall time per routing decision (one per decode step that starts with a pool and a free slot) in the
loaded window, on the machine that ran it (`route_ms`; the largest, `route_ms_br_max`), beside BR-0's
decode step (`step_ms_br0`).

Seeds (`seeds`): every router replays each seed's traffic (the rate calibrated on the first); the summary
holds the seed means and BR-0's ratios seed by seed (`imb_ratio_br0_seeds`, `tput_gain_br0_seeds`).

Outputs: results.csv / results.md (every router x N x seed x workload), kv_traces_<wl>.png (per-worker KV
over a window of steps for each router), imbalance_vs_n_<wl>.png, throughput_<wl>.png, summary.json.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from pdgym.baselines.balance_route import ORDERS
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim.safe_files import save_figure
from pdgym.envs.sim.traces import load_trace
from tqdm import tqdm

from .harness import Experiment, experiment
from .measure import plot_traces, run_router, saturated, tier


# --------------------------------------------------------------------------- routers
def label(spec) -> str:
    if isinstance(spec, str):
        return spec
    if spec["name"] == "brh":
        return f"brh_{spec.get('predictor', 'survival')}" + ("_hold" if spec.get("hold_full") else "")
    return spec["name"]


def routers(p) -> list[tuple[str, object]]:
    """(label, spec) of every router of one comparison: classic ones, BR-0, BR-H with each predictor, and the
    oracle at each of `oracle_gammas` (brh_oracle_g<gamma>: the lookahead's discount, whose best value moves
    with N)."""
    specs: list = [*p.classic, dict(p.br0)]
    specs += [{**dict(p.brh), "predictor": pred} for pred in p.predictors]
    specs += [{**dict(p.brh), "predictor": pred, "hold_full": True} for pred in p.hold_predictors]
    out = [(label(s), s) for s in specs]
    out += [(f"brh_oracle_g{float(g)}", {**dict(p.brh), "predictor": "oracle", "gamma": float(g)})
            for g in p.get("oracle_gammas") or []]
    return out


# --------------------------------------------------------------------------- one workload
def compare(base, p, seeds: list[int], tag: str, exp: Experiment, per_worker: int = 0) -> tuple[pd.DataFrame, dict]:
    """Every router on every N and seed for one workload (every router replays each seed's traffic); returns
    the per-seed table and the summary fields (seed means, plus BR-0's per-seed ratios).
    `per_worker` > 0: replay max(base requests, per_worker x N) requests, the same count per worker."""
    rows, traces, setup = [], {}, {}
    specs = routers(p)
    for n in p.N:
        reqs = max(int(base.workload.num_requests), per_worker * int(n)) if per_worker else None
        cfg = tier(base, n=int(n), num_requests=reqs, scale_prefill=bool(p.scale_prefill))
        cfg, calib = saturated(cfg, float(p.load), float(p.feed_margin), seeds[0], int(p.calibration_rounds))
        cap = calib.decode_rps
        setup[int(n)] = (cfg, calib)
        exp.regime(f"{tag} N={n} calibration", "share of full decode steps in the capacity burst", calib.full_share,
                   lo=0.1, note="(a part-empty tier's capacity reads low)")
        exp.regime(f"{tag} N={n} calibration", "prefill fixed point reached (1 = yes)", float(calib.converged), lo=1,
                   note=f"({calib.bursts} of at most repro.calibration_rounds bursts; 0: the last one still grew the prefill)")
        for name, spec in tqdm(specs, desc=f"{tag} N={n}", leave=False):
            spec = OmegaConf.to_container(spec) if OmegaConf.is_config(spec) else spec
            for seed in seeds:
                figure = n == p.trace_n and seed == seeds[0]
                r = run_router(cfg, spec, seed, float(p.window_start), float(p.trace_at),
                               int(p.trace_steps) if figure else 0)
                kept = r.pop("kept")
                if figure:
                    traces[name] = kept
                rows.append({"workload": tag, "N": int(n), "router": name, "seed": int(seed),
                             "rate": float(p.load) * cap, "capacity_rps": cap, "capacity_per_worker": cap / int(n),
                             "prefill_instances": cfg.cluster.prefill.count, "decode_tp": cfg.cluster.decode.tp, **r})
    table = pd.DataFrame(rows)
    means = seed_means(table)
    for r in means[means.router.isin(["br0", "least_kv"])].itertuples():
        exp.regime(f"{tag} N={r.N} {r.router}", "share of decode steps with an empty pool", r.empty_pool_frac,
                   hi=float(p.regime_max_empty_pool), note="(not saturated: nothing left to choose from)")
    fields = summarise(means, p)
    fields.update(per_seed(table, fields))
    fields["regime_causes"] = {f"{tag} N={n}": c for n, (cfg, calib) in setup.items()
                               if (c := regime_cause(cfg, calib, means[means["N"] == n], p))}
    if traces:  # trace_n is one of the N measured
        plot_traces(traces, exp.figure(f"kv_traces_{tag}.png"), f"{tag}, N = {p.trace_n}")
    plot_groups(means, "imbalance", "mean KV imbalance, max - min (tokens)", exp.figure(f"imbalance_vs_n_{tag}.png"))
    plot_groups(means, "tput", "decode throughput", exp.figure(f"throughput_{tag}.png"),
                relative=True)
    return table, fields


def regime_cause(cfg, calib, means: pd.DataFrame, p) -> str:
    """What stops one N from reaching its regime, in words with its numbers ("" when it is in regime): a prefill
    calibration that did not reach its fixed point (prefill bound); a burst of every request at once that kept
    the tier full on under 10% of its steps, or a pool that empties at a rate above capacity with the prefill at
    its fixed point (a queue fed faster than it is served empties only while the tier ramps up or after the
    arrivals stop: the trace is too short); else the load itself (at or below capacity)."""
    br0 = means[means.router == "br0"]
    empty = float(br0.empty_pool_frac.iloc[0]) if len(br0) else float("nan")
    dec = cfg.cluster.decode
    slots = dec.count * dec.dp * dec.batch_limit
    n_req, rate, prefill = int(cfg.workload.num_requests), float(p.load) * calib.decode_rps, cfg.cluster.prefill.count
    arrive = f"{n_req} rows arrive in {n_req / rate:.1f} s at {rate:.4g} req/s for {slots} decode slots"
    if not calib.converged:
        return (f"prefill bound at {prefill} instances: the calibration still grew the prefill after {calib.bursts} "
                f"bursts (at most load x feed_margin per burst); {arrive}")
    if calib.full_share < 0.1:
        return (f"trace too short: {arrive}; even arriving at once they kept the tier full on "
                f"{calib.full_share:.0%} of the burst's steps")
    if empty <= float(p.regime_max_empty_pool):
        return ""
    if float(p.load) > 1:
        return (f"trace too short: {arrive} ({p.load} x capacity, prefill at its fixed point of {prefill} instances), "
                f"yet the pool is empty on {empty:.0%} of BR-0's loaded steps: the run is a ramp and a drain")
    return f"load {p.load} x capacity leaves the pool empty on {empty:.0%} of BR-0's loaded steps; {arrive}"


def seed_means(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (N, router): the mean over seeds of every measured column."""
    num = table.select_dtypes("number").columns.drop(["N", "seed"])
    return table.groupby(["N", "router"], sort=False)[list(num)].mean().reset_index()


def per_seed(table: pd.DataFrame, fields: dict) -> dict:
    """BR-0's imbalance ratio and throughput gain seed by seed, against the best classic router of the seed
    means: the spread the summary's means hide (one seed's N = 32 ratio moved by up to 0.1)."""
    out: dict = {"seeds": sorted(int(s) for s in table.seed.unique()), "imb_ratio_br0_seeds": [],
                 "tput_gain_br0_seeds": []}
    for n, best in zip(fields["N"], fields["best_classic"]):
        t = table[table["N"] == n]
        br0, ref = t[t.router == "br0"].set_index("seed"), t[t.router == best].set_index("seed")
        out["imb_ratio_br0_seeds"].append((br0.imbalance / ref.imbalance).round(4).tolist())
        out["tput_gain_br0_seeds"].append((br0.tput / ref.tput - 1).round(4).tolist())
    return out


def summarise(table: pd.DataFrame, p) -> dict:
    f: dict = {k: [] for k in ("N", "best_classic", "imb_ratio_br0", "imb_ratio_brh_oracle", "tput_gain_br0",
                               "tpot_p95_ratio_brh", "imb_ratio_brh_survival", "imb_ratio_brh_memo",
                               "imb_ratio_brh_survival_hold", "imb_ratio_brh_memo_hold",
                               "tput_gain_brh_oracle", "capacity_per_worker", "prefill_instances",
                               "decode_tp")}
    for n, t in table.groupby("N", sort=True):
        t = t.set_index("router")
        classic = t.loc[[c for c in p.classic]]
        best = classic.imbalance.idxmin()
        f["N"].append(int(n))
        f["best_classic"].append(best)
        f["imb_ratio_br0"].append(t.imbalance["br0"] / t.imbalance[best])
        oracle = "brh_oracle" in t.index  # the BR-H rows are optional (repro.predictors); absent: None
        f["imb_ratio_brh_oracle"].append(t.imbalance["brh_oracle"] / t.imbalance["br0"] if oracle else None)
        f["tput_gain_br0"].append(t.tput["br0"] / t.tput[best] - 1)
        f["tpot_p95_ratio_brh"].append(t.tpot_p95["brh_oracle"] / t.tpot_p95[best] if oracle else None)
        # "BR-H has the lowest TPOT p95": against the lowest classic router's, and against BR-0's
        f.setdefault("tpot_p95_ratio_brh_classic", []).append(
            t.tpot_p95["brh_oracle"] / classic.tpot_p95.min() if oracle else None)
        f.setdefault("tpot_p95_ratio_brh_br0", []).append(
            t.tpot_p95["brh_oracle"] / t.tpot_p95["br0"] if oracle else None)
        for pred in ("survival", "memo", "survival_hold", "memo_hold"):
            key = f"brh_{pred}"
            f[f"imb_ratio_brh_{pred}"].append(t.imbalance[key] / t.imbalance["br0"] if key in t.index else None)
        f["tput_gain_brh_oracle"].append(t.tput["brh_oracle"] / t.tput[best] - 1 if oracle else None)
        f["capacity_per_worker"].append(float(t.capacity_per_worker.iloc[0]))
        f["prefill_instances"].append(int(t.prefill_instances.iloc[0]))
        f["decode_tp"].append(int(t.decode_tp.iloc[0]))
        for key in ("pool_mean", "empty_pool_frac", "slot_occupancy"):
            f.setdefault(f"{key}_br0", []).append(float(t[key]["br0"]))
        balance_route = [r for r in t.index if r == "br0" or r.startswith("brh_")]  # dispatch cost per decode step
        for name in balance_route:
            f.setdefault("route_ms", {}).setdefault(name, []).append(float(t.route_ms[name]))
        f.setdefault("route_ms_br_max", []).append(float(t.route_ms[balance_route].max()))
        f.setdefault("step_ms_br0", []).append(float(t.step_ms["br0"]))
        for name in [r for r in t.index if r == "br0" or r.startswith("brh_oracle")]:  # tokens past today's margin
            f.setdefault("overflow_per_pick", {}).setdefault(name, []).append(float(t.overflow_per_pick[name]))
        for g in p.get("oracle_gammas") or []:  # {gamma: [BR-H oracle / BR-0 imbalance per N]}
            key = f"brh_oracle_g{float(g)}"
            f.setdefault("imb_ratio_brh_oracle_by_gamma", {}).setdefault(str(float(g)), []).append(
                t.imbalance[key] / t.imbalance["br0"] if key in t.index else None)
    return f


# --------------------------------------------------------------------------- figures
def plot_groups(table: pd.DataFrame, col: str, ylabel: str, path: Path, relative: bool = False) -> None:
    """Grouped bars: one group per N, one bar per router (throughput relative to least_kv if asked)."""
    ns = sorted(table.N.unique())
    names = list(dict.fromkeys(table.router))
    fig, ax = plt.subplots(figsize=(min(16, max(6, 1.1 * len(names) * len(ns) / 2)), 4.2))
    width = 0.8 / len(names)
    colors = plt.get_cmap("tab20" if len(names) > 10 else "tab10").colors  # one colour per router
    for i, name in enumerate(names):
        vals = []
        for n in ns:
            t = table[table["N"] == n].set_index("router")
            v = t[col][name]
            vals.append(v / t[col]["least_kv"] if relative and "least_kv" in t.index else v)
        ax.bar(np.arange(len(ns)) + (i - (len(names) - 1) / 2) * width, vals, width, label=name,
               color=colors[i % len(colors)])
    ax.set_xticks(np.arange(len(ns)), [f"N = {n}" for n in ns])
    ax.set_ylabel(f"{ylabel}{' / least_kv' if relative else ''}")
    if relative:
        lo = min(b.get_height() for b in ax.patches)
        ax.set_ylim(max(0.0, lo - 0.05), None)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(len(names), 7), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")  # the legend sits above the axes, off the bars
    plt.close(fig)


# --------------------------------------------------------------------------- sweeps
def sweep(base, p, seed: int, tag: str) -> pd.DataFrame:
    """The grids behind the defaults, at N = sweep_n, each point against BR-0's default."""
    cfg = tier(base, n=int(p.sweep_n), scale_prefill=bool(p.scale_prefill))
    cfg, _ = saturated(cfg, float(p.load), float(p.feed_margin), seed, int(p.calibration_rounds))
    grid = []
    for order in ORDERS:
        for k in p.sweep_window:
            for s1 in p.sweep_stage1:
                grid.append({"name": "br0", "order": order, "window": int(k), "stage1_free": float(s1)})
    for h in p.sweep_horizon:
        for g in p.sweep_gamma:
            grid.append({**dict(p.brh), "predictor": "oracle", "horizon": int(h), "gamma": float(g)})
    for pred in ("survival", "memo"):
        for q in p.sweep_q_min:
            for rf in p.sweep_refresh:
                grid.append({**dict(p.brh), "predictor": pred, "q_min": float(q), "refresh": int(rf)})
    rows = []
    for spec in tqdm(grid, desc=f"sweep {tag}", leave=False):
        r = run_router(cfg, spec, seed, float(p.window_start))
        r.pop("kept")
        rows.append({"workload": tag, **{k: v for k, v in spec.items()}, **r})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- entry point
@experiment(may_be_empty=("predictors", "hold_predictors", "oracle_gammas"),
            may_be_null={"heavy_tail_scenario": None, "paper_scenario": None},
            within={"window_start": "[0, 1)", "trace_at": "[0, 1)", "load": "(0, inf)", "feed_margin": "(0, inf)",
                    "calibration_rounds": "[1, 100]",
                    "regime_max_empty_pool": "[0, 1]", "oracle_gammas": "(0, 1]"})
def run(exp: Experiment) -> dict:
    p = exp.p
    seeds = exp.seeds
    base = exp.sim
    n_eval = int(p.num_requests)
    if base.workload.trace is not None:  # keep at least 40% of the trace for the predictors to train on
        rows = len(load_trace(base.workload.trace)) - int(base.workload.trace_offset)
        n_eval = min(n_eval, int(0.6 * rows))
    base = tier(base, num_requests=n_eval)
    sets = [("workload", base, 0)]  # the scenario's own workload (the Azure conversation trace unless workload.trace)
    if p.heavy_tail_scenario:
        ht = load_scenario(str(p.heavy_tail_scenario)).sim
        sets.append(("heavy_tail", tier(ht, num_requests=int(p.heavy_tail_requests)), int(p.heavy_tail_per_worker)))
    if p.get("paper_scenario"):  # BalanceRoute's own setting (DeepSeek-V3 decode on an Ascend 910C supernode)
        sets.append(("ascend_910c", tier(exp.scenario(str(p.paper_scenario)), num_requests=n_eval), 0))
    tables, fields, sweeps = [], {}, []
    for tag, sim_cfg, per_worker in tqdm(sets, desc="br_imbalance workloads"):
        table, f = compare(sim_cfg, p, seeds, tag, exp, per_worker)
        tables.append(table)
        fields[tag] = f
        if p.sweep:
            sweeps.append(sweep(sim_cfg, p, seeds[0], tag))
    table = pd.concat(tables, ignore_index=True)
    md = [table.to_markdown(index=False, floatfmt=".4g")]
    if sweeps:
        sw = pd.concat(sweeps, ignore_index=True)
        exp.csv(sw, "sweep.csv")
        md += ["", "## Parameter sweeps", "", sw.to_markdown(index=False, floatfmt=".4g")]
    causes = {k: v for f in fields.values() for k, v in f.get("regime_causes", {}).items()}
    if causes:
        md += ["", "## What keeps points out of regime", "", *[f"- {k}: {v}" for k, v in causes.items()]]
    exp.table(table, "\n".join(md))
    main_tag = sets[0][0]
    summary = dict(fields[main_tag])
    for tag, f in fields.items():
        if tag != main_tag:
            summary[tag] = f
    summary["regime_causes"] = causes  # every workload's, flat: the fidelity report's Runs table names them
    summary["window"] = {"start_quantile": float(p.window_start), "load": float(p.load),
                         "num_requests": n_eval, "heavy_tail_requests": int(p.heavy_tail_requests),
                         "heavy_tail_per_worker": int(p.heavy_tail_per_worker)}
    return summary
