"""One harness for every reproduction: its config, seeds, results tables, figures, regime checks, summary.

A reproduction is a function `fn(exp: Experiment) -> dict` wrapped by `@experiment`, which turns it
into the `run(cfg, out)` runner that `pdgym-repro NAME` calls (conf/repro/NAME.yaml names it). The
harness owns what every reproduction used to repeat: reading the `repro` block, the seeds and the
simulator config, writing results.csv / results.md atomically, naming figures, and the regime check.

Regime: a paper effect holds in a regime (load against capacity, pool occupancy, ...). A reproduction
states each condition with `exp.regime(point, quantity, value, lo, hi)`; a point outside its band is
listed in the summary's `regime.out_of_regime` and printed, never dropped silently. The summary gets
`regime` and `figures` (the PNGs written) next to the reproduction's own fields.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property, wraps
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from omegaconf import OmegaConf
from pdgym.agents.common import sim_config_from, to_container
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, safe_files
from pdgym.envs.sim.config import SimConfig
from pdgym.envs.sim.validation import check_seed_list


def write_text(path: Path, text: str) -> None:
    """Atomic text write: a reader never sees half a file (safe_files.atomic_path)."""
    safe_files.write_text(path, text)


MAX_DOC_BYTES = 16 * safe_files.MiB  # a document a generated block is written into (docs/fidelity.md: a few kB)


def write_marked(path: Path, tag: str, block: str, head: str = "") -> None:
    """Replace the text between `<!-- TAG:begin -->` and `<!-- TAG:end -->` in `path` with `block`, keeping the
    hand-written text around it (a new file: `head`, then the block); atomic. Generated tables live in docs
    beside the prose that reads them."""
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    text = safe_files.read_text(path, MAX_DOC_BYTES, str(path)) if os.path.lexists(path) else head
    marked = f"{begin}\n{block.rstrip()}\n{end}"
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        text = before + marked + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + marked + "\n"
    write_text(path, text)


def _fits(x, kind: str, sign: str) -> bool:
    """One list element against a kind (names, integers, numbers) and sign ("", " > 0", " >= 0"): the checks of
    `check_lists` (inferred from the defaults)."""
    if kind == "names":
        return isinstance(x, str) and bool(x)
    if isinstance(x, bool) or not isinstance(x, int if kind == "integers" else (int, float)) or not math.isfinite(x):
        return False
    return not sign or (x > 0 if sign == " > 0" else x >= 0)


def repro_seeds(cfg) -> list[int]:
    """`repro.seeds` (checked: a non-empty list of integers >= 0), or the run's one `seed` when it has none."""
    s = cfg.repro.get("seeds")
    if s is None:
        return [int(cfg.seed)]
    s = list(s) if OmegaConf.is_list(s) else s
    return check_seed_list(s, "repro.seeds")


def check_lists(block, defaults, may_be_empty=frozenset()) -> None:
    """The reproduction's list parameters against its own defaults, before any run folder exists.

    A key whose default is a non-empty list of scalars must get a list of the same kind (integers,
    numbers or names), non-empty unless the reproduction declares it optional (`may_be_empty`), with the
    defaults' sign (all > 0 or all >= 0 stays so); a `*_range` is two ascending numbers. Without this an
    empty `repro.N` or `repro.classic` crashed mid-run with a traceback."""
    for key, dv in defaults.items():
        if not (OmegaConf.is_list(dv) and len(dv) and all(isinstance(x, (int, float, str)) for x in dv)):
            continue
        dv, v = list(dv), block.get(key)
        v = list(v) if OmegaConf.is_list(v) else v
        kind = ("names" if all(isinstance(x, str) for x in dv)
                else "integers" if all(isinstance(x, int) and not isinstance(x, bool) for x in dv) else "numbers")
        sign = "" if kind == "names" else " > 0" if min(dv) > 0 else " >= 0" if min(dv) >= 0 else ""
        optional = key in may_be_empty
        ok = isinstance(v, list) and (bool(v) or optional) and all(_fits(x, kind, sign) for x in v)
        if key.endswith("_range"):
            ok = ok and len(v) == 2 and v[0] < v[1]
            want = f"two ascending numbers{sign}, e.g. {dv}"
        else:
            want = f"{'a' if optional else 'a non-empty'} list of {kind}{sign}, e.g. {dv}"
        if not ok:
            raise ConfigError(f"repro.{key}: got {v!r}; must be {want}")


