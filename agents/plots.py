"""Matplotlib figures written next to the numbers (headless: the Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
from pdgym.envs.sim.events import PassKind

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from pdgym.envs.sim.safe_files import save_figure


def decode_kv_spread(steps: dict[str, pd.DataFrame], path: Path, window: int = 400) -> Path | None:
    """Max and min worker KV per decode step, one panel per policy set and one band per decode instance, over
    `window` steps from the middle of each instance's run (past the ramp-up): the spread the barrier waits
    on. None (no figure) when no set has a decode step (a colocated cluster)."""
    sets = {k: s[s.kind == PassKind.DECODE] for k, s in steps.items()}
    sets = {k: s for k, s in sets.items() if len(s)}
    if not sets:
        return None
    fig, axes = plt.subplots(len(sets), 1, figsize=(7, 2.4 * len(sets)), sharex=True, squeeze=False)
    for ax, (label, s) in zip(axes[:, 0], sets.items()):
        by_inst = list(s.groupby("inst", sort=True))
        for inst, g in by_inst:
            first = max(0, len(g) // 2 - window // 2)
            g = g.iloc[first:first + window]
            x = np.arange(first, first + len(g))
            (line,) = ax.plot(x, g.kv_max, lw=0.8, label=f"decode instance {inst}")
            ax.fill_between(x, g.kv_min, g.kv_max, alpha=0.3, color=line.get_color(), lw=0)
        ax.set_ylabel("worker KV (tokens)")
        ax.set_title(f"{label}: min-max band over the workers, {window} steps from mid-run", fontsize=9)
        if len(by_inst) > 1:
            ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("decode step of the instance")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
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
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


def lines(x: list, series: dict[str, list], xlabel: str, ylabel: str, path: Path,
          marks: dict[str, float] | None = None) -> Path:
    """Several y(x) curves on one axis, with optional vertical marks."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (label, y) in enumerate(series.items()):  # past the 10 colours of the cycle, a new line style
        ax.plot(x, y, marker="os^"[i // 10 % 3], ls=("-", "--", ":")[i // 10 % 3], label=label)
    lo, hi = ax.get_xlim()
    for label, xv in (marks or {}).items():  # the label inside the axes: right of a mark on the left half, else left
        ax.axvline(xv, ls="--", color="k", lw=0.8)
        left = xv < (lo + hi) / 2
        ax.annotate(f" {label} ", (xv, ax.get_ylim()[1]), fontsize=8, ha="left" if left else "right", va="top")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


LATENCIES = (  # (requests-table expression, axis label): what latency_cdfs draws, one panel each
    ("ttft", "TTFT (s)"),
    ("tpot", "TPOT (s / token)"),
    ("e2e", "end-to-end latency (s)"),
    ("sched_delay", "scheduling delay (s): scheduler + device queue"),
)


def latency_samples(req: pd.DataFrame) -> dict[str, np.ndarray]:
    """Finished requests' TTFT, TPOT (outputs > 1 token), end-to-end latency and scheduling delay
    (time buffered at the scheduler + queued on a prefill device), each sorted."""
    fin = req[req.status == "finished"]
    cols = {"ttft": fin.ttft, "tpot": fin.tpot, "e2e": fin.e2e, "sched_delay": fin.sched_queue + fin.device_queue}
    return {k: np.sort(v.dropna().to_numpy(dtype=float)) for k, v in cols.items()}


def latency_cdfs(tables: dict[str, pd.DataFrame], path: Path) -> Path:
    """Empirical CDFs of TTFT, TPOT, end-to-end latency and scheduling delay, policy sets overlaid.

    A panel uses a log x axis when every sample is positive and they span over 30x.
    """
    samples = {label: latency_samples(req) for label, req in tables.items()}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, xlabel) in zip(axes.flat, LATENCIES):
        drawn = [x for s in samples.values() if len(x := s[key])]
        for label, s in samples.items():
            x = s[key]
            if len(x):
                p50, p99 = np.percentile(x, [50, 99])
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post",
                        label=f"{label} (p50 {p50:.3g}, p99 {p99:.3g})")
        if not drawn:
            ax.text(0.5, 0.5, "no finished request", ha="center", va="center", transform=ax.transAxes)
        else:
            lo = min(float(x[0]) for x in drawn)
            hi = max(float(x[-1]) for x in drawn)
            if lo > 0 and hi / lo > 30:
                ax.set_xscale("log")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of finished requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def _pass_segments(t: np.ndarray, dur: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A per-pass value as a step curve over [t, t + dur], broken (NaN) where the instance was idle."""
    end = t + dur
    gap = np.append(t[1:] > end[:-1] + 1e-12, True)
    xs = np.column_stack([t, end, end]).ravel()
    ys = np.column_stack([y, y, np.where(gap, np.nan, y)]).ravel()
    return xs, ys


def instance_timeseries(steps: pd.DataFrame, path: Path, title: str = "", requests: pd.DataFrame | None = None
                        ) -> Path | None:
    """Per-instance time series from the step table as steps.csv holds it (pass kinds by name),
    one panel per quantity: prefill tokens per pass,
    decode batch (requests), KV tokens per DP unit (max, and min dashed), utilisation (chunk
    or batch slots) and barrier idle. Each pass holds its value over [t, t + dur]; lines break
    where the instance sat idle. With a prefix cache (`requests` with cached tokens), a last panel
    gives each prefill instance's token hit ratio over its last 100 dispatched requests."""
    if not len(steps):
        return None
    s = steps
    panels = [
        ("prefill tokens / pass", s.kind != "decode", lambda g: g.tokens - np.where(g.kind == "colocated", g.reqs, 0)),
        ("decode batch (requests)", s.kind != "prefill", lambda g: g.reqs),
        ("KV tokens per DP unit\n(max; min dashed)", s.kind != "prefill", lambda g: g.kv_max),
        ("utilisation\n(chunk or batch slots)", s.kind.notna(), lambda g: g.util),
        ("barrier idle_frac\n(steps table)", s.kind.notna(), lambda g: g.idle_frac),
    ]
    panels = [p for p in panels if p[1].any()]
    hits = requests is not None and "cached" in requests and bool((requests.cached > 0).any())
    n_axes = len(panels) + int(hits)
    fig, axes = plt.subplots(n_axes, 1, figsize=(10, 1.9 * n_axes + 0.6), sharex=True, squeeze=False)
    groups = list(s.groupby(["kind", "inst"], sort=False))
    colors = {key: plt.get_cmap("tab10")(i % 10) for i, (key, _) in enumerate(groups)}
    for ax, (ylabel, mask, value) in zip(axes[:, 0], panels):
        for (role, inst), g in groups:
            g = g[mask.loc[g.index]]
            if not len(g):
                continue
            xs, ys = _pass_segments(g.t.to_numpy(), g.dur.to_numpy(), np.asarray(value(g), dtype=float))
            ax.plot(xs, ys, lw=0.7, color=colors[(role, inst)], label=f"{role} {inst}")
            if ylabel.startswith("KV"):
                xs, ys = _pass_segments(g.t.to_numpy(), g.dur.to_numpy(), g.kv_min.to_numpy(dtype=float))
                ax.plot(xs, ys, lw=0.6, ls="--", color=colors[(role, inst)])
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    if hits:
        ax = axes[len(panels), 0]
        r = requests[requests.prefill_inst >= 0].sort_values("dispatch")
        for inst, g in r.groupby("prefill_inst"):
            ratio = g.cached.rolling(100, min_periods=10).sum() / g.prompt.rolling(100, min_periods=10).sum()
            ax.plot(g.dispatch, ratio, lw=0.7, color=colors.get(("prefill", inst), "gray"))
        ax.set_ylabel("prefix hit ratio\n(tokens, last 100 req.)", fontsize=8)
        ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes[1:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper right", fontsize=7, ncol=min(len(labels), 6))
    axes[-1, 0].set_xlabel("simulated time (s)")
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def default_windows(passes, n_passes: int = 12) -> dict[str, tuple[float, float]]:
    """Per pass kind, a window of about `n_passes` typical passes from the middle of the run
    (past the warm-up), so each kind's barrier idle is wide enough to see."""
    out = {}
    for kind in dict.fromkeys(p.kind for p in passes):
        ps = [p for p in passes if p.kind == kind]
        span = n_passes * float(np.median([p.dur for p in ps]))
        last = max(p.t + p.dur for p in ps)
        t0 = max(min(ps[len(ps) // 2].t, last - span), ps[0].t)  # full of passes when the run allows
        out[kind] = (t0, t0 + span)
    return out


def timeline_bars(passes, kind: str, window: tuple[float, float], row_of: dict[tuple[int, int], int]
                  ) -> tuple[dict[int, list], dict[int, list]]:
    """(start, length) bars per timeline row of the `kind` passes overlapping `window`: the whole
    pass (band) and the unit's busy part; row_of maps (instance, unit) to a row."""
    t0, t1 = window
    band: dict[int, list] = {i: [] for i in row_of.values()}
    busy: dict[int, list] = {i: [] for i in row_of.values()}
    for p in passes:
        if p.kind != kind or p.t >= t1 or p.t + p.dur <= t0:
            continue
        for u, b in enumerate(p.busy.tolist()):
            r = row_of[(p.inst, u)]
            band[r].append((p.t, p.dur))
            if b > 0:
                busy[r].append((p.t, b))
    return band, busy


def timeline(passes, path: Path, windows: dict[str, tuple[float, float]] | None = None, title: str = "") -> Path | None:
    """Passes on every DP unit, one row per unit grouped by instance, one panel per pass kind:
    the pass (barrier to barrier) in a pale band, the unit's busy time solid on top; the
    pale part is the unit's barrier idle, white is time with no pass at all."""
    if not passes:
        return None
    windows = windows or default_windows(passes)
    kinds = [k for k in windows if any(p.kind == k for p in passes)]
    rows = {k: sorted({(p.inst, u) for p in passes if p.kind == k for u in range(len(p.busy))}) for k in kinds}
    heights = [max(len(rows[k]), 6) for k in kinds]
    fig, axes = plt.subplots(len(kinds), 1, figsize=(11, 0.5 + 0.15 * sum(heights) + 0.9 * len(kinds)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    colors = {"prefill": "tab:blue", "decode": "tab:orange", "colocated": "tab:green"}
    for ax, kind in zip(axes[:, 0], kinds):
        t0, t1 = windows[kind]
        row_of = {key: i for i, key in enumerate(rows[kind])}
        band, busy = timeline_bars(passes, kind, (t0, t1), row_of)
        c = colors.get(kind, "tab:gray")
        for r in row_of.values():
            ax.broken_barh(band[r], (r - 0.42, 0.84), facecolors=c, alpha=0.18, lw=0)
            ax.broken_barh(busy[r], (r - 0.42, 0.84), facecolors=c, lw=0)
        insts = sorted({i for i, _ in rows[kind]})
        ticks = [np.mean([row_of[k] for k in rows[kind] if k[0] == i]) for i in insts]
        dps = {i: sum(1 for k in rows[kind] if k[0] == i) for i in insts}
        ax.set_yticks(ticks, [f"{kind} {i}{chr(10) if dps[i] > 2 else ' '}(DP {dps[i]})" for i in insts], fontsize=8)
        for i in insts[1:]:
            ax.axhline(min(row_of[k] for k in rows[kind] if k[0] == i) - 0.5, color="k", lw=0.6)
        ax.set_ylim(len(row_of) - 0.5, -0.5)
        ax.set_xlim(t0, t1)
        ax.set_xlabel("simulated time (s)", fontsize=8)
        ax.set_title(f"{kind} passes: solid = unit busy, pale = barrier idle (waiting for the slowest unit), "
                     "white = no pass", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def profile_fit(df: pd.DataFrame, path: Path, title: str) -> None:
    """A pdgym-profile table against its roofline fit: prefill passes by tokens, decode steps by batch (a line
    per context), and fitted against measured (apps/profile.py writes it; experiments/calibration.py redraws the
    shipped ones)."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    pre = df[df.phase == "prefill"].sort_values("tokens")
    ax1.loglog(pre.tokens, pre.time_s * 1e3, "o", label="measured")
    ax1.loglog(pre.tokens, pre.fitted_s * 1e3, "-", label="roofline fit")
    ax1.set(xlabel="prefill tokens (one prompt)", ylabel="pass time (ms)", title="prefill")
    dec = df[df.phase == "decode"]
    for i, (ctx, g) in enumerate(dec.groupby("ctx")):
        g = g.sort_values("batch")
        ax2.loglog(g.batch, g.time_s * 1e3, "o", color=f"C{i}", label=f"measured, ctx {ctx}")
        ax2.loglog(g.batch, g.fitted_s * 1e3, "-", color=f"C{i}", label=f"fit, ctx {ctx}")
    ax2.set(xlabel="decode batch", ylabel="step time (ms)", title="decode")
    lo, hi = df[["time_s", "fitted_s"]].min().min() * 1e3, df[["time_s", "fitted_s"]].max().max() * 1e3
    for ph, mk in (("prefill", "o"), ("decode", "s")):
        sub = df[df.phase == ph]
        ax3.loglog(sub.time_s * 1e3, sub.fitted_s * 1e3, mk, label=ph)
    ax3.loglog([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax3.set(xlabel="measured (ms)", ylabel="fitted (ms)", title="fitted vs measured")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    def plain_ticks(axis, values) -> None:
        """Labels at `values` as plain numbers, none on minor ticks: matplotlib's log labels either crowd a narrow
        range with overlapping minor labels or leave it with one label."""
        axis.set_major_locator(FixedLocator(sorted(set(values))))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())

    def spread(lo, hi):  # five values from lo to hi, two significant digits
        return [float(f"{v:.2g}") for v in np.geomspace(lo, hi, 5)]

    for ax in (ax1, ax2, ax3):
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
    plain_ticks(ax1.xaxis, [int(v) for v in pre.tokens])  # x: the grid's own values
    plain_ticks(ax2.xaxis, [int(v) for v in dec.batch])
    for axis, ax in ((ax1.yaxis, ax1), (ax2.yaxis, ax2), (ax3.xaxis, ax3), (ax3.yaxis, ax3)):
        lim = ax.get_ylim() if axis is ax.yaxis else ax.get_xlim()
        plain_ticks(axis, spread(*lim))
        (ax.set_ylim if axis is ax.yaxis else ax.set_xlim)(lim)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
