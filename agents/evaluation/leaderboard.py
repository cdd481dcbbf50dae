"""`pdgym-leaderboard`: every registered baseline and every listed agent on every leaderboard scenario.

    pdgym-leaderboard                    # conf/leaderboard.yaml: 4 scenarios x all baselines x 5 seeds
    pdgym-leaderboard preset=quick       # the `make run` board: fewer requests and seeds + a quick agent

Writes runs/leaderboard/leaderboard.{csv,md,html} (csv columns: scenario, policy, kind, metric, mean,
ci_low, ci_high, seeds), runs.csv (every seed's metrics) and plots/ (per scenario: primary-metric bars
with 95% intervals, TTFT/TPOT trade-off scatter). The HTML page is self-contained (images inline).

Every run goes through `simulate()` on the test split (conf/splits), the traffic no agent trains on.
A new baseline appears by registering it; a new scenario is one entry under `scenarios:`; a new agent
is one entry under `agents:` (a pdgym-train run directory) or `train:` (trained first, then ranked).
"""

from __future__ import annotations

import base64
import html
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pdgym.agents.evaluation import evaluate as E
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import write_json

CSV_COLUMNS = ["scenario", "policy", "kind", "metric", "mean", "ci_low", "ci_high", "seeds"]


@dataclass
class BoardScenario:
    """One leaderboard scenario: a named scenario + overrides, the decision point under test, its ranking."""

    key: str
    scenario: str
    point: str
    primary: str
    overrides: list[str] = field(default_factory=list)
    policies: dict = field(default_factory=dict)  # fixed baselines at the other decision points
    baselines: list | None = None  # None: every registered baseline of `point`
    exclude: list[str] = field(default_factory=list)  # registered baselines left out (e.g. oracle-only)
    note: str = ""

    def raw(self) -> dict:
        from pdgym.envs.scenario import load_scenario

        raw = load_scenario(self.scenario, list(self.overrides)).raw
        pol = dict(raw.get("policy") or {})
        pol.update(self.policies)
        return dict(raw, policy=pol)


def board_scenarios(spec: dict) -> list[BoardScenario]:
    out = []
    allowed = [f for f in BoardScenario.__dataclass_fields__ if f != "key"]
    for key, s in spec.items():
        if s is None:  # a preset removes a scenario by setting it to null
            continue
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
        out.append(BoardScenario(key=key, **s))
    return out


# --------------------------------------------------------------------------- running
def _candidates(sc: BoardScenario, agents: list[dict]) -> list[tuple[str, str, Any]]:
    """(label, kind, spec) of everything ranked on a scenario; spec: baseline spec or model path."""
    from pdgym.baselines import registered

    names = sc.baselines if sc.baselines is not None else registered(sc.point)
    out = []
    for b in names:
        spec = {"name": b} if isinstance(b, str) else dict(b)
        if spec["name"] in sc.exclude:
            continue
        label = spec.pop("label", None) or spec["name"]
        out.append((label, "baseline", spec))
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


def _task(sc: BoardScenario, label: str, kind: str, spec: Any, split: dict | None, index: int) -> dict:
    """One (scenario, policy, seed) run, in a worker process; failures come back as a message."""
    try:
        cand = _resolve_cached(label, kind, spec if isinstance(spec, str) else tuple(sorted(spec.items())), sc.point)
        res = E.run_one(sc.raw(), sc.raw()["policy"], cand, split, index)
        return {"ok": True, "metrics": E.run_metrics(res)}
    except (ConfigError, ValueError, RuntimeError, FileNotFoundError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


_CACHE: dict = {}


def _resolve_cached(label: str, kind: str, spec, point: str) -> E.Candidate:
    key = (label, kind, spec, point)
    if key not in _CACHE:
        _CACHE[key] = E.resolve(spec if isinstance(spec, str) else dict(spec), point, label=label)
    return _CACHE[key]


def run_board(scenarios: list[BoardScenario], agents: list[dict], seeds: list[int], split: dict | None,
              n_jobs: int = 1, progress: bool = True) -> tuple[pd.DataFrame, list[dict]]:
    """Every (scenario, candidate, seed): returns the per-seed table and the failures."""
    from joblib import Parallel, delayed
    from tqdm import tqdm

    jobs = [(sc, label, kind, spec, i) for sc in scenarios for label, kind, spec in _candidates(sc, agents)
            for i in seeds]
    par = Parallel(n_jobs=n_jobs, return_as="generator", batch_size=1)
    results = par(delayed(_task)(sc, label, kind, spec, split, i) for sc, label, kind, spec, i in jobs)
    rows, failures = [], []
    for (sc, label, kind, _, i), r in tqdm(zip(jobs, results), total=len(jobs), desc="leaderboard runs",
                                           disable=not progress):
        if r["ok"]:
            rows.append({"scenario": sc.key, "policy": label, "kind": kind, "seed": i, **r["metrics"]})
        else:
            failures.append({"scenario": sc.key, "policy": label, "seed": i, "error": r["error"]})
    return pd.DataFrame(rows), failures


# --------------------------------------------------------------------------- tables
def summarise(runs: pd.DataFrame, scenarios: list[BoardScenario], metrics: list[str]) -> pd.DataFrame:
    """Long table (CSV_COLUMNS): one row per scenario x policy x metric, policies ranked by the primary metric."""
    rows = []
    for sc in scenarios:
        sub = runs[runs.scenario == sc.key] if len(runs) else runs
        order = rank(sub, sc.primary)
        for pol in order:
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


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.4g}"


