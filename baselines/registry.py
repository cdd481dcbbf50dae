"""Name -> policy class registry for the three decision points, filled by `@register`.

Every module in pdgym.baselines registers its policies on import; `make_policy` imports
them all once, so adding a baseline is one new module plus a config file, nothing else.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.points import POINTS

KINDS = {name: p.protocol for name, p in POINTS.items()}  # decision point -> protocol a policy subclasses
_REGISTRY: dict[str, dict[str, type]] = {k: {} for k in KINDS}
_loaded = False


def register(kind: str, name: str):
    """Class decorator: make a policy available as `policy/<kind>=<name>`."""
    if kind not in KINDS:
        raise ValueError(f"register: kind {kind!r} unknown; allowed: {', '.join(KINDS)}")

    def deco(cls):
        if not issubclass(cls, KINDS[kind]):
            raise TypeError(f"{cls.__name__} must subclass {KINDS[kind].__name__}")
        cls.name = name
        _REGISTRY[kind][name] = cls
        return cls

    return deco


# The engines' own behaviour (pdgym.envs.sim.policy) is a baseline too.
for _p in POINTS.values():
    register(_p.name, _p.default_name)(_p.default)


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):  # this package's modules, without importing it
        if mod.name != "registry" and not mod.name.startswith("_"):
            importlib.import_module(f"pdgym.baselines.{mod.name}")
    _loaded = True


def registered(kind: str) -> list[str]:
    """Names of the registered policies of one decision point."""
    _load_all()
    return sorted(_REGISTRY[kind])


def policy_class(kind: str, name: str) -> type:
    _load_all()
    if kind not in KINDS:
        raise ConfigError(f"policy: decision point {kind!r} unknown; allowed: {', '.join(KINDS)}")
    if name not in _REGISTRY[kind]:
        raise ConfigError(f"policy.{kind}.name: unknown {name!r}; allowed: {', '.join(sorted(_REGISTRY[kind]))}")
    return _REGISTRY[kind][name]


def make_policy(kind: str, spec: str | Mapping[str, Any] | None):
    """Build a policy from a name or a mapping {name: ..., <constructor parameters>}.

    Unknown names or parameters fail with one line naming the key and what is allowed;
    constructors validate their values and raise ConfigError themselves.
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        spec = {"name": spec}
    spec = dict(spec)
    name = spec.pop("name", None)
    if name is None:
        raise ConfigError(f"policy.{kind}.name: missing; allowed: {', '.join(registered(kind))}")
    cls = policy_class(kind, name)
    params = inspect.signature(cls.__init__).parameters
    allowed = [p for p in params if p != "self" and params[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    for k in spec:
        if k not in allowed:
            raise ConfigError(f"policy.{kind}.{k}: not a parameter of {name}; allowed: {', '.join(allowed) or 'none'}")
    return cls(**spec)


def make_policies(spec: Mapping[str, Any] | None) -> dict:
    """Policies for every decision point named in `spec` ({'prefill': ..., 'decode': ..., 'batching': ...})."""
    spec = spec or {}
    for k in spec:
        if k not in KINDS:
            raise ConfigError(f"policy.{k}: unknown decision point; allowed: {', '.join(KINDS)}")
    return {k: make_policy(k, v) for k, v in spec.items() if v is not None}
