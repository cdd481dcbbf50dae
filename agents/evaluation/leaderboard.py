"""`pdgym-leaderboard`: every registered baseline and every listed agent on every leaderboard scenario.

    pdgym-leaderboard                    # conf/leaderboard.yaml: the full board (4 scenarios, 10 seeds)
    pdgym-leaderboard preset=quick       # the `make run` demonstration: fewer requests and seeds + a quick agent

Each board goes to its own dated directory OUT_DIR/<YYYY-mm-dd_HH-MM-SS>/ and OUT_DIR/latest points at the
newest good one (a board where some scenario has no successful run exits 1 and leaves `latest` alone
unless `tolerate_failures=true`). It holds leaderboard.{csv,md,html} (csv columns: scenario, policy,
kind, metric, mean, ci_low, ci_high, seeds), paired.csv (each policy against the scenario's reference),
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
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pdgym.agents.common import check_label, commit_id
from pdgym.agents.evaluation import evaluate as E
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import write_json

CSV_COLUMNS = ["scenario", "policy", "kind", "metric", "mean", "ci_low", "ci_high", "seeds"]
UNITS = {"ttft": "s", "tpot": "s", "e2e": "s", "sched_queue_s": "s", "device_queue_s": "s", "sim_time_s": "s",
         "wall_time_s": "s", "throughput_tok_s": "tok/s", "total_tok_s": "tok/s", "rps": "req/s",
         "goodput_rps": "req/s", "imbalance": "KV tokens", "pool_mean": "requests", "finished": "requests",
         "rejected": "requests", "slo_attainment": "fraction", "chunk_util_mean": "fraction",
         "barrier_idle_frac": "fraction", "pool_empty_frac": "fraction"}


def unit(metric: str) -> str:
    for k, u in UNITS.items():
        if metric == k or metric.startswith(k + "_") or (k in ("ttft", "tpot", "e2e", "imbalance")
                                                            and metric.startswith(k)):
            return u
    return ""


def with_unit(metric: str) -> str:
    u = unit(metric)
    return f"{metric} ({u})" if u else metric


@dataclass
class BoardScenario:
    """One leaderboard scenario: a named scenario + overrides, the decision point under test, its ranking,
    its declared regime and headroom rows."""

    key: str
    scenario: str
    point: str
    primary: str
    overrides: list[str] = field(default_factory=list)
    policies: dict = field(default_factory=dict)  # fixed baselines at the other decision points
    baselines: list | None = None  # None: every registered baseline of `point`
    exclude: list[str] = field(default_factory=list)  # registered baselines left out (e.g. oracle-only)
    headroom: list = field(default_factory=list)  # oracle / hindsight rows: [{label, name, params...}]
    headroom_note: str = ""  # what the headroom rows are, or why there is none
    load: float | None = None  # arrival rate = load x capacity measured by a burst of the regime policy
    regime_policy: str | None = None  # the baseline whose runs measure the regime (default: the scenario's own policy); always run
    regime: dict = field(default_factory=dict)  # declared bounds: load, pool_mean_min, pool_empty_max, why
    effect: float = 0.05  # smallest relative difference on `primary` the board exists to show
    note: str = ""

    def raw(self, rate: float | None = None) -> dict:
        from pdgym.envs.scenario import load_scenario

        raw = load_scenario(self.scenario, list(self.overrides)).raw
        pol = dict(raw.get("policy") or {})
        pol.update(self.policies)
        raw = dict(raw, policy=pol)
        if rate is not None:
            raw = dict(raw, workload=dict(raw["workload"], rate=float(rate)))
        return raw


REGIME_KEYS = ("load", "pool_mean_min", "pool_empty_max", "why")


def board_scenarios(spec: dict) -> list[BoardScenario]:
    out = []
    allowed = [f for f in BoardScenario.__dataclass_fields__ if f != "key"]
    for key, s in spec.items():
        if s is None:  # a preset removes a scenario by setting it to null
            continue
        check_label(key, f"scenarios.{key}")
        s = dict(s)
        for k in s:
            if k not in allowed:
                raise ConfigError(f"scenarios.{key}.{k}: unknown key; allowed: {', '.join(allowed)}")
        for k in ("scenario", "point", "primary"):
            if k not in s:
                raise ConfigError(f"scenarios.{key}.{k}: missing")
        if s["point"] not in E.POINTS:
            raise ConfigError(f"scenarios.{key}.point: got {s['point']!r}; allowed: {', '.join(E.POINTS)}")
        if s["primary"] not in E.METRIC_KEYS:
            raise ConfigError(f"scenarios.{key}.primary: got {s['primary']!r}; allowed: {', '.join(E.METRIC_KEYS)}")
        for k in s.get("regime") or {}:
            if k not in REGIME_KEYS:
                raise ConfigError(f"scenarios.{key}.regime.{k}: unknown key; allowed: {', '.join(REGIME_KEYS)}")
        if s.get("load") is not None and not (isinstance(s["load"], (int, float)) and s["load"] > 0):
            raise ConfigError(f"scenarios.{key}.load: got {s['load']!r}; must be a positive number or null")
        for h in s.get("headroom") or []:
            if not isinstance(h, dict) or "label" not in h or "name" not in h:
                raise ConfigError(f"scenarios.{key}.headroom: entry {h!r} needs label and name")
            check_label(h["label"], f"scenarios.{key}.headroom.label")
        s["regime"] = dict(s.get("regime") or {})
        s["headroom"] = list(s.get("headroom") or [])
        out.append(BoardScenario(key=key, **s))
    return out


# --------------------------------------------------------------------------- running
def _candidates(sc: BoardScenario, agents: list[dict]) -> list[tuple[str, str, Any]]:
    """(label, kind, spec) of everything ranked on a scenario; kind: baseline | headroom | agent;
    spec: baseline spec or model path."""
    from pdgym.baselines import registered

    names = sc.baselines if sc.baselines is not None else registered(sc.point)
    out = []
    for kind, entries in (("baseline", names), ("headroom", sc.headroom)):
        for b in entries:
            spec = {"name": b} if isinstance(b, str) else dict(b)
            if spec["name"] in sc.exclude and kind == "baseline":
                continue
            label = spec.pop("label", None) or spec["name"]
            out.append((label, kind, spec))
    pol = regime_policy(sc)
    if (sc.regime or sc.load) and pol and pol not in {label for label, _, _ in out}:
        out.append((pol, "baseline", {"name": pol}))  # the regime (and `load`'s capacity) is measured on its runs
    for a in agents:
        wanted = a.get("scenarios")
        if (wanted is None and agent_point(a["path"]) == sc.point) or (wanted is not None and sc.key in wanted):
            out.append((a["label"], "agent", str(a["path"])))
    return out


def agent_point(path: str) -> str:
    """Decision point of a trained agent, from its agent.json (no model loading)."""
    p = E.model_file(Path(path))
    for d in (p.parent, p.parent.parent):
        if (d / E.AGENT_META).is_file():
            return json.loads((d / E.AGENT_META).read_text())["point"]
    raise ConfigError(f"agents: {path} has no {E.AGENT_META} (not a pdgym-train run?)")


def _task(sc: BoardScenario, label: str, kind: str, spec: Any, split: dict | None, index: int,
          rate: float | None, budget_s: float | None) -> dict:
    """One (scenario, policy, seed) run, in a worker process; failures come back as a message."""
    try:
        cand = _resolve_cached(label, kind, spec if isinstance(spec, str) else tuple(sorted(spec.items())), sc.point)
        raw = sc.raw(rate)
        out = E.run_one(raw, raw["policy"], cand, split, index, budget_s, oracle=kind == "headroom")
        return {"ok": True, "metrics": out.metrics, "stopped": out.stopped}
    except (ConfigError, ValueError, RuntimeError, FileNotFoundError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


_CACHE: dict = {}


def _resolve_cached(label: str, kind: str, spec, point: str) -> E.Candidate:
    key = (label, kind, spec, point)
    if key not in _CACHE:
        _CACHE[key] = E.resolve(spec if isinstance(spec, str) else dict(spec), point, label=label)
    return _CACHE[key]


def regime_policy(sc: BoardScenario) -> str:
    """The baseline whose runs measure the regime (and the capacity): the declared one, else the
    scenario's configured policy at its decision point."""
    if sc.regime_policy:
        return sc.regime_policy
    pol = sc.raw()["policy"].get(sc.point)
    return pol if isinstance(pol, str) else (pol or {}).get("name", "")