def _cell(table: pd.DataFrame, metric: str, ci: bool = True) -> dict:
    t = table[table.metric == metric].set_index("policy")
    return {p: (f"{_fmt(r['mean'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]" if ci else _fmt(r["mean"]))
            for p, r in t.iterrows()}


def scenario_frame(table: pd.DataFrame, sc: BoardScenario, metrics: list[str]) -> pd.DataFrame:
    """Wide view of one scenario: rank, policy, kind, primary metric with its 95% interval, other means."""
    t = table[table.scenario == sc.key]
    pols = list(dict.fromkeys(t.policy))
    kinds = t.drop_duplicates("policy").set_index("policy").kind
    seeds = t[t.metric == sc.primary].set_index("policy").seeds
    out = pd.DataFrame({"rank": range(1, len(pols) + 1), "policy": pols, "kind": [kinds[p] for p in pols]})
    prim = _cell(t, sc.primary)
    out[f"{sc.primary} (95% CI)"] = [prim.get(p, "-") for p in pols]
    for m in metrics:
        if m != sc.primary:
            c = _cell(t, m, ci=False)
            out[m] = [c.get(p, "-") for p in pols]
    out["seeds"] = [int(seeds.get(p, 0)) for p in pols]
    return out


def standings(table: pd.DataFrame, scenarios: list[BoardScenario]) -> list[dict]:
    """Per scenario: the best baseline and the best agent on the primary metric (the goal of issue 6)."""
    out = []
    for sc in scenarios:
        t = table[(table.scenario == sc.key) & (table.metric == sc.primary)]
        best = {}
        for kind in ("baseline", "agent"):
            k = t[t.kind == kind]
            if len(k):
                best[kind] = k.iloc[0]  # already ranked
        row = {"scenario": sc.key, "primary": sc.primary}
        for kind, r in best.items():
            row[f"best_{kind}"] = r.policy
            row[f"{kind}_mean"] = r["mean"]
        if len(best) == 2 and best["baseline"]["mean"]:
            rel = best["agent"]["mean"] / best["baseline"]["mean"] - 1
            row["agent_vs_baseline"] = rel
            row["agent_better"] = bool(E.direction(sc.primary) * rel > 0)
        out.append(row)
    return out