def check_scalars(block, defaults, may_be_null=None, within: dict[str, str] | None = None) -> None:
    """The reproduction's scalar parameters against its own defaults, before any run folder exists.

    A key whose default is a flag must get a flag; a whole number, a whole number; a number, a number; a name, a
    non-empty name; a number default >= 0 keeps that sign. Null is refused unless the reproduction declares the
    key in `may_be_null` ({key: an example of its non-null kind, or None for "like the default"}); a key whose
    default is null is checked only through that example. Without this `repro.ttft_target_s=abc` ended in a
    ValueError traceback and `repro.num_requests=abc` started running. A key with a declared range (`within`,
    checked next by `check_within`) names that range here too, so every bad value of it reads the same rule."""
    may_be_null = dict(may_be_null or {})
    within = dict(within or {})
    for key, dv in defaults.items():
        if key == "runner" or OmegaConf.is_config(dv):
            continue
        like = may_be_null.get(key) if may_be_null.get(key) is not None else dv
        if like is None or OmegaConf.is_config(like):
            continue
        v = block.get(key)
        if v is None and key in may_be_null:
            continue
        if isinstance(like, bool):
            ok, want = isinstance(v, bool), "true or false"
        elif isinstance(like, str):
            ok, want = isinstance(v, str) and bool(v), "a non-empty name"
        else:
            kind = "integers" if isinstance(like, int) else "numbers"
            sign = " >= 0" if like >= 0 else ""
            ok = _fits(v, kind, sign)
            noun = "a whole number" if kind == "integers" else "a number"
            want = f"{noun} in {within[key]}" if key in within else f"{noun}{sign}"
        if not ok:
            null = " or null" if key in may_be_null else ""
            example = str(like).lower() if isinstance(like, bool) else repr(like)
            raise ConfigError(f"repro.{key}: got {v!r}; must be {want}{null}, e.g. {example}")


_INTERVAL = re.compile(r"^([\[(])\s*(-?inf|-?[0-9.]+)\s*,\s*(-?inf|-?[0-9.]+)\s*([\])])$")


def check_within(block, within: dict[str, str]) -> None:
    """Declared ranges, interval notation ("[0, 1)", "(0, inf)"), of scalar parameters or of every element of a
    list parameter: quantiles, fractions, utilisations. Kinds are `check_scalars`' and `check_lists`'; this
    adds the bounds a default's sign cannot say (`repro.window_start=1.5` indexed past the end of the run,
    `repro.rho=1.2` simulated an unstable queue and reported a negative theory)."""
    for key, spec in within.items():
        m = _INTERVAL.match(spec)
        if m is None:
            raise ValueError(f"within[{key!r}]: {spec!r} is not an interval like '[0, 1)'")  # a runner's own bug
        lo_b, lo, hi, hi_b = m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)
        v = block.get(key)
        vals = list(v) if OmegaConf.is_list(v) else [v]
        for x in vals:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                continue  # null where allowed; a wrong kind is check_scalars' / check_lists' line
            if not ((x > lo if lo_b == "(" else x >= lo) and (x < hi if hi_b == ")" else x <= hi)):
                raise ConfigError(f"repro.{key}: got {v!r}; must lie in {spec}")


def rising(*pairs: tuple[str, str]) -> Callable[[Any], None]:
    """An `experiment(check=...)` for the bounds of a search (`rate_lo` < `rate_hi`): inverted, a bisection
    reported its floor as the answer."""

    def check(block) -> None:
        for lo, hi in pairs:
            if not float(block[lo]) < float(block[hi]):
                raise ConfigError(f"repro.{lo}: got {block[lo]!r} with repro.{hi}={block[hi]!r}; must be below it")

    return check