def measure_capacity(sc: BoardScenario, split: dict | None, max_requests: int | None = None) -> float:
    """Requests per second the regime policy sustains on this scenario's traffic (split run 0): every
    request arrives at once, completions per second between the 20% and 80% completion quantiles (of the
    first tokens for a prefill scenario: the stage under test; of the finishes otherwise).
    NaN for a closed loop (its load is concurrency over the running batch; see measure_regime).
    `max_requests` caps the burst (the tier is full well before; a 20K-request pool only slows the run)."""
    raw = sc.raw()
    wl = raw["workload"]
    if wl.get("arrival") == "closed":
        return math.nan
    n = min(int(wl["num_requests"]), int(max_requests)) if max_requests else int(wl["num_requests"])
    burst = dict(raw, workload=dict(wl, arrival="poisson", rate=1e6, time_scale=None, num_requests=n))
    cand = E.resolve(regime_policy(sc), sc.point)
    out = E.run_one(burst, raw["policy"], cand, split, 0)
    fin = out.result.requests.query("status == 'finished'")
    f = np.sort((fin.first_token if sc.point == "prefill" else fin.finish).to_numpy())
    if len(f) < 10:
        return math.nan
    lo, hi = f[int(0.2 * len(f))], f[int(0.8 * len(f)) - 1]
    return float((int(0.8 * len(f)) - int(0.2 * len(f))) / max(hi - lo, 1e-12))


