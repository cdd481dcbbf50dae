"""Observation features declared once: (name, function, bounds, meaning).

An env's observation is [global part | one row per slot] (slots: prefill instances, decode
workers, DP units). Each env lists its features in two tuples, GLOBAL and ROW, and that one
declaration builds everything else: the vector (`Layout.build`), `obs_layout`, the Box bounds
(each entry clipped to its feature's [low, high]) and the docstring's table (`table`). Adding a
feature is appending one `Feature`; indices, bounds and docs follow.

A feature fills `width` entries: "1", or a product of integers and the env's dimension names
("3 K", "N D", "D"). `fn(ctx)` reads the per-observation context the env prepares once and
returns a float (one entry) or an array of `width` values (None: leave them zero). A row
feature is computed for all rows at once (`fn(ctx)`: one value per filled row, or a (rows, width)
block: the form for rows held in arrays) or, with `per_row`, once per filled row (`fn(ctx, i, row)`:
a float, or `width` values; row = the i-th of the row objects `build` is given: the form for rows
that are Python objects, which a per-feature list over the rows would walk once per feature).
Padding rows stay zero. `when` names a boolean attribute of the env's policy core: the feature
exists only when it is true.

`Layout` compiles a declaration once (each feature's slice of the vector, the contiguous runs of
one-entry features as one slice) so that building an observation is one NumPy assignment per
group of features, not per feature: it runs at every env step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

# the most rows an env's observation option may ask for (env.obs_requests, env.window): the observation is a dense
# Box of rows x features built at every step, and an MLP's first layer holds rows x features x width weights, so
# beyond a few thousand rows nothing trains; obs_requests=10**9 asked for gigabytes (a MemoryError traceback)
MAX_OBS_ROWS = 4096


def check_rows(value: Any, key: str, allow_none: bool = False) -> int | None:
    """An observation's row count option: an integer in [1, MAX_OBS_ROWS] (or None when allowed), else one line."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 1 <= value <= MAX_OBS_ROWS
    if not ok:
        from pdgym.envs.sim.validation import ConfigError, shown

        raise ConfigError(f"{key}: got {shown(value)}; must be an integer in [1, {MAX_OBS_ROWS}]"
                          + (" or null" if allow_none else "") + " (rows of the observation, built at every step)")
    return int(value)


@dataclass(frozen=True)
class Feature:
    name: str  # short identifier (unique within its part)
    fn: Callable[..., Any]  # ctx -> value(s), or (ctx, i, row) -> value(s) with per_row; see the module docstring
    low: float
    high: float
    meaning: str  # the docstring table's text
    width: str = "1"  # entries: a product of integers and dimension names
    when: str | None = None  # a boolean attribute of the core that switches the feature on
    per_row: bool = False  # a row feature computed row by row: fn(ctx, i, row)
    saturates: bool = False  # values past the bounds are meant to be clipped (a burst ratio): the bound is a cap


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


def _index(idx: list[int]) -> slice | np.ndarray:
    """Positions as a slice when they are contiguous (the common case: a view, cheaper), else an index array."""
    if idx and idx == list(range(idx[0], idx[-1] + 1)):
        return slice(idx[0], idx[-1] + 1)
    return np.array(idx, dtype=np.intp)


def _covers(sel: slice | np.ndarray, n: int) -> bool:
    """Whether positions `sel` (from _index) are 0..n-1 in order."""
    return n == 0 or (isinstance(sel, slice) and sel == slice(0, n))


