"""Name -> builder tables for the simulator's configurable families (cost models, arrival processes).

One class, so the list of allowed names in an error is always the list of things that
exist: adding a cost model or an arrival process is one decorated function, with no
if-chain and no parallel tuple of names to keep in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .validation import ConfigError

T = TypeVar("T", bound=Callable)


class Registry(Generic[T]):
    """The builders of one family, looked up by the config value at `key` (e.g. `cost.kind`)."""

    def __init__(self, key: str):
        self.key = key
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make the builder available under `name`."""

        def deco(fn: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.key}: {name!r} registered twice")
            self._items[name] = fn
            return fn

        return deco

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ConfigError(f"{self.key}: unknown {name!r}; allowed: {', '.join(self._items)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)
