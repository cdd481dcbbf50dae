"""The leaderboard's statistics (Agarwal et al. 2021): aliases merged, per-policy means and bootstrap
intervals, the reference (best heuristic), paired ratios to it on common random numbers, rliable aggregates
(IQM, probability of improvement), the measured regime against the declared one, the seeds rule, standings.
Pure functions of the per-seed runs table; nothing here runs a simulation or writes a file."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from pdgym.agents.evaluation.leaderboard_run import BoardScenario, regime_policy
from pdgym.agents.evaluation.metric_keys import class_metric, direction, metric_columns
from pdgym.agents.evaluation.stats import describe, interval, paired_ratio, verdict
from pdgym.envs.sim.config import ConfigError

CSV_COLUMNS = ["scenario", "policy", "kind", "metric", "mean", "ci_low", "ci_high", "seeds", "stalled"]


# --------------------------------------------------------------------------- aliases
def merge_aliases(runs: pd.DataFrame, scenarios: list[BoardScenario]) -> tuple[pd.DataFrame, dict]:
    """One row per distinct policy: two baselines of a scenario whose classes are related (one subclasses
    the other: `mb` / `mixed`, `v0` / `prefill_first`) and whose every per-seed metric is equal (wall time
    aside) are one policy; the first name stays, the others are listed as its aliases. Returns the runs
    without the duplicates and {(scenario, policy): [other names]}."""
    from pdgym.baselines.registry import policy_class

    if not len(runs):
        return runs, {}
    value_cols = [c for c in metric_columns(runs.columns) if c != "wall_time_s"]
    aliases: dict = {}
    drop = set()
    for sc in scenarios:
        sub = runs[(runs.scenario == sc.key) & (runs.kind == "baseline")]
        names = list(dict.fromkeys(sub.policy))
        for i, a in enumerate(names):
            if (sc.key, a) in drop:
                continue
            ga = sub[sub.policy == a].sort_values("seed")
            for b in names[i + 1:]:
                if (sc.key, b) in drop:
                    continue
                try:
                    ca, cb = policy_class(sc.point, a), policy_class(sc.point, b)
                except ConfigError:
                    continue
                if not (issubclass(ca, cb) or issubclass(cb, ca)):
                    continue
                gb = sub[sub.policy == b].sort_values("seed")
                if list(ga.seed) == list(gb.seed) and np.allclose(ga[value_cols].to_numpy(float),
                                                                  gb[value_cols].to_numpy(float),
                                                                  rtol=0, atol=0, equal_nan=True):
                    aliases.setdefault((sc.key, a), []).append(b)
                    drop.add((sc.key, b))
    keep = [(s, p) not in drop for s, p in zip(runs.scenario, runs.policy)]
    return runs[keep].reset_index(drop=True), aliases


# --------------------------------------------------------------------------- tables
def summarise(runs: pd.DataFrame, scenarios: list[BoardScenario], metrics: list[str]) -> pd.DataFrame:
    """Long table (CSV_COLUMNS): one row per scenario x policy x metric, policies ranked by the primary metric;
    mean and 95% percentile-bootstrap interval over seeds; `stalled`: seeds that stopped early (then no mean but
    for the counts and times: agents/evaluation/stalls.py; `runs` masked or not, the result is the same)."""
    from pdgym.agents.evaluation import stalls

    runs = stalls.mask_runs(runs, metric_columns(runs.columns))
    rows = []
    for sc in scenarios:
        sub = runs[runs.scenario == sc.key] if len(runs) else runs
        for pol in rank(sub, sc.primary):
            g = sub[sub.policy == pol]
            kind = g.kind.iloc[0]
            n_stop = stalls.n_stopped(g.stopped) if "stopped" in g else 0
            for m in dict.fromkeys([sc.primary, *metrics, *class_attainment(sub)]):
                s = stalls.honest(m, interval(g[m].tolist()), n_stop)
                rows.append({"scenario": sc.key, "policy": pol, "kind": kind, "metric": m, "mean": s["mean"],
                             "ci_low": s["ci_low"], "ci_high": s["ci_high"], "seeds": len(g) if n_stop else s["n"],
                             "stalled": n_stop})
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def class_attainment(sub: pd.DataFrame) -> list[str]:
    """The per-class attainment columns (slo_attainment_chat, ...) of one scenario's runs when they have several SLO
    classes: a board of tiers shows each tier's attainment beside the weighted one."""
    cols = [c for c in sub.columns if class_metric(c) == "slo_attainment" and sub[c].notna().any()]
    return cols if len(cols) > 1 else []