class Layout:
    """The features that apply to one core (its `when` flags) at given dimensions, compiled: their
    positions, the bounds, and the groups `build` fills with one assignment each."""

    def __init__(self, glob: Sequence[Feature], row: Sequence[Feature], core: Any, dims: dict[str, int],
                 n_slots: int):
        def place(fs):
            on, lo, hi, off = [], [], [], 0
            for f in fs:
                if f.when is not None and not getattr(core, f.when):
                    continue
                w = _count(f.width, dims)
                on.append((off, w, f))
                lo += [f.low] * w
                hi += [f.high] * w
                off += w
            return on, lo, hi, off

        g, lo, hi, self.global_dim = place(glob)
        r, rlo, rhi, self.slot_dim = place(row)

        def names(on, suffix=""):
            return [f"{f.name}{f'[{k}]' if w > 1 else ''}{suffix}" for _, w, f in on for k in range(w)]
        self.names = names(g) + [n for s in range(n_slots) for n in names(r, f"@slot{s}")]  # one per entry
        capped = [f.saturates for _, w, f in g for _ in range(w)] + [f.saturates for _, w, f in r for _ in range(w)] * n_slots
        self._capped = np.array(capped, dtype=bool)
        # None: build clips silently (the envs' contract); a list: build also appends "name=value" of every entry
        # it had to clip (or NaN), so a test can tell a declared bound that is false (test_shared_api)
        self.clipped: list[str] | None = None
        self.n_slots = n_slots
        self.size = self.global_dim + n_slots * self.slot_dim
        self.low = np.array(lo + rlo * n_slots, dtype=np.float64)
        self.high = np.array(hi + rhi * n_slots, dtype=np.float64)
        # the bounds in float32 (every shipped bound is float32-exact, so clipping after the cast equals casting
        # after the clip): build fills and clips one float32 vector, a third of the NumPy calls per observation
        self._lo32, self._hi32 = self.low.astype(np.float32), self.high.astype(np.float32)
        assert np.array_equal(self._lo32, self.low) and np.array_equal(self._hi32, self.high), "bounds not float32-exact"

        # the compiled groups: one-entry features of a kind share one assignment (positions: _index)
        g_one = [(a, f) for a, w, f in g if w == 1]
        self._g_sel, self._g_fns = _index([a for a, _ in g_one]), tuple(f.fn for _, f in g_one)
        self._g_blocks = tuple((a, a + w, f.fn) for a, w, f in g if w > 1)
        whole = [(a, w, f) for a, w, f in r if not f.per_row]
        r_one = [(a, f) for a, w, f in whole if w == 1]
        self._r_sel, self._r_fns = _index([a for a, _ in r_one]), tuple(f.fn for _, f in r_one)
        self._r_blocks = tuple((a, a + w, f.fn) for a, w, f in whole if w > 1)
        # per-row features: one list per row, its one-entry values first, then each block's values
        each = [(a, w, f) for a, w, f in r if f.per_row]
        e_one, e_blocks = [x for x in each if x[1] == 1], [x for x in each if x[1] > 1]
        self._e_sel = _index([a for a, _, _ in e_one] + [a + k for a, w, _ in e_blocks for k in range(w)])
        self._e_fns = tuple(f.fn for _, _, f in e_one)
        self._e_block_fns = tuple(f.fn for _, _, f in e_blocks)
        self._has_g, self._has_e = bool(g_one), bool(each)
        # every entry a one-entry global or a per-row feature, in order: the whole observation is one list of
        # floats and one assignment (PhaseBatching's shape)
        self._flat = (not self._g_blocks and not whole and _covers(self._g_sel, self.global_dim)
                      and (not each or _covers(self._e_sel, self.slot_dim)))

    @property
    def obs_layout(self) -> dict:
        return {"n_slots": self.n_slots, "per_slot_dim": self.slot_dim, "global_dim": self.global_dim,
                "slots_first": False, "mask_index": 0}

    def box(self) -> spaces.Box:
        return spaces.Box(self.low.astype(np.float32), self.high.astype(np.float32), dtype=np.float32)

    def build(self, ctx: Any, n_rows: int, rows: Sequence | None = None) -> np.ndarray:
        """The observation: every feature's value(s) (None: zeros), rows 0..n_rows-1 filled, clipped to the
        bounds. `rows`: the n_rows row objects the per_row features read (default: the row indices)."""
        out = np.zeros(self.size, dtype=np.float32)
        if self._flat:
            v = [fn(ctx) for fn in self._g_fns]
            if n_rows and self._has_e:
                v += self._per_row(ctx, n_rows, rows)
            out[:len(v)] = v
        else:
            if self._has_g:
                out[self._g_sel] = [fn(ctx) for fn in self._g_fns]
            for a, b, fn in self._g_blocks:
                v = fn(ctx)
                if v is not None:
                    out[a:b] = v
            if n_rows:
                g = self.global_dim
                r = out[g:g + n_rows * self.slot_dim].reshape(n_rows, self.slot_dim)
                if self._r_fns:
                    r.T[self._r_sel] = [fn(ctx) for fn in self._r_fns]
                for a, b, fn in self._r_blocks:
                    r[:, a:b] = fn(ctx)
                if self._has_e:
                    r[:, self._e_sel] = np.reshape(self._per_row(ctx, n_rows, rows), (n_rows, -1))
        if self.clipped is not None:
            bad = np.flatnonzero(~((out >= self._lo32) & (out <= self._hi32) | self._capped))
            self.clipped += [f"{self.names[i]}={out[i]:g}" for i in bad.tolist()]
        np.maximum(out, self._lo32, out=out)
        return np.minimum(out, self._hi32, out=out)

    def _per_row(self, ctx: Any, n_rows: int, rows: Sequence | None) -> list:
        """The per_row features' values, row after row (each row: its one-entry values, then each block's)."""
        v: list = []
        for i, row in enumerate(range(n_rows) if rows is None else rows):
            v += [fn(ctx, i, row) for fn in self._e_fns]
            for fn in self._e_block_fns:
                v += fn(ctx, i, row)
        return v


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
