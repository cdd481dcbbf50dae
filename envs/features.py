"""Observation features declared once: (name, function, bounds, meaning).

An env's observation is [global part | one row per slot] (slots: prefill instances, decode
workers, DP units). Each env lists its features in two tuples, GLOBAL and ROW, and that one
declaration builds everything else: the vector (`Layout.build`), `obs_layout`, the Box bounds
(each entry clipped to its feature's [low, high]) and the docstring's table (`table`). Adding a
feature is appending one `Feature`; indices, bounds and docs follow.

A feature fills `width` entries: "1", or a product of integers and the env's dimension names
("3 K", "N D", "D"). `fn(ctx)` reads the per-observation context the env prepares once and
returns a float (one entry) or an array of `width` values (None: leave them zero); a row
feature returns one value per filled row (one entry) or a (rows, width) block; padding rows stay
zero. `when` names a
boolean attribute of the env's policy core: the feature exists only when it is true.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces


@dataclass(frozen=True)
class Feature:
    name: str  # short identifier (unique within its part)
    fn: Callable[[Any], Any]  # ctx -> value(s); see the module docstring
    low: float
    high: float
    meaning: str  # the docstring table's text
    width: str = "1"  # entries: a product of integers and dimension names
    when: str | None = None  # a boolean attribute of the core that switches the feature on


def _count(width: str, dims: dict[str, int]) -> int:
    n = 1
    for tok in width.split():
        n *= int(tok) if tok.isdigit() else dims[tok]
    return n


def _offset(terms: list[tuple[str, str | None]]) -> str:
    """Symbolic sum of the widths before a feature: integers folded, each optional feature's terms in
    brackets (one bracket per `when`, in order)."""
    groups: dict[str | None, list] = {}
    for width, when in terms:
        const, parts = groups.setdefault(when, [0, []])
        if width.isdigit():
            groups[when][0] = const + int(width)
        else:
            parts.append(width)
    out = []
    for when, (const, parts) in groups.items():
        text = " + ".join(([str(const)] if const else []) + parts)
        if when is None:
            out.append(text or "0")
        elif text:
            out.append(f"[+ {text}]")
    return " ".join(out) if out else "0"


def _select(placed: list[tuple[int, Callable]]) -> tuple[slice | np.ndarray, list[Callable]]:
    """Where the one-entry features go (a slice when they are contiguous: the common case, cheaper) and their fns."""
    idx = [i for i, _ in placed]
    sel = slice(idx[0], idx[-1] + 1) if idx and idx == list(range(idx[0], idx[-1] + 1)) else np.array(idx, dtype=np.intp)
    return sel, [fn for _, fn in placed]


class Layout:
    """The features that apply to one core (its `when` flags) at given dimensions, and their positions."""

    def __init__(self, glob: Sequence[Feature], row: Sequence[Feature], core: Any, dims: dict[str, int],
                 n_slots: int):
        def place(fs):
            scalars, blocks, lo, hi, off = [], [], [], [], 0
            for f in fs:
                if f.when is not None and not getattr(core, f.when):
                    continue
                w = _count(f.width, dims)
                (scalars.append((off, f.fn)) if w == 1 else blocks.append((off, off + w, f.fn)))
                lo += [f.low] * w
                hi += [f.high] * w
                off += w
            return scalars, blocks, lo, hi, off

        gs, self._g_blocks, lo, hi, self.global_dim = place(glob)
        rs, self._r_blocks, rlo, rhi, self.slot_dim = place(row)
        self._g_sel, self._g_fns = _select(gs)
        self._r_sel, self._r_fns = _select(rs)
        self.n_slots = n_slots
        self.size = self.global_dim + n_slots * self.slot_dim
        self.low = np.array(lo + rlo * n_slots, dtype=np.float64)
        self.high = np.array(hi + rhi * n_slots, dtype=np.float64)
        # the bounds in float32 (every shipped bound is float32-exact, so clipping after the cast equals casting
        # after the clip): build fills and clips one float32 vector, a third of the NumPy calls per observation
        self._lo32, self._hi32 = self.low.astype(np.float32), self.high.astype(np.float32)
        assert np.array_equal(self._lo32, self.low) and np.array_equal(self._hi32, self.high), "bounds not float32-exact"

    @property
    def obs_layout(self) -> dict:
        return {"n_slots": self.n_slots, "per_slot_dim": self.slot_dim, "global_dim": self.global_dim,
                "slots_first": False, "mask_index": 0}

    def box(self) -> spaces.Box:
        return spaces.Box(self.low.astype(np.float32), self.high.astype(np.float32), dtype=np.float32)

    def build(self, ctx: Any, n_rows: int) -> np.ndarray:
        """The observation: every feature's `fn(ctx)` (None: zeros), rows 0..n_rows-1 filled, clipped to the bounds."""
        out = np.zeros(self.size, dtype=np.float32)
        g = self.global_dim
        out[self._g_sel] = [fn(ctx) for fn in self._g_fns]
        for a, b, fn in self._g_blocks:
            v = fn(ctx)
            if v is not None:
                out[a:b] = v
        rows = out[g:].reshape(self.n_slots, self.slot_dim)[:n_rows]
        if n_rows:
            rows.T[self._r_sel] = [fn(ctx) for fn in self._r_fns]
        for a, b, fn in self._r_blocks:
            rows[:, a:b] = fn(ctx)
        np.maximum(out, self._lo32, out=out)
        return np.minimum(out, self._hi32, out=out)


class LayoutCore:
    """Mixin of an env's policy core whose observation is its `layout` (a Layout) and whose actions are
    Discrete(`n_actions`): the spaces and the extractors' `obs_layout` follow from them."""

    layout: Layout
    n_actions: int

    @property
    def obs_layout(self) -> dict:
        return self.layout.obs_layout

    def spaces(self) -> tuple[spaces.Box, spaces.Space]:
        return self.layout.box(), spaces.Discrete(self.n_actions)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def table(glob: Sequence[Feature], row: Sequence[Feature], row_name: str = "slot i") -> str:
    """The docstring table of a declaration: index (symbolic; [+ ...]: only when that optional feature is
    on), entries, meaning, bounds. G is the global part's size, R a row's."""
    lines = ["| index | entries | feature | min | max |", "|---|---|---|---|---|"]

    def rows(fs, prefix):
        terms: list[tuple[str, str | None]] = []
        for f in fs:
            cond = f"(`{f.when}`) " if f.when else ""
            lines.append(f"| {prefix}{_offset(terms)} | {f.width} | {cond}{f.meaning} | {_num(f.low)} | "
                         f"{_num(f.high)} |")
            terms.append((f.width, f.when))

    rows(glob, "")
    rows(row, f"G + R {row_name.split()[-1]} + ")
    return "\n    ".join(lines)


def parse_table(doc: str) -> list[tuple[str, str, float, float]]:
    """(entries, feature, min, max) of each row of the feature table in a docstring (tests read it back)."""
    out: list[tuple[str, str, float, float]] = []
    lines = iter(doc.splitlines())
    for line in lines:
        if line.strip().startswith("| index | entries |"):
            break
    next(lines, None)  # the |---| line
    for line in lines:
        if not line.strip().startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out.append((cells[1], cells[2], float(cells[3]), float(cells[4])))
    return out