def run_board(scenarios: list[BoardScenario], agents: list[dict], seeds: list[int], split: dict | None,
              n_jobs: int = 1, progress: bool = True, budget_s: float | None = None,
              rates: dict | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """Every (scenario, candidate, seed): returns the per-seed table and the failures."""
    from joblib import Parallel, delayed
    from tqdm import tqdm

    rates = rates or {}
    jobs = [(sc, label, kind, spec, i) for sc in scenarios for label, kind, spec in _candidates(sc, agents)
            for i in seeds]
    par = Parallel(n_jobs=n_jobs, return_as="generator", batch_size=1)
    results = par(delayed(_task)(sc, label, kind, spec, split, i, rates.get(sc.key), budget_s)
                  for sc, label, kind, spec, i in jobs)
    rows, failures = [], []
    for (sc, label, kind, _, i), r in tqdm(zip(jobs, results), total=len(jobs), desc="leaderboard runs",
                                           disable=not progress):
        if r["ok"]:
            rows.append({"scenario": sc.key, "policy": label, "kind": kind, "seed": i, **r["metrics"],
                         "stopped": r["stopped"]})
        else:
            failures.append({"scenario": sc.key, "policy": label, "seed": i, "error": r["error"]})
    return pd.DataFrame(rows), failures


# --------------------------------------------------------------------------- aliases
def merge_aliases(runs: pd.DataFrame, scenarios: list[BoardScenario]) -> tuple[pd.DataFrame, dict]:
    """One row per distinct policy: two baselines of a scenario whose classes are related (one subclasses
    the other: `mb` / `mixed`, `v0` / `prefill_first`) and whose every per-seed metric is equal (wall time
    aside) are one policy; the first name stays, the others are listed as its aliases. Returns the runs
    without the duplicates and {(scenario, policy): [other names]}."""
    from pdgym.baselines.registry import policy_class

    if not len(runs):
        return runs, {}
    value_cols = [c for c in runs.columns if c in E.METRIC_KEYS and c != "wall_time_s"]
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
    mean and 95% percentile-bootstrap interval over seeds."""
    rows = []
    for sc in scenarios:
        sub = runs[runs.scenario == sc.key] if len(runs) else runs
        for pol in rank(sub, sc.primary):
            g = sub[sub.policy == pol]
            kind = g.kind.iloc[0]
            for m in dict.fromkeys([sc.primary, *metrics]):
                s = E.interval(g[m].tolist())
                rows.append({"scenario": sc.key, "policy": pol, "kind": kind, "metric": m, "mean": s["mean"],
                             "ci_low": s["ci_low"], "ci_high": s["ci_high"], "seeds": s["n"]})
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def rank(sub: pd.DataFrame, metric: str) -> list[str]:
    """Policies best first by the mean of `metric` (its direction); NaN last."""
    if not len(sub):
        return []
    means = sub.groupby("policy", sort=False)[metric].mean()
    key = -E.direction(metric) * means
    return list(key.sort_values(na_position="last", kind="stable").index)


def reference(runs: pd.DataFrame, sc: BoardScenario) -> str | None:
    """The best heuristic of a scenario: its best-ranked baseline (headroom rows and agents excluded)."""
    sub = runs[(runs.scenario == sc.key) & (runs.kind == "baseline")] if len(runs) else runs
    order = rank(sub, sc.primary)
    return order[0] if order else None


def paired(runs: pd.DataFrame, scenarios: list[BoardScenario]) -> pd.DataFrame:
    """Per scenario and policy: paired ratio to the reference on the primary metric (bootstrap over the
    seeds both ran), its verdict in words and whether the interval excludes zero."""
    rows = []
    for sc, ref, pol, kind, x, y in pairs_with_reference(runs, scenarios):
        p = E.paired_ratio(x.to_numpy(), y.to_numpy())
        rows.append({"scenario": sc.key, "policy": pol, "kind": kind, "reference": ref,
                     "metric": sc.primary, "rel": p["rel"], "ci_low": p["ci_low"], "ci_high": p["ci_high"],
                     "seeds": p["n"], "verdict": "reference" if pol == ref else
                     E.verdict(sc.primary, p["rel"], p["ci_low"], p["ci_high"]),
                     "sentence": "" if pol == ref else E.describe(sc.primary, pol, ref, p)})
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
    from rliable import metrics as rm

    per: dict[str, list] = {}
    for sc, ref, pol, kind, x, y in pairs_with_reference(runs, scenarios):
        sub = runs[(runs.scenario == sc.key) & (runs.policy == ref)]
        ym = float(sub[sc.primary].mean())  # the reference's mean over all its seeds
        if not math.isfinite(ym) or ym == 0:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            xs, ys = (np.asarray(v, dtype=float) for v in (x, y))
            norm = (xs / ym, ys / ym) if E.direction(sc.primary) > 0 else (ym / xs, ym / ys)
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


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.4g}"


def _cell(table: pd.DataFrame, metric: str, ci: bool = True) -> dict:
    t = table[table.metric == metric].set_index("policy")
    return {p: (f"{_fmt(r['mean'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]" if ci else _fmt(r["mean"]))
            for p, r in t.iterrows()}


def scenario_frame(table: pd.DataFrame, sc: BoardScenario, metrics: list[str], pairs: pd.DataFrame | None = None,
                   aliases: dict | None = None, runs: pd.DataFrame | None = None,
                   drop_constant: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Wide view of one scenario: rank, policy (with its aliases), kind, primary metric with its 95%
    interval, the paired difference to the reference, other means (units in headers), seeds stopped
    early. `drop_constant`: metric columns equal for every policy are dropped and returned as notes."""
    t = table[table.scenario == sc.key]
    pols = list(dict.fromkeys(t.policy))
    kinds = t.drop_duplicates("policy").set_index("policy").kind
    seeds = t[t.metric == sc.primary].set_index("policy").seeds
    aliases = aliases or {}
    names = [p + (f" (= {', '.join(aliases[(sc.key, p)])})" if (sc.key, p) in aliases else "") for p in pols]
    out = pd.DataFrame({"rank": range(1, len(pols) + 1), "policy": names, "kind": [kinds[p] for p in pols]})
    prim = _cell(t, sc.primary)
    out[f"{with_unit(sc.primary)} mean [95% CI]"] = [prim.get(p, "-") for p in pols]
    if pairs is not None and len(pairs):
        pr = pairs[pairs.scenario == sc.key].set_index("policy")
        col = []
        for p in pols:
            if p not in pr.index:
                col.append("-")
            elif pr.loc[p, "verdict"] == "reference":
                col.append("reference")
            else:
                r = pr.loc[p]
                ci = f" [{r.ci_low:+.1%}, {r.ci_high:+.1%}]" if math.isfinite(r.ci_low) else ""
                col.append(f"{r.rel:+.1%}{ci} {r.verdict}")
        out["vs reference (paired)"] = col
    notes = []
    for m in metrics:
        if m == sc.primary or (m.startswith("pool_") and sc.point != "decode"):  # the pool is the router's
            continue
        c = _cell(t, m, ci=False)
        vals = [c.get(p, "-") for p in pols]
        if drop_constant and len(set(vals)) == 1 and len(vals) > 1:
            notes.append(f"{with_unit(m)} = {vals[0]} for every policy")
            continue
        out[with_unit(m)] = vals
    out["seeds"] = [int(seeds.get(p, 0)) for p in pols]
    if runs is not None and len(runs) and "stopped" in runs:
        sub = runs[runs.scenario == sc.key]
        stopped = sub[sub.stopped.fillna("") != ""].groupby("policy").size()
        out["stopped early"] = [int(stopped.get(p, 0)) for p in pols]
    return out, notes


def standings(table: pd.DataFrame, scenarios: list[BoardScenario], pairs: pd.DataFrame | None = None) -> list[dict]:
    """Per scenario: the reference (best heuristic) and the best agent on the primary metric, with the
    paired comparison in words (better / worse / no clear difference)."""
    out = []
    for sc in scenarios:
        t = table[(table.scenario == sc.key) & (table.metric == sc.primary)]
        row = {"scenario": sc.key, "primary": sc.primary,
               "direction": "higher is better" if E.direction(sc.primary) > 0 else "lower is better"}
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


# --------------------------------------------------------------------------- plots
def colours(policies: list[str]) -> dict:
    """One distinct colour per policy (tab20, then tab20b), the same in every plot of a board."""
    import matplotlib

    cmap = [*matplotlib.colormaps["tab20"].colors, *matplotlib.colormaps["tab20b"].colors]
    return {p: cmap[i % len(cmap)] for i, p in enumerate(dict.fromkeys(policies))}


def make_plots(runs: pd.DataFrame, table: pd.DataFrame, scenarios: list[BoardScenario], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    col = colours(list(table.policy))
    paths = []
    for sc in scenarios:
        t = table[(table.scenario == sc.key) & (table.metric == sc.primary)]
        if not len(t):
            continue
        arrow = "higher is better" if E.direction(sc.primary) > 0 else "lower is better"
        paths.append(bars(t, f"{with_unit(sc.primary)}, {arrow}", sc.key, out / f"{sc.key}_{sc.primary}.png", col))
        paths.append(tradeoff(runs[runs.scenario == sc.key], sc.key, out / f"{sc.key}_ttft_tpot.png", col))
    return paths


HATCH = {"agent": "//", "headroom": ".."}


def bars(t: pd.DataFrame, ylabel: str, title: str, path: Path, col: dict | None = None) -> Path:
    """Ranked bars of one metric with 95% intervals, one colour per policy (agents hatched //, headroom
    rows dotted); a log axis where the largest mean is over 20x the smallest (one policy dwarfs the rest)."""
    import matplotlib.pyplot as plt

    col = col or colours(list(t.policy))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * len(t) + 2), 3.8))
    x = np.arange(len(t))
    mean = t["mean"].to_numpy(float)
    err = np.vstack([np.clip(mean - t.ci_low.to_numpy(float), 0, None), np.clip(t.ci_high.to_numpy(float) - mean, 0, None)])
    ax.bar(x, mean, yerr=np.nan_to_num(err), capsize=3, color=[col[p] for p in t.policy],
           hatch=[HATCH.get(k, "") for k in t.kind], edgecolor="black", linewidth=0.5)
    pos = mean[np.isfinite(mean) & (mean > 0)]
    log = len(pos) > 1 and pos.max() > 20 * pos.min()
    if log:
        ax.set_yscale("log")
    ax.set_xticks(x, t.policy, rotation=30, ha="right")
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""), fontsize=8)
    ax.set_title(f"{title} (best first; // agents, .. headroom)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tradeoff(runs: pd.DataFrame, title: str, path: Path, col: dict | None = None) -> Path:
    """Mean TTFT vs mean TPOT per policy with 95% intervals on both axes (agents as squares); log axes
    where one policy is over 20x the others."""
    import matplotlib.pyplot as plt

    col = col or colours(list(runs.policy))
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    xs, ys = [], []
    for pol, g in runs.groupby("policy", sort=False):
        x, y = E.interval(g.tpot_mean), E.interval(g.ttft_mean)
        agent = g.kind.iloc[0] == "agent"
        xerr = [[max(x["mean"] - x["ci_low"], 0)], [max(x["ci_high"] - x["mean"], 0)]]
        yerr = [[max(y["mean"] - y["ci_low"], 0)], [max(y["ci_high"] - y["mean"], 0)]]
        ax.errorbar(x["mean"], y["mean"], xerr=xerr, yerr=yerr, fmt="s" if agent else "o", capsize=3, label=pol,
                    color=col.get(pol))
        xs.append(x["mean"])
        ys.append(y["mean"])
    for vals, setter in ((xs, ax.set_xscale), (ys, ax.set_yscale)):
        v = np.asarray([a for a in vals if math.isfinite(a) and a > 0])
        if len(v) > 1 and v.max() > 20 * v.min():
            setter("log")
    ax.set_xlabel("TPOT mean (s)")
    ax.set_ylabel("TTFT mean (s)")
    ax.set_title(f"{title}: TTFT / TPOT trade-off (lower-left is better)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- writers
@dataclass
class Board:
    """Everything a writer needs about one finished board."""

    scenarios: list[BoardScenario]
    metrics: list[str]
    meta: dict
    table: pd.DataFrame
    runs: pd.DataFrame
    pairs: pd.DataFrame
    agg: pd.DataFrame
    regimes: list[dict]
    rules: list[dict]
    aliases: dict
    failures: list[dict]
    standings: list[dict] = field(default_factory=list)


def _scenario_head(b: Board, i: int) -> tuple[str, str, list[str]]:
    """(title line, regime line, notes) of scenario i, as plain text."""
    sc, rg, rule, st = b.scenarios[i], b.regimes[i], b.rules[i], b.standings[i]
    arrow = "higher is better" if E.direction(sc.primary) > 0 else "lower is better"
    title = (f"`{sc.scenario}` {' '.join(sc.overrides)}; decision point {sc.point}; ranked by {sc.primary} "
             f"({arrow}). {sc.note}").rstrip()
    flag = "in regime" if rg["in_regime"] else f"OUT OF REGIME: {rg['flag']}"
    regime = (f"Regime ({flag}): load {_fmt(rg['load'])} ({rg['load_def']}; capacity {_fmt(rg['capacity_rps'])} "
              f"req/s)" + (f", pool mean {_fmt(rg['pool_mean'])}, empty-pool steps {rg['pool_empty_frac']:.0%}"
                            if math.isfinite(rg["pool_mean"]) else "")
              + f", measured on {rg['regime_policy']}; declared {rg['declared'] or 'nothing'}. {rg['why']}").rstrip()
    notes = []
    for kind in ("agent", "headroom"):
        if st.get(f"{kind}_sentence"):
            notes.append(("Best agent: " if kind == "agent" else "Headroom: ") + st[f"{kind}_sentence"] + ".")
    if sc.headroom_note:
        notes.append(("Headroom rows: " if sc.headroom else "No headroom row: ") + sc.headroom_note)
    if b.meta.get("seeds_added", {}).get(sc.key):
        notes.append(f"Seeds added by the seeds rule: {b.meta['seeds_added'][sc.key]}.")
    if math.isfinite(rule["max_ci_width"]):
        notes.append(f"Seeds: widest paired 95% interval {rule['max_ci_width']:.1%} wide vs the effect to show "
                     f"{sc.effect:.0%}: {'enough' if rule['seeds_enough'] else 'NOT enough seeds'}.")
    else:
        notes.append("Seeds: no paired comparison to judge them by.")
    return title, regime, notes


def write_markdown(b: Board, path: Path) -> str:
    lines = ["# pdgym leaderboard", "", *([f"**{b.meta['banner']}**", ""] if b.meta.get("banner") else []),
             (f"Seeds {b.meta['seeds']} of the `{b.meta['split']}` split (every policy replays the same traffic per "
              f"seed); mean and 95% percentile-bootstrap interval over seeds; `vs reference`: paired ratio of "
              f"means to the best heuristic, minus one, with a paired bootstrap interval. Commit "
              f"{b.meta.get('commit', '?')}, generated {b.meta['generated']}."), ""]
    for i, sc in enumerate(b.scenarios):
        title, regime, notes = _scenario_head(b, i)
        frame, const = scenario_frame(b.table, sc, b.metrics, b.pairs, b.aliases, b.runs, drop_constant=True)
        lines += [f"## {sc.key}", "", title, "", regime, "", frame.to_markdown(index=False), ""]
        if const:
            lines += ["Constant columns: " + "; ".join(const) + ".", ""]
        lines += [*notes, ""]
        stopped = b.runs[(b.runs.scenario == sc.key) & (b.runs.stopped.fillna("") != "")] if len(b.runs) else []
        for _, r in (stopped.iterrows() if len(stopped) else []):
            lines.append(f"- {r.policy} seed {r.seed} stopped early: {r.stopped}")
        lines.append("")
    if len(b.agg):
        lines += ["## Across seeds and scenarios (rliable)", "",
                  "IQM: interquartile mean of the normalised score (1 = the scenario's reference; above 1 is better); "
                  "P(improvement): probability that a run of the policy beats a run of the reference, averaged over "
                  "scenarios.", "", b.agg.to_markdown(index=False, floatfmt=".3f"), ""]
    if b.failures:
        lines += ["## Runs that failed", "", pd.DataFrame(b.failures).to_markdown(index=False), ""]
    text = "\n".join(lines)
    _atomic_write(path, text)
    return text


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


SORT_JS = """<script>
function sortBy(th){const table=th.closest('table');const body=table.tBodies[0];const i=[...th.parentNode.children].indexOf(th);
const asc=th.dataset.dir!=='asc';th.parentNode.querySelectorAll('th').forEach(h=>delete h.dataset.dir);th.dataset.dir=asc?'asc':'desc';
const num=s=>{const m=s.match(/^[-+]?[0-9.]+(e[-+]?[0-9]+)?/i);return m?parseFloat(m[0]):NaN};
[...body.rows].sort((a,b)=>{const x=a.cells[i].textContent,y=b.cells[i].textContent,nx=num(x),ny=num(y);
const c=(isNaN(nx)||isNaN(ny))?x.localeCompare(y):nx-ny;return asc?c:-c}).forEach(r=>body.appendChild(r));}
</script>"""


def _html_table(frame: pd.DataFrame, key: str, cls: str = "leaderboard") -> str:
    head = "".join(f"<th onclick='sortBy(this)' title='click to sort'>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for _, r in frame.iterrows():
        kind = str(r.get("kind", ""))
        rows.append(f"<tr class='{html.escape(kind)}'>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values)
                    + "</tr>")
    return (f"<table class='{cls}' data-scenario='{html.escape(key)}'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def write_html(b: Board, plot_dir: Path, path: Path) -> None:
    """A self-contained page: sortable tables (click a header) and inline base64 plots, no external resources."""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>pdgym leaderboard</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1500px}table{border-collapse:collapse;margin:1em 0}",
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}th{cursor:pointer;background:#f3f3f3}",
        "td:nth-child(2),th:nth-child(2){text-align:left}tr.agent{background:#fff3e0}tr.headroom{background:#eef6ff}",
        ".out{color:#b00020;font-weight:bold}.ok{color:#1b5e20}",
        "img{max-width:640px;margin:4px}.note{color:#555}</style>", SORT_JS, "</head><body>",
        "<h1>pdgym leaderboard</h1>",
        f"<p class='out'>{html.escape(b.meta['banner'])}</p>" if b.meta.get("banner") else "",
        (f"<p class='note'>Seeds {html.escape(str(b.meta['seeds']))} of the <code>{html.escape(str(b.meta['split']))}"
         "</code> split (every policy replays the same traffic per seed); mean and 95% percentile-bootstrap interval "
         "over seeds; <i>vs reference</i>: paired ratio of means to the best heuristic minus one, paired bootstrap "
         f"interval. Commit {html.escape(str(b.meta.get('commit', '?')))}, generated "
         f"{html.escape(b.meta['generated'])}. Rows: orange agents, blue headroom rows (oracles, probes).</p>")]
    for i, sc in enumerate(b.scenarios):
        title, regime, notes = _scenario_head(b, i)
        frame, const = scenario_frame(b.table, sc, b.metrics, b.pairs, b.aliases, b.runs, drop_constant=True)
        cls = "ok" if b.regimes[i]["in_regime"] else "out"
        parts.append(f"<h2 id='{html.escape(sc.key)}'>{html.escape(sc.key)}</h2>"
                     f"<p class='note'>{html.escape(title.replace('`', ''))}</p>"
                     f"<p class='{cls}'>{html.escape(regime)}</p>")
        parts.append(_html_table(frame, sc.key))
        if const:
            parts.append(f"<p class='note'>Constant columns: {html.escape('; '.join(const))}.</p>")
        parts += [f"<p>{html.escape(n)}</p>" for n in notes]
        for name in (f"{sc.key}_{sc.primary}.png", f"{sc.key}_ttft_tpot.png"):
            if (plot_dir / name).is_file():
                parts.append(_img(plot_dir / name))
    if len(b.agg):
        parts.append("<h2>Across seeds and scenarios (rliable)</h2><p class='note'>IQM: interquartile mean of the "
                     "normalised score (1 = the reference; above 1 is better); P(improvement) over the reference.</p>")
        parts.append(_html_table(b.agg.round(3), "aggregate", cls="aggregate"))
    if b.failures:
        parts.append("<h2>Runs that failed</h2>" + pd.DataFrame(b.failures).to_html(index=False))
    parts.append("</body></html>")
    _atomic_write(path, "\n".join(parts))


def print_board(b: Board) -> None:
    """A compact console view: per scenario the ranked policies, the paired comparison in words, the regime."""
    from tabulate import tabulate

    for i, sc in enumerate(b.scenarios):
        keep = [m for m in ("throughput_tok_s", "ttft_mean", "tpot_mean") if m != sc.primary]
        frame, _ = scenario_frame(b.table, sc, keep, b.pairs, b.aliases, b.runs)
        title, regime, notes = _scenario_head(b, i)
        print(f"\n{sc.key} ({sc.scenario}, {sc.point}; ranked by {sc.primary}, "
              f"{'higher' if E.direction(sc.primary) > 0 else 'lower'} is better)")
        print(tabulate(frame.drop(columns=["seeds"]), headers="keys", tablefmt="simple", showindex=False))
        print(regime)
        for n in notes:
            print(n)


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
    seeds = cfg.get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                            and s >= 0 for s in seeds):
        raise ConfigError(f"seeds: got {seeds!r}; must be a non-empty list of integers >= 0")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds: got {seeds!r}; each seed once")
    mx = cfg.get("max_seeds")
    if mx is not None and (isinstance(mx, bool) or not isinstance(mx, int) or mx < len(seeds)):
        raise ConfigError(f"max_seeds: got {mx!r}; must be an integer >= the number of seeds ({len(seeds)}), or null")
    splits = cfg.get("splits") or {}
    if cfg.get("split") is not None and cfg["split"] not in splits:
        raise ConfigError(f"split: got {cfg['split']!r}; allowed: {', '.join(splits)}, null")
    n_jobs = cfg.get("n_jobs")
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or not (n_jobs >= 1 or n_jobs == -1):
        raise ConfigError(f"n_jobs: got {n_jobs!r}; must be an integer >= 1 (or -1: every core)")
    E.check_metric_names("metrics", cfg.get("metrics"))
    E.check_budget("budget_s", cfg.get("budget_s"))
    for key in ("agents", "train"):
        if not isinstance(cfg.get(key) or [], list):
            raise ConfigError(f"{key}: got {cfg.get(key)!r}; must be a list of entries")
    labels = []
    for a in cfg.get("agents") or []:
        if not isinstance(a, dict) or set(a) - {"label", "path", "scenarios"} or "label" not in a or "path" not in a:
            raise ConfigError(f"agents: entry {a!r} must be {{label, path, scenarios (optional)}}")
        labels.append(check_label(a["label"], "agents.label"))
        if not Path(str(a["path"])).exists():
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
        E.check_policies({k: v for k, v in sc.raw()["policy"].items() if k != sc.point})
    return {"seeds": seeds, "scenarios": scenarios}


def board_dir(out: Path) -> Path:
    """A new dated directory under `out` (never an existing one)."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    d = out / stamp
    k = 1
    while d.exists():
        d = out / f"{stamp}_{k}"
        k += 1
    d.mkdir(parents=True)
    return d


def point_latest(out: Path, target: Path) -> None:
    """OUT/latest -> target, replaced atomically."""
    link = out / "latest"
    tmp = out / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target.name, tmp)
    os.replace(tmp, link)


def add_seeds_until_enough(scenarios: list[BoardScenario], agents: list[dict], seeds: list[int], split: dict | None,
                           cfg: dict, budget: float | None, rates: dict) -> tuple[pd.DataFrame, list[dict], dict]:
    """Run the board on `seeds`, then apply the seeds rule: while a scenario's widest paired interval is not
    narrower than its `effect` and it has fewer than `max_seeds` seeds, run it on the next len(seeds) seed
    indices. Returns all runs, all failures and {scenario: seeds added}."""
    max_seeds = int(cfg.get("max_seeds") or len(seeds))
    runs, failures = run_board(scenarios, agents, seeds, split, int(cfg["n_jobs"]), bool(cfg["progress"]), budget,
                               rates)
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
        r2, f2 = run_board(short, agents, more, split, int(cfg["n_jobs"]), bool(cfg["progress"]), budget, rates)
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
    budget = E.check_budget("budget_s", cfg.get("budget_s"))
    root = Path(cfg["out_dir"])
    out = board_dir(root)
    agents = [dict(a) for a in cfg.get("agents") or []]
    agents += train_agents(list(cfg.get("train") or []), out, bool(cfg["progress"]))
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
            "commit": commit, "n_jobs": cfg["n_jobs"], "seeds_added": added, "budget_s": budget,
            "banner": cfg.get("banner") or ""}
    b = Board(scenarios, metrics, meta, table, runs, pairs, agg, regimes, rules, aliases, failures)
    b.standings = standings(table, scenarios, pairs)
    for name, frame in (("leaderboard.csv", table), ("runs.csv", runs), ("paired.csv", pairs),
                        ("aggregate.csv", agg), ("regime.csv", pd.DataFrame(regimes))):
        frame.to_csv(out / (name + ".tmp"), index=False)
        (out / (name + ".tmp")).replace(out / name)
    plot_dir = out / "plots"
    if cfg["plots"]:
        make_plots(runs, table, scenarios, plot_dir)
    write_markdown(b, out / "leaderboard.md")
    write_html(b, plot_dir, out / "leaderboard.html")
    empty = [sc.key for sc in scenarios if not len(runs) or not (runs.scenario == sc.key).any()]
    good = not empty or bool(cfg.get("tolerate_failures"))
    summary = {"out_dir": str(out), "scenarios": [s.key for s in scenarios], "seeds": seeds,
               "runs": len(runs), "failures": failures, "failed_scenarios": empty, "standings": b.standings,
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
        print(f"pdgym-leaderboard: every run failed on {', '.join(empty)} (see {out / 'leaderboard.md'}); "
              f"{root / 'latest'} left unchanged; tolerate_failures=true accepts such a board", file=sys.stderr)
        raise SystemExit(1)
    return summary


def _app_task(cfg) -> dict:
    """The board in Hydra's run (looked up by name: launchers may run it elsewhere)."""
    from pdgym.agents.common import to_container

    return build(to_container(cfg))


def validate(cfg) -> None:
    """`check_config` before Hydra creates the run folder (agents/common.hydra_cli): seeds, split, n_jobs,
    metrics, budget_s, agents / train entries, and every scenario composed once."""
    from pdgym.agents.common import to_container

    check_config(to_container(cfg))


def main(argv: list[str] | None = None) -> None:
    """pdgym-leaderboard: one-line errors, no run folder before the config is checked (agents/common.hydra_cli)."""
    from pdgym.agents.common import hydra_cli

    hydra_cli("pdgym-leaderboard", "leaderboard", validate=validate)(_app_task)(argv)


if __name__ == "__main__":
    sys.exit(main())
