"""The one family of input checks used by the config, the cost models, the baselines and the envs.

Every bad value fails with a one-line `ConfigError` that names the full key and what is
allowed (`policy.decode.window: got 0; must be an integer >= 1`); the apps print that
line and exit 2. Each helper returns the checked value in its canonical type.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


class ConfigError(ValueError):
    """A configuration value is invalid; the message is one line: `key: problem (allowed ...)`."""


class UnknownOptionError(ConfigError, TypeError):
    """A keyword argument no env takes: a TypeError as Python raises for any callable ("got an unexpected keyword
    argument 'frameskip'"), which clients probing for an option catch (TorchRL's GymEnv retries gym.make without
    frameskip), and a ConfigError, so the pdgym-* apps print it as their one line."""


def check(cond: bool, key: str, msg: str) -> None:
    """Raise `key: msg` unless `cond` holds."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")


SHOWN_CHARS = 60  # a value quoted in an error line is cut here: a line stays one readable line (a 1 MB label did not)


def shown(value: Any) -> str:
    """`repr(value)` for an error line, cut to SHOWN_CHARS characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text):,} characters)"


def is_num(x: Any) -> bool:
    """A real number (not a bool, not NaN): what every numeric parameter must be."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)


ENGINES = ("python", "numba")  # engine=: the pure-Python simulator, or its compiled kernels (compiled.py)


def check_choice(value: Any, key: str, allowed: list[str] | tuple[str, ...]) -> None:
    check(value in allowed, key, f"got {value!r}; allowed: {', '.join(map(str, allowed))}")


def check_positive(value: float, key: str, allow_zero: bool = False) -> None:
    ok = value is not None and not (isinstance(value, float) and math.isnan(value))
    ok = ok and (value >= 0 if allow_zero else value > 0)
    check(ok, key, f"got {value!r}; must be {'>= 0' if allow_zero else '> 0'}")


def check_int(value: Any, key: str, lo: int = 1, allow_none: bool = False, hi: float = math.inf) -> int | None:
    """An integer in [lo, hi] (or None when allowed)."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and lo <= value <= hi
    bound = f">= {lo}" if hi == math.inf else f"in [{lo}, {hi}]"
    check(ok, key, f"got {value!r}; must be an integer {bound}" + (" or null" if allow_none else ""))
    return int(value)


def check_float(value: Any, key: str, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False,
                hi_open: bool = False) -> float:
    """A number in [lo, hi] (open ends when asked)."""
    ok = is_num(value)
    if ok:
        v = float(value)
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
    check(ok, key, f"got {value!r}; allowed {lb}{lo}, {hi}{rb}")
    return float(value)


def check_seed_list(value: Any, key: str) -> list[int]:
    """Seeds, or run indices of a split: a non-empty list of integers >= 0."""
    ok = isinstance(value, list) and bool(value) and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value)
    check(ok, key, f"got {value!r}; must be a non-empty list of integers >= 0")
    return value


def check_bool(value: Any, key: str) -> bool:
    check(isinstance(value, bool), key, f"got {value!r}; must be true or false")
    return value


def check_params(params: Any, allowed: tuple[str, ...], key: str, owner: str) -> None:
    """Every key of the mapping `params` is one of `allowed` (`key.NAME: unknown for OWNER; allowed: ...`)."""
    for k in params:
        check(k in allowed, f"{key}.{k}", f"unknown for {owner}; allowed: {', '.join(allowed) or 'none'}")


def did_you_mean(word: Any, options) -> str:
    """'did you mean X? ' for the closest of `options` to a mistyped `word` (difflib, as gym.make), else ''."""
    import difflib

    if not isinstance(word, str):
        return ""
    opts = [str(o) for o in options]
    same = [o for o in opts if _confusable(o) == _confusable(word)]  # brO -> br0, LEAST_KV -> least_kv
    close = same or difflib.get_close_matches(word, opts, n=1)
    close = close or sorted((o for o in opts if len(o) >= 3 and word.startswith(o)), key=len)[-1:]  # jsq_typo -> jsq
    return f"did you mean {close[0]!r}? " if close else ""


def _confusable(word: str) -> str:
    """A spelling with case and the look-alike characters (O/0, l/I/1) folded: two names equal here are one typo apart."""
    return word.lower().translate(str.maketrans({"o": "0", "l": "1", "i": "1"}))
