"""Classes from outside the tree, named `module:Class`: a policy (baselines/registry.py) or a queue discipline
(ordering.py, `queue.order`).

The module is imported from the working directory first (as `python -m` does) or PYTHONPATH, and only because a
command line or a Python call named it: whatever builds from settings a stored file names (a trained run's
agent.json, a zoo entry) does so inside `named_by_stored_file`, where a `module:Class` is one ConfigError line and
never an import (the file could name any module on the path).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .validation import ConfigError

__all__ = ["import_class", "is_external", "named_by_stored_file"]

_STORED_SOURCES: list[str] = []  # the stored files whose settings are being built now (innermost last)


def is_external(name: Any) -> bool:
    """`module:Class` (a class from outside the tree), as opposed to a registered name."""
    return isinstance(name, str) and name.count(":") == 1 and all(name.split(":"))


@contextmanager
def named_by_stored_file(source: str | None) -> Iterator[None]:
    """Build what a stored file names (`source`, e.g. "runs/x/agent.json"): a `module:Class` among it is one
    ConfigError line, never an import. None: the settings come from this process's command line or Python, and
    nothing is refused."""
    if source is None:
        yield
        return
    _STORED_SOURCES.append(source)
    try:
        yield
    finally:
        _STORED_SOURCES.pop()


def import_class(name: str, key: str, bases: tuple[type, ...] = (), what: str = "policy") -> type:
    """Import `module:Class`; a refused, bad module or missing class is one ConfigError line under `key` (which
    lists the module's `what` classes: those subclassing one of `bases`)."""
    import sys

    if _STORED_SOURCES:
        raise ConfigError(f"{key}: {name!r} is named by {_STORED_SOURCES[-1]}; a module:Class is imported only when "
                          "the command line or a Python call names it, never because a stored file does")
    mod_name, cls_name = name.split(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 (any failure of the user's module is one line)
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        raise ConfigError(f"{key}: cannot import module {mod_name!r} of {name!r} ({why}); give module:Class with "
                          "the module importable from the working directory or PYTHONPATH") from None
    cls = getattr(mod, cls_name, None)
    if not inspect.isclass(cls):
        found = sorted(n for n, v in vars(mod).items() if inspect.isclass(v) and v.__module__ == mod.__name__
                       and any(issubclass(v, b) for b in bases))
        raise ConfigError(f"{key}: module {mod_name!r} has no class {cls_name!r}; its {what} classes: "
                          f"{', '.join(found) or 'none'}")
    return cls
