"""Matplotlib figures written next to the numbers (headless: the Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def ttft_cdf(tables: dict[str, pd.DataFrame], path: Path) -> Path:
    """Empirical CDF of TTFT per policy set."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, req in tables.items():
        x = np.sort(req.loc[req.status == "finished", "ttft"].to_numpy())
        if len(x):
            ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=label)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def decode_kv_spread(steps: dict[str, pd.DataFrame], path: Path, window: int = 400) -> Path | None:
    """Max and min worker KV per decode step over a window of steps, one panel per policy set."""
    sets = {k: s[s.kind == 1].head(window) for k, s in steps.items()}
    sets = {k: s for k, s in sets.items() if len(s)}
    if not sets:
        return None
    fig, axes = plt.subplots(len(sets), 1, figsize=(7, 2.2 * len(sets)), sharex=True, squeeze=False)
    for ax, (label, s) in zip(axes[:, 0], sets.items()):
        x = np.arange(len(s))
        ax.fill_between(x, s.kv_min, s.kv_max, alpha=0.35)
        ax.plot(x, s.kv_max, lw=0.8)
        ax.set_ylabel("worker KV")
        ax.set_title(label, fontsize=9)
    axes[-1, 0].set_xlabel("decode step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bars(values: dict[str, float], ylabel: str, path: Path, errors: dict[str, float] | None = None) -> Path:
    """One bar per label (optionally with error bars)."""
    fig, ax = plt.subplots(figsize=(max(4, 0.8 * len(values) + 2), 3.5))
    labels = list(values)
    ax.bar(labels, [values[k] for k in labels],
           yerr=[errors[k] for k in labels] if errors else None, capsize=3)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def lines(x: list, series: dict[str, list], xlabel: str, ylabel: str, path: Path,
          marks: dict[str, float] | None = None) -> Path:
    """Several y(x) curves on one axis, with optional vertical marks."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, y in series.items():
        ax.plot(x, y, marker="o", label=label)
    for label, xv in (marks or {}).items():
        ax.axvline(xv, ls="--", color="k", lw=0.8)
        ax.annotate(label, (xv, ax.get_ylim()[1]), fontsize=8, ha="left", va="top")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