def rank(sub: pd.DataFrame, metric: str) -> list[str]:
    """Policies best first by the mean of `metric` (its direction); NaN last."""
    if not len(sub):
        return []
    means = sub.groupby("policy", sort=False)[metric].mean()
    key = -direction(metric) * means
    return list(key.sort_values(na_position="last", kind="stable").index)


def reference(runs: pd.DataFrame, sc: BoardScenario) -> str | None:
    """The best heuristic of a scenario: its best-ranked baseline (headroom rows and agents excluded)."""
    sub = runs[(runs.scenario == sc.key) & (runs.kind == "baseline")] if len(runs) else runs
    order = rank(sub, sc.primary)
    return order[0] if order else None


def paired(runs: pd.DataFrame, scenarios: list[BoardScenario]) -> pd.DataFrame:
    """Per scenario and policy: paired ratio to the reference on the primary metric (bootstrap over the
    seeds both ran), its verdict in words and whether the interval excludes zero. A policy with a stopped-early
    seed is not comparable (stalls.mask_runs) and is never the reference."""
    from pdgym.agents.evaluation import stalls

    runs = stalls.mask_runs(runs, metric_columns(runs.columns))
    rows = []
    for sc, ref, pol, kind, x, y in pairs_with_reference(runs, scenarios):
        p = paired_ratio(x.to_numpy(), y.to_numpy())
        rows.append({"scenario": sc.key, "policy": pol, "kind": kind, "reference": ref,
                     "metric": sc.primary, "rel": p["rel"], "ci_low": p["ci_low"], "ci_high": p["ci_high"],
                     "seeds": p["n"], "verdict": "reference" if pol == ref else
                     verdict(sc.primary, p["rel"], p["ci_low"], p["ci_high"]),
                     "sentence": "" if pol == ref else describe(sc.primary, pol, ref, p)})
    return pd.DataFrame(rows)


def pairs_with_reference(runs: pd.DataFrame, scenarios: list[BoardScenario]):
    """Per scenario (with a reference) and policy, best first: (scenario, reference, policy, kind, x, y), x and
    y the policy's and the reference's primary metric on the seeds both ran (common random numbers)."""
    for sc in scenarios:
        sub = runs[runs.scenario == sc.key] if len(runs) else runs
        ref = reference(runs, sc)
        if ref is None:
            continue
        y = sub[sub.policy == ref].set_index("seed")[sc.primary]
        for pol in rank(sub, sc.primary):
            g = sub[sub.policy == pol]
            x = g.set_index("seed")[sc.primary]
            common = [s for s in x.index if s in y.index]
            yield sc, ref, pol, g.kind.iloc[0], x[common], y[common]


def aggregate(runs: pd.DataFrame, scenarios: list[BoardScenario]) -> pd.DataFrame:
    """Across seeds and scenarios (rliable): per policy, the interquartile mean of its normalised score on
    each scenario's primary metric (1 = the reference's mean; above 1 is better) and its probability of
    improvement over the reference (P(score > reference's score), averaged over scenarios)."""
    from pdgym.agents.evaluation import stalls
    from rliable import metrics as rm

    runs = stalls.mask_runs(runs, metric_columns(runs.columns))
    per: dict[str, list] = {}
    for sc, ref, pol, kind, x, y in pairs_with_reference(runs, scenarios):
        sub = runs[(runs.scenario == sc.key) & (runs.policy == ref)]
        ym = float(sub[sc.primary].mean())  # the reference's mean over all its seeds
        if not math.isfinite(ym) or ym == 0:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            xs, ys = (np.asarray(v, dtype=float) for v in (x, y))
            norm = (xs / ym, ys / ym) if direction(sc.primary) > 0 else (ym / xs, ym / ys)
        per.setdefault(pol, []).append((sc.key, kind, *norm))
    rows = []
    for pol, items in per.items():
        n = min(len(i[2]) for i in items)
        xs = np.stack([i[2][:n] for i in items], axis=1)  # runs x tasks
        ys = np.stack([i[3][:n] for i in items], axis=1)
        if n == 0 or not np.isfinite(xs).all():
            continue
        rows.append({"policy": pol, "kind": items[0][1], "scenarios": " ".join(i[0] for i in items),
                     "iqm_score": float(rm.aggregate_iqm(xs)), "mean_score": float(xs.mean()),
                     "prob_improvement": float(rm.probability_of_improvement(xs, ys)), "seeds": n})
    out = pd.DataFrame(rows)
    return out.sort_values("iqm_score", ascending=False).reset_index(drop=True) if len(out) else out


