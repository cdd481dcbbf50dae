"""What the envs' render() shows: the cluster at the current decision, as text ("ansi") or an image
("rgb_array", drawn with matplotlib's Agg backend).

One view for every env: each prefill instance's DP units (tokens queued / on the wire / in the
pass against the chunk budget), each decode instance's workers (batch against the batch limit,
KV tokens against capacity), each colocated instance's units (running against slots, KV, waiting),
the scheduler buffer and the decode pool. Only reads the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BAR = 12  # characters of a text bar


@dataclass
class Unit:
    label: str
    load: float  # fraction of the unit's load budget (chunk, batch limit or slots); may exceed 1
    load_text: str
    kv: float | None  # fraction of KV capacity in use (None: not tracked, e.g. prefill units)
    kv_text: str = ""


@dataclass
class Group:
    name: str
    units: list[Unit] = field(default_factory=list)


@dataclass
class View:
    header: str
    line: str
    groups: list[Group]


def cluster_view(sim, point: str, line: str) -> View:
    """The cluster as a View; `line` says what the agent is deciding."""
    groups: list[Group] = []
    for i, p in enumerate(getattr(sim, "prefill", [])):
        state = "up" if sim.prefill_healthy[i] else "down"
        g = Group(f"prefill {i} [{state}]")
        for d in range(p.dp):
            q, fl, run = int(p.queued_tokens[d]), int(p.inflight_tokens[d]), int(p.running_tokens[d])
            g.units.append(Unit(f"unit {d}", (q + fl + run) / p.chunk_tokens,
                                f"{q + fl + run:>6}/{p.chunk_tokens} tok (pass {run}, queued {q}, wire {fl})", None))
        groups.append(g)
    for i, d in enumerate(getattr(sim, "decode", [])):
        g = Group(f"decode {i}")
        for w in range(d.dp):
            kv, cap = int(d.kv[w]), int(d.kv_cap[w])
            g.units.append(Unit(f"worker {w}", d.batch[w] / d.batch_limit, f"{int(d.batch[w]):>4}/{d.batch_limit} req",
                                kv / cap, f"{kv:>8}/{cap} KV tok"))
        groups.append(g)
    for i, c in enumerate(getattr(sim, "colocated", [])):
        g = Group(f"colocated {i}")
        for k, u in enumerate(c.units):
            g.units.append(Unit(f"unit {k}", u.n_running / u.slots,
                                f"{u.n_running:>4}/{u.slots} req, {len(u.waiting)} waiting",
                                u.kv_used / u.kv_cap, f"{u.kv_used:>8}/{u.kv_cap} KV tok"))
        groups.append(g)
    rejected = sim.n_resolved - len(sim.completed)
    header = (f"t = {sim.now:.3f} s | agent: {point} | finished {len(sim.completed)} rejected {rejected} | "
              f"scheduler buffer {len(sim.buffer)}" + (f" | decode pool {len(sim.pool)}" if getattr(sim, "decode", None) else ""))
    return View(header, line, groups)


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _bar(x: float) -> str:
    n = int(round(min(max(x, 0.0), 1.0) * BAR))
    return "[" + "#" * n + "." * (BAR - n) + ("]" if x <= 1.0 else ">")


def to_text(view: View) -> str:
    out = [view.header, view.line]
    for g in view.groups:
        out.append(g.name)
        for u in g.units:
            row = f"  {u.label:<9} load {_bar(u.load)} {u.load_text}"
            if u.kv is not None:
                row += f"  KV {_bar(u.kv)} {u.kv_text}"
            out.append(row)
    return "\n".join(out) + "\n"


def to_rgb(view: View) -> np.ndarray:
    """The view as an RGB image (H, W, 3) uint8: a load bar and a KV bar per unit, instances stacked
    with their names between them. The size depends only on the cluster's shape, so the frames of an
    episode stack into a video."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    y, labels, load, kv, heads = [], [], [], [], []
    pos = 0.0
    for g in view.groups:
        heads.append((pos, g.name))
        pos += 1.0
        for u in g.units:
            y.append(pos)
            labels.append(u.label)
            load.append(min(u.load, 1.5))
            kv.append(u.kv if u.kv is not None else np.nan)
            pos += 1.0
        pos += 0.4
    y, load, kv = np.array(y), np.array(load), np.array(kv)
    height = max(2.2, 1.0 + 0.17 * pos)
    fig = Figure(figsize=(8.0, height), dpi=80)
    fig.subplots_adjust(left=0.14, right=0.98, top=1 - 0.55 / height, bottom=0.45 / height)
    ax = fig.add_subplot()
    ax.barh(y - 0.2, load, height=0.38, color="tab:blue", label="load (chunk / batch limit / slots)")
    if not np.isnan(kv).all():
        ax.barh(y + 0.2, np.nan_to_num(kv), height=0.38, color="tab:orange", label="KV (capacity)")
    for p, name in heads:
        ax.text(-0.01, p, name, fontsize=7, fontweight="bold", ha="right", va="center",
                transform=ax.get_yaxis_transform())
        ax.axhline(p - 0.7, color="lightgrey", lw=0.6)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlim(0, 1.5)
    ax.set_ylim(pos - 0.4, -0.7)
    ax.set_yticks(y, labels, fontsize=6)
    ax.tick_params(axis="x", labelsize=6)
    ax.set_xlabel("fraction of the unit's budget", fontsize=7)
    ax.legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{view.header}\n{_short(view.line, 110)}", fontsize=8, x=0.01, y=1 - 0.08 / height, ha="left")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()
