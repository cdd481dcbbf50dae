"""What a person reads of a leaderboard: the wide per-scenario table (units in headers, paired verdicts,
constant columns folded into notes), the Markdown file, the self-contained HTML page (sortable tables,
inline plots) and the console view. Reads a finished `Board`; computes no statistic."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from pdgym.agents.evaluation import stalls
from pdgym.agents.evaluation.leaderboard_run import BoardScenario
from pdgym.agents.evaluation.metric_keys import direction
from pdgym.envs.sim import safe_files

UNITS = {"ttft": "s", "tpot": "s", "e2e": "s", "sched_queue_s": "s", "device_queue_s": "s", "sim_time_s": "s",
         "wall_time_s": "s", "throughput_tok_s": "tok/s", "total_tok_s": "tok/s", "rps": "req/s",
         "goodput_rps": "req/s", "goodput_per_gpu": "req/s/GPU", "imbalance": "KV tokens", "pool_mean": "requests",
         "finished": "requests",
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


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.4g}"


def _cell(table: pd.DataFrame, metric: str, ci: bool = True) -> dict:
    """Policy -> its mean (and interval); STALLED (k/n seeds) where a stopped-early seed took the mean away."""
    t = table[table.metric == metric].set_index("policy")
    out = {}
    for p, r in t.iterrows():
        n_stop = int(r.get("stalled", 0) or 0)
        if n_stop and metric not in stalls.KEPT:
            out[p] = stalls.cell(n_stop, int(r["seeds"]))
        else:
            out[p] = f"{_fmt(r['mean'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]" if ci else _fmt(r["mean"])
    return out


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
    few = len(seeds) and int(seeds.max()) <= 2  # a bootstrap over 2 seeds is their range: said so
    out[f"{with_unit(sc.primary)} mean {'[min, max]' if few else '[95% CI]'}"] = [prim.get(p, "-") for p in pols]
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
    for m in dict.fromkeys([*metrics, *t.metric]):  # the board's metrics, then any the scenario adds (per class)
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
    arrow = "higher is better" if direction(sc.primary) > 0 else "lower is better"
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
    n_seeds = len(b.meta.get("seeds") or []) + len(b.meta.get("seeds_added", {}).get(sc.key) or [])
    if math.isfinite(rule["max_ci_width"]):
        what = "95% interval" if n_seeds > 2 else f"interval (the [min, max] of {n_seeds} seeds' ratios)"
        notes.append(f"Seeds: widest paired {what} {rule['max_ci_width']:.1%} wide vs the effect to show "
                     f"{sc.effect:.0%}: {'enough' if rule['seeds_enough'] else 'NOT enough seeds'}.")
    else:
        notes.append("Seeds: no paired comparison to judge them by.")
    return title, regime, notes


def _interval_words(b: Board) -> str:
    """How the board's intervals are made: a bootstrap over 2 seeds is their range, so the header says so."""
    if len(b.meta.get("seeds") or []) <= 2 and not any((b.meta.get("seeds_added") or {}).values()):
        return "mean and the [min, max] over seeds (2 seeds or fewer: a 95% interval needs more)"
    return "mean and 95% percentile-bootstrap interval over seeds"


def _transfer_lines(b: Board) -> list[str]:
    """One line per agent ranked on a scenario it was not trained on (a transfer), then a blank line; [] if none."""
    lines = [f"Transfer: {t}." for t in b.meta.get("transfers") or []]
    return [*lines, ""] if lines else []


def write_markdown(b: Board, path: Path) -> str:
    lines = ["# pdgym leaderboard", "", *([f"**{b.meta['banner']}**", ""] if b.meta.get("banner") else []),
             (f"Seeds {b.meta['seeds']} of the `{b.meta['split']}` split (every policy replays the same traffic per "
              f"seed); {_interval_words(b)}; `vs reference`: paired ratio of means to the best heuristic, minus one, "
              f"with a paired bootstrap interval. Commit {b.meta.get('commit', '?')}, generated "
              f"{b.meta['generated']}."), "", *_transfer_lines(b)]
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
    safe_files.write_text(path, text)


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
         f"</code> split (every policy replays the same traffic per seed); {html.escape(_interval_words(b))}; "
         "<i>vs reference</i>: paired ratio of means to the best heuristic minus one, paired bootstrap "
         f"interval. Commit {html.escape(str(b.meta.get('commit', '?')))}, generated "
         f"{html.escape(b.meta['generated'])}. Rows: orange agents, blue headroom rows (oracles, probes).</p>"),
        *(f"<p class='out'>{html.escape(line)}</p>" for line in _transfer_lines(b) if line)]
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
              f"{'higher' if direction(sc.primary) > 0 else 'lower'} is better)")
        print(tabulate(frame.drop(columns=["seeds"]), headers="keys", tablefmt="simple", showindex=False))
        print(regime)
        for n in notes:
            print(n)