def measure_regime(runs: pd.DataFrame, sc: BoardScenario, capacity: float, rate: float | None) -> dict:
    """The regime measured on the regime policy's runs, checked against the declared bounds."""
    from pdgym.agents.evaluation import stalls

    runs = stalls.mask_runs(runs, metric_columns(runs.columns))
    pol = regime_policy(sc)
    g = runs[(runs.scenario == sc.key) & (runs.policy == pol)] if len(runs) else runs
    raw = sc.raw(rate)
    wl = raw["workload"]
    out = {"scenario": sc.key, "regime_policy": pol, "capacity_rps": capacity}
    if wl.get("arrival") == "closed":
        out["offered_rps"] = math.nan
        out["load"] = float(wl["concurrency"]) / float(g.batch_mean.mean()) if len(g) else math.nan
        out["load_def"] = "concurrency / mean running requests per pass"
    else:
        out["offered_rps"] = float(wl["rate"]) if wl.get("rate") else math.nan
        out["load"] = out["offered_rps"] / capacity if capacity and math.isfinite(capacity) else math.nan
        out["load_def"] = "arrival rate / burst capacity"
    out["pool_mean"] = float(g.pool_mean.mean()) if len(g) else math.nan
    out["pool_empty_frac"] = float(g.pool_empty_frac.mean()) if len(g) else math.nan
    declared = sc.regime
    problems = []
    lo_hi = declared.get("load")
    if lo_hi is not None:
        lo, hi = lo_hi
        if not (math.isfinite(out["load"]) and lo <= out["load"] <= hi):
            problems.append(f"load {out['load']:.2f} outside [{lo}, {hi}]")
    if declared.get("pool_mean_min") is not None and not (out["pool_mean"] >= declared["pool_mean_min"]):
        problems.append(f"pool mean {out['pool_mean']:.1f} < {declared['pool_mean_min']}")
    if declared.get("pool_empty_max") is not None and not (out["pool_empty_frac"] <= declared["pool_empty_max"]):
        problems.append(f"empty-pool steps {out['pool_empty_frac']:.0%} > {declared['pool_empty_max']:.0%}")
    out["declared"] = ", ".join(f"{k}: {v}" for k, v in declared.items() if k != "why")
    out["why"] = declared.get("why", "")
    out["in_regime"] = not problems
    out["flag"] = "; ".join(problems)
    return out


def seeds_rule(pairs: pd.DataFrame, sc: BoardScenario) -> dict:
    """Enough seeds when every paired interval on the primary metric is narrower than `effect` (the
    smallest relative difference the scenario exists to show): max width < effect."""
    p = pairs[(pairs.scenario == sc.key) & (pairs.verdict != "reference")] if len(pairs) else pairs
    widths = (p.ci_high - p.ci_low).dropna() if len(p) else pd.Series(dtype=float)
    width = float(widths.max()) if len(widths) else math.nan
    return {"scenario": sc.key, "effect": sc.effect, "max_ci_width": width,
            "seeds_enough": bool(math.isfinite(width) and width < sc.effect)}


def standings(table: pd.DataFrame, scenarios: list[BoardScenario], pairs: pd.DataFrame | None = None) -> list[dict]:
    """Per scenario: the reference (best heuristic) and the best agent on the primary metric, with the
    paired comparison in words (better / worse / no clear difference)."""
    out = []
    for sc in scenarios:
        t = table[(table.scenario == sc.key) & (table.metric == sc.primary)]
        row = {"scenario": sc.key, "primary": sc.primary,
               "direction": "higher is better" if direction(sc.primary) > 0 else "lower is better"}
        for kind in ("baseline", "agent", "headroom"):
            k = t[t.kind == kind]
            if len(k):
                row[f"best_{kind}"] = k.iloc[0].policy  # already ranked
                row[f"{kind}_mean"] = float(k.iloc[0]["mean"])
        if pairs is not None and len(pairs):
            pr = pairs[pairs.scenario == sc.key].set_index("policy")
            for kind in ("agent", "headroom"):
                if f"best_{kind}" in row and row[f"best_{kind}"] in pr.index:
                    r = pr.loc[row[f"best_{kind}"]]
                    row[f"{kind}_vs_reference"] = float(r.rel)
                    row[f"{kind}_ci"] = [float(r.ci_low), float(r.ci_high)]
                    row[f"{kind}_verdict"] = r.verdict
                    row[f"{kind}_sentence"] = r.sentence
            row["agent_better"] = row.get("agent_verdict") == "better"
        out.append(row)
    return out
