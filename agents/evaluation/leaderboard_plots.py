"""The leaderboard's figures: ranked bars of each scenario's primary metric and the TTFT / TPOT trade-off,
one colour per policy across every plot of a board."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from pdgym.agents.evaluation import evaluate as E
from pdgym.agents.evaluation.leaderboard_render import with_unit
from pdgym.agents.evaluation.leaderboard_run import BoardScenario


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
