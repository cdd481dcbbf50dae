"""The leaderboard's figures: ranked bars of each scenario's primary metric and the TTFT / TPOT trade-off,
one colour per policy across every plot of a board."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from pdgym.agents.evaluation import stalls
from pdgym.agents.evaluation.leaderboard_render import with_unit
from pdgym.agents.evaluation.leaderboard_run import BoardScenario
from pdgym.agents.evaluation.metric_keys import direction
from pdgym.agents.evaluation.stats import interval
from pdgym.envs.sim.safe_files import make_dir, save_figure


def colours(policies: list[str]) -> dict:
    """One distinct colour per policy (tab20, then tab20b), the same in every plot of a board."""
    import matplotlib

    cmap = [*matplotlib.colormaps["tab20"].colors, *matplotlib.colormaps["tab20b"].colors]
    return {p: cmap[i % len(cmap)] for i, p in enumerate(dict.fromkeys(policies))}


def make_plots(runs: pd.DataFrame, table: pd.DataFrame, scenarios: list[BoardScenario], out: Path) -> list[Path]:
    make_dir(out, "plots")
    col = colours(list(table.policy))
    paths = []
    for sc in scenarios:
        t = table[(table.scenario == sc.key) & (table.metric == sc.primary)]
        if not len(t):
            continue
        arrow = "higher is better" if direction(sc.primary) > 0 else "lower is better"
        paths.append(bars(t, f"{with_unit(sc.primary)}, {arrow}", sc.key, out / f"{sc.key}_{sc.primary}.png", col))
        paths.append(tradeoff(runs[runs.scenario == sc.key], sc.key, out / f"{sc.key}_ttft_tpot.png", col))
    return paths


HATCH = {"agent": "//", "headroom": ".."}
SAME = 1e-9  # relative spread under which a metric is the same for every policy (e.g. decode_ht_n16's TTFT: the
# decode router does not touch prefill, so every router's runs have the same first tokens)


def same_for_all(values) -> float | None:
    """The common value when every policy's mean is the same (to SAME, relative), else None: an axis drawn for it
    would spread one number over a tick range and read as a difference."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if len(v) < 2:
        return None
    return float(v.mean()) if float(np.ptp(v)) <= SAME * max(float(np.abs(v).max()), 1e-300) else None


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "lightyellow", "edgecolor": "grey"})