@dataclass
class Experiment:
    """What one reproduction run sees and writes (see the module docstring)."""

    cfg: Any
    out: Path
    checks: list[dict] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)

    @property
    def p(self):
        """The `repro` block of the config (the reproduction's own parameters)."""
        return self.cfg.repro

    @property
    def name(self) -> str:
        return self.cfg.repro.runner.split(":")[0].rsplit(".", 1)[-1]

    @property
    def seed(self) -> int:
        return int(self.cfg.seed)

    @property
    def seeds(self) -> list[int]:
        """`repro.seeds` when the reproduction averages over seeds, else the run's one seed."""
        return repro_seeds(self.cfg)

    @cached_property
    def sim(self) -> SimConfig:
        """The composed scenario as a simulator config."""
        return sim_config_from(self.cfg)

    @property
    def trace(self) -> str | None:
        """`workload.trace=PATH` given on the command line (or by the scenario), else None."""
        return self.cfg.workload.get("trace")

    def scenario(self, name: str, overrides: tuple[str, ...] = ()) -> SimConfig:
        """A named scenario as a simulator config. The run's own scenario keeps its command-line overrides;
        a `workload.trace=PATH` given to the run applies to every scenario (any vidur / Azure trace)."""
        if name == self.cfg.get("scenario_name") and not overrides:
            return self.sim
        ov = list(overrides) + ([f"workload.trace={self.trace}"] if self.trace else [])
        return load_scenario(name, ov).sim

    def spec(self, node) -> Any:
        """A policy spec from the config (plain str / dict, not an OmegaConf node)."""
        return to_container(node)

    def path(self, name: str) -> Path:
        return self.out / name

    def figure(self, name: str) -> Path:
        """Path of a figure to write; recorded so the summary lists every picture next to the numbers."""
        self.figures.append(name)
        return self.out / name

    def table(self, df: pd.DataFrame, md: str | None = None, name: str = "results") -> None:
        """results.csv (the full table) and results.md (`md`, or the table as markdown), both atomic."""
        with safe_files.atomic_path(self.out / f"{name}.csv") as tmp:
            df.to_csv(tmp, index=False)
        write_text(self.out / f"{name}.md", (md if md is not None else df.to_markdown(index=False)) + "\n")

    def csv(self, df: pd.DataFrame, name: str) -> None:
        """An extra table (no markdown), atomic."""
        with safe_files.atomic_path(self.out / name) as tmp:
            df.to_csv(tmp, index=False)

    def regime(self, point: str, quantity: str, value: float, lo: float | None = None,
               hi: float | None = None, note: str = "") -> bool:
        """Check that `quantity` at `point` lies in [lo, hi]; record it; False (and flagged) if not."""
        v = float(value)
        ok = not math.isnan(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
        self.checks.append({"point": point, "quantity": quantity, "value": v, "lo": lo, "hi": hi,
                            "ok": bool(ok), "note": note})
        if not ok:
            band = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
            print(f"{self.name}: OUT OF REGIME at {point}: {quantity} = {v:.4g} not in {band} {note}".rstrip())
        return ok

    def finish(self, summary: dict) -> dict:
        out = dict(summary)
        bad = [f"{c['point']}: {c['quantity']}" for c in self.checks if not c["ok"]]
        out["regime"] = {"in_regime": not bad, "out_of_regime": bad, "checks": self.checks}
        out["figures"] = list(self.figures)
        return out


def experiment(fn: Callable[[Experiment], dict] | None = None, *, may_be_empty: tuple[str, ...] = (),
               may_be_null: dict | None = None, within: dict[str, str] | None = None,
               check: Callable[[Any], None] | None = None):
    """Wrap `fn(exp) -> summary` as the `run(cfg, out)` runner that pdgym-repro calls. `may_be_empty`: the
    list parameters an empty list is a valid value for (e.g. no predictors), for `check_lists`; `may_be_null`:
    the scalar parameters null is a valid value for, each with an example of its other kind (`check_scalars`);
    `within`: ranges of parameters (`check_within`); `check(repro_block)`: what ties parameters together
    (raises ConfigError). pdgym-repro applies them all before any folder exists."""

    def wrap(fn):
        @wraps(fn)
        def run(cfg, out: Path) -> dict:
            exp = Experiment(cfg, Path(out))
            return exp.finish(fn(exp))

        run.may_be_empty = frozenset(may_be_empty)
        run.may_be_null = dict(may_be_null or {})
        run.within = dict(within or {})
        run.check = check
        return run

    return wrap(fn) if fn is not None else wrap