# --------------------------------------------------------------------------- plots
def make_plots(runs: pd.DataFrame, table: pd.DataFrame, scenarios: list[BoardScenario], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for sc in scenarios:
        t = table[(table.scenario == sc.key) & (table.metric == sc.primary)]
        if not len(t):
            continue
        paths.append(bars(t, f"{sc.primary} (mean, 95% CI)", sc.key, out / f"{sc.key}_{sc.primary}.png"))
        paths.append(tradeoff(runs[runs.scenario == sc.key], sc.key, out / f"{sc.key}_ttft_tpot.png"))
    return paths


def bars(t: pd.DataFrame, ylabel: str, title: str, path: Path) -> Path:
    """Ranked bars of one metric with 95% intervals; agents in orange, baselines in blue."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * len(t) + 2), 3.8))
    x = np.arange(len(t))
    ax.bar(x, t["mean"], yerr=((t.ci_high - t.ci_low) / 2).fillna(0.0), capsize=3,
           color=["tab:orange" if k == "agent" else "tab:blue" for k in t.kind])
    ax.set_xticks(x, t.policy, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (best first; orange: agents)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tradeoff(runs: pd.DataFrame, title: str, path: Path) -> Path:
    """Mean TTFT vs mean TPOT per policy with 95% intervals on both axes (agents as squares)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for pol, g in runs.groupby("policy", sort=False):
        x, y = E.interval(g.tpot_mean), E.interval(g.ttft_mean)
        agent = g.kind.iloc[0] == "agent"
        ax.errorbar(x["mean"], y["mean"], xerr=(x["ci_high"] - x["ci_low"]) / 2,
                    yerr=(y["ci_high"] - y["ci_low"]) / 2, fmt="s" if agent else "o", capsize=3, label=pol)
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
def write_markdown(table: pd.DataFrame, scenarios: list[BoardScenario], metrics: list[str], meta: dict,
                   failures: list[dict], path: Path) -> str:
    lines = ["# pdgym leaderboard", "",
             (f"Seeds {meta['seeds']} of the `{meta['split']}` split; mean and 95% Student-t interval over seeds. "
             f"Ranked by each scenario's primary metric."), ""]
    st = standings(table, scenarios)
    for sc, s in zip(scenarios, st):
        arrow = "higher is better" if E.direction(sc.primary) > 0 else "lower is better"
        lines += [f"## {sc.key}", "", f"`{sc.scenario}` {' '.join(sc.overrides)}; decision point **{sc.point}**; "
                  f"primary metric `{sc.primary}` ({arrow}). {sc.note}".rstrip(), ""]
        lines += [scenario_frame(table, sc, metrics).to_markdown(index=False), ""]
        if "agent_vs_baseline" in s:
            lines += [(f"Best agent `{s['best_agent']}` vs best baseline `{s['best_baseline']}`: "
                      f"{s['agent_vs_baseline']:+.1%} on `{sc.primary}` "
                      f"({'better' if s['agent_better'] else 'not better'})."), ""]
    if failures:
        lines += ["## Runs that failed", "", pd.DataFrame(failures).to_markdown(index=False), ""]
    text = "\n".join(lines)
    path.write_text(text)
    return text


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def write_html(table: pd.DataFrame, scenarios: list[BoardScenario], metrics: list[str], meta: dict,
               failures: list[dict], plot_dir: Path, path: Path) -> None:
    """A self-contained page: tables and inline base64 plots, no external resources."""
    st = standings(table, scenarios)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>pdgym leaderboard</title><style>",
        "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}",
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}",
        "td:nth-child(2),th:nth-child(2){text-align:left}tr.agent{background:#eef6ff}",
        "img{max-width:640px;margin:4px}.note{color:#555}</style></head><body>",
        "<h1>pdgym leaderboard</h1>",
        (f"<p class='note'>Seeds {html.escape(str(meta['seeds']))} of the <code>{html.escape(str(meta['split']))}"
        f"</code> split; mean and 95% Student-t interval over seeds; generated {html.escape(meta['generated'])}."
        "</p>")]
    for sc, s in zip(scenarios, st):
        frame = scenario_frame(table, sc, metrics)
        arrow = "higher is better" if E.direction(sc.primary) > 0 else "lower is better"
        parts.append(f"<h2 id='{html.escape(sc.key)}'>{html.escape(sc.key)}</h2><p class='note'>"
                     f"<code>{html.escape(sc.scenario)}</code> {html.escape(' '.join(sc.overrides))}; decision point "
                     f"<b>{sc.point}</b>; ranked by <code>{sc.primary}</code> ({arrow}). {html.escape(sc.note)}</p>")
        head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
        body = "".join(f"<tr class='{r['kind']}'>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values)
                       + "</tr>" for _, r in frame.iterrows())
        parts.append(f"<table class='leaderboard' data-scenario='{html.escape(sc.key)}'><thead><tr>{head}</tr>"
                     f"</thead><tbody>{body}</tbody></table>")
        if "agent_vs_baseline" in s:
            parts.append(f"<p>Best agent <b>{html.escape(s['best_agent'])}</b> vs best baseline "
                         f"<b>{html.escape(s['best_baseline'])}</b>: {s['agent_vs_baseline']:+.1%} on "
                         f"<code>{sc.primary}</code>.</p>")
        for name in (f"{sc.key}_{sc.primary}.png", f"{sc.key}_ttft_tpot.png"):
            if (plot_dir / name).is_file():
                parts.append(_img(plot_dir / name))
    if failures:
        parts.append("<h2>Runs that failed</h2>" + pd.DataFrame(failures).to_html(index=False))
    parts.append("</body></html>")
    path.write_text("\n".join(parts))