def bars(t: pd.DataFrame, ylabel: str, title: str, path: Path, col: dict | None = None) -> Path:
    """Ranked bars of one metric with 95% intervals, one colour per policy (agents hatched //, headroom
    rows dotted); a log axis where the largest mean is over 20x the smallest (one policy dwarfs the rest)."""
    import matplotlib.pyplot as plt

    col = col or colours(list(t.policy))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * len(t) + 2), 3.8))
    x = np.arange(len(t))
    mean = t["mean"].to_numpy(float)
    same = same_for_all(mean)
    if same is not None:  # no bars: one number for every policy, said once
        metric = ylabel.split(",")[0]
        _note(ax, f"{metric} = {same:.4g} for every policy\n({', '.join(t.policy)})")
        ax.set_axis_off()
        ax.set_title(f"{title}: {metric} is the same for every policy", fontsize=9)
        fig.tight_layout()
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        return path
    err = np.vstack([np.clip(mean - t.ci_low.to_numpy(float), 0, None), np.clip(t.ci_high.to_numpy(float) - mean, 0, None)])
    ax.bar(x, mean, yerr=np.nan_to_num(err), capsize=3, color=[col[p] for p in t.policy],
           hatch=[HATCH.get(k, "") for k in t.kind], edgecolor="black", linewidth=0.5)
    pos = mean[np.isfinite(mean) & (mean > 0)]
    log = len(pos) > 1 and pos.max() > 20 * pos.min()
    if log:
        ax.set_yscale("log")
    if "stalled" in t:  # a policy with a stopped-early seed has no mean: said where its bar would be
        for xi, n_stop in zip(x, t.stalled.fillna(0).astype(int)):
            if n_stop:
                ax.text(xi, 0.02, stalls.MARK, transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                        va="bottom", fontsize=8, color="#b00020")
    ax.set_xticks(x, t.policy, rotation=30, ha="right")
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""), fontsize=8)
    ax.set_title(f"{title} (best first; // agents, .. headroom)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def tradeoff(runs: pd.DataFrame, title: str, path: Path, col: dict | None = None) -> Path:
    """Mean TTFT vs mean TPOT per policy with 95% intervals on both axes (agents as squares); log axes
    where one policy is over 20x the others. A metric that is the same for every policy (same_for_all) gets
    no axis: the other one is drawn alone, a row per policy, and a note in the panel gives the common value."""
    import matplotlib.pyplot as plt

    col = col or colours(list(runs.policy))
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    runs = stalls.mask_runs(runs, ("ttft_mean", "tpot_mean"))
    stalled = [str(p) for p, g in runs.groupby("policy", sort=False) if "stopped" in g and stalls.n_stopped(g.stopped)]
    runs = runs[~runs.policy.isin(stalled)]
    stats = [(pol, g.kind.iloc[0] == "agent", {"tpot_mean": interval(g.tpot_mean), "ttft_mean": interval(g.ttft_mean)})
             for pol, g in runs.groupby("policy", sort=False)]
    same = {k: same_for_all([s[2][k]["mean"] for s in stats]) for k in ("ttft_mean", "tpot_mean")}
    notes = [f"{k} = {v:.4g} s for every policy" for k, v in same.items() if v is not None]
    if stalled:
        fig.text(0.01, 0.01, f"{stalls.MARK} (a seed stopped early, no mean): {', '.join(stalled)}", fontsize=7,
                 color="#b00020")

    def err(iv: dict) -> list:
        return [[max(iv["mean"] - iv["ci_low"], 0)], [max(iv["ci_high"] - iv["mean"], 0)]]

    if len(notes) == 2:
        _note(ax, "\n".join(notes))
        ax.set_axis_off()
        ax.set_title(f"{title}: TTFT and TPOT are the same for every policy", fontsize=9)
    elif notes:  # one metric varies: a row per policy along its axis
        key = "tpot_mean" if same["ttft_mean"] is not None else "ttft_mean"
        for k, (pol, agent, iv) in enumerate(stats):
            ax.errorbar(iv[key]["mean"], k, xerr=err(iv[key]), fmt="s" if agent else "o", capsize=3, color=col.get(pol))
        ax.set_yticks(range(len(stats)), [s[0] for s in stats], fontsize=7)
        ax.set_ylim(len(stats) - 0.5, -0.5)
        # the common value goes under the axis, not in the panel, where it could hide a policy's point
        ax.set_xlabel(f"{key.split('_')[0].upper()} mean (s), lower is better\n{notes[0]}")
        other = "TTFT" if key == "tpot_mean" else "TPOT"
        ax.set_title(f"{title}: {key.split('_')[0].upper()} ({other} is the same for every policy)", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    else:
        for pol, agent, iv in stats:
            x, y = iv["tpot_mean"], iv["ttft_mean"]
            ax.errorbar(x["mean"], y["mean"], xerr=err(x), yerr=err(y), fmt="s" if agent else "o", capsize=3,
                        label=pol, color=col.get(pol))
        for key, setter in (("tpot_mean", ax.set_xscale), ("ttft_mean", ax.set_yscale)):
            v = np.asarray([m for m in (s[2][key]["mean"] for s in stats) if math.isfinite(m) and m > 0])
            if len(v) > 1 and v.max() > 20 * v.min():
                setter("log")
        ax.set_xlabel("TPOT mean (s)")
        ax.set_ylabel("TTFT mean (s)")
        ax.set_title(f"{title}: TTFT / TPOT trade-off (lower-left is better)", fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a board whose every row stalled has no point to name
            ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