# --------------------------------------------------------------------------- training entries
def print_board(table: pd.DataFrame, scenarios: list[BoardScenario], st: list[dict]) -> None:
    """A compact console view: per scenario the ranked policies on the primary metric and key metrics."""
    from tabulate import tabulate

    for sc, s in zip(scenarios, st):
        frame = scenario_frame(table, sc, [m for m in ("throughput_tok_s", "ttft_mean", "tpot_mean")
                                           if m != sc.primary])
        print(f"\n{sc.key} ({sc.scenario}, {sc.point}; ranked by {sc.primary})")
        print(tabulate(frame.drop(columns=["seeds"]), headers="keys", tablefmt="simple", showindex=False))
        if "agent_vs_baseline" in s:
            print(f"best agent {s['best_agent']} vs best baseline {s['best_baseline']}: "
                  f"{s['agent_vs_baseline']:+.1%} on {sc.primary}")


def train_agents(entries: list[dict], out: Path) -> list[dict]:
    """Train each `train:` entry with pdgym-train's code (in this process) and list it as an agent."""
    agents = []
    if not entries:
        return agents
    from pdgym.agents.training import train

    for e in entries:
        e = dict(e)
        label = e.pop("label")
        run = out / "agents" / label
        train.train_from_overrides(list(e.pop("overrides", [])), run, name=label)
        agents.append({"label": label, "path": str(run), "scenarios": e.pop("scenarios", None)})
        if e:
            raise ConfigError(f"train.{label}.{next(iter(e))}: unknown key; allowed: label, overrides, scenarios")
    return agents


# --------------------------------------------------------------------------- the app
def build(cfg: dict) -> dict:
    """Run the whole board from a plain config dict; returns paths and the standings."""
    t0 = time.perf_counter()
    scenarios = board_scenarios(cfg["scenarios"])
    seeds = list(cfg["seeds"])
    if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError(f"seeds: got {seeds!r}; must be a non-empty list of integers >= 0")
    split = cfg["splits"][cfg["split"]] if cfg.get("split") else None
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    agents = [dict(a) for a in cfg.get("agents") or []]
    for a in agents:
        if set(a) - {"label", "path", "scenarios"} or "label" not in a or "path" not in a:
            raise ConfigError(f"agents: entry {a} must have label, path (and optional scenarios)")
    agents += train_agents(list(cfg.get("train") or []), out)
    runs, failures = run_board(scenarios, agents, seeds, split, int(cfg["n_jobs"]), bool(cfg["progress"]))
    metrics = list(cfg["metrics"])
    table = summarise(runs, scenarios, metrics)
    table.to_csv(out / "leaderboard.csv", index=False)
    runs.to_csv(out / "runs.csv", index=False)
    meta = {"seeds": seeds, "split": cfg.get("split"), "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    plot_dir = out / "plots"
    if cfg["plots"]:
        make_plots(runs, table, scenarios, plot_dir)
    write_markdown(table, scenarios, metrics, meta, failures, out / "leaderboard.md")
    write_html(table, scenarios, metrics, meta, failures, plot_dir, out / "leaderboard.html")
    st = standings(table, scenarios)
    summary = {"out_dir": str(out), "scenarios": [s.key for s in scenarios], "seeds": seeds,
               "runs": len(runs), "failures": failures, "standings": st,
               "wall_time_s": time.perf_counter() - t0}
    write_json(out / "summary.json", summary)
    if cfg.get("print", True):
        print_board(table, scenarios, st)
        print(f"\nleaderboard: {out / 'leaderboard.md'} | {out / 'leaderboard.html'} | {out / 'leaderboard.csv'}; "
              f"plots in {plot_dir}/ ({summary['wall_time_s']:.0f} s)")
    return summary


def main() -> None:
    import hydra
    from pdgym.agents.common import check_group_choices, one_line_errors, to_container

    check_group_choices(sys.argv[1:], "pdgym-leaderboard")

    @hydra.main(version_base=None, config_path="pkg://pdgym.conf", config_name="leaderboard")
    def _main(cfg) -> None:
        from pdgym.agents.evaluation.leaderboard import build as run  # by import: launchers may run this elsewhere

        one_line_errors("pdgym-leaderboard")(run)(to_container(cfg))

    _main()


if __name__ == "__main__":
    sys.exit(main())
