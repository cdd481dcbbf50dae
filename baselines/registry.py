"""Name -> policy class registry for the three decision points, filled by `@register`.

Every module in pdgym.baselines registers its policies on import; `make_policy` imports
them all once, so adding a baseline is one new module plus a config file, nothing else.

A policy from outside the tree is named `module:Class` wherever a registered name is taken
(`policy/decode`, `policy.decode.name`, pdgym-eval's `policy=`, a board's `baselines`,
`make_policies`): the module is imported (the working directory first on the path, as `python -m`
does) and the class must subclass the decision point's protocol. Code is imported only because a
command line or a Python call named it: whatever builds policies that a stored file names (a trained
run's agent.json, the zoo index) does so inside `named_by_stored_file`, where `module:Class` is refused
(both live in envs/sim/external.py, which `queue.order` shares).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.external import import_class, is_external, named_by_stored_file  # noqa: F401 (callers import them here)
from pdgym.envs.sim.points import POINTS, check_points
from pdgym.envs.sim.validation import did_you_mean


class _Protocols(Mapping):
    """Decision point -> the protocol its policies subclass, read from POINTS at each use (so a point added to
    the table is registrable at once)."""

    def __getitem__(self, kind: str) -> type:
        return POINTS[kind].protocol

    def __iter__(self):
        return iter(POINTS)

    def __len__(self) -> int:
        return len(POINTS)


KINDS = _Protocols()
_REGISTRY: dict[str, dict[str, type]] = {}  # decision point -> name -> class
_loaded = False


def register(kind: str, name: str):
    """Class decorator: make a policy available as `policy/<kind>=<name>`."""
    if kind not in KINDS:
        raise ValueError(f"register: kind {kind!r} unknown; allowed: {', '.join(KINDS)}")

    def deco(cls):
        if not issubclass(cls, KINDS[kind]):
            raise TypeError(f"{cls.__name__} must subclass {KINDS[kind].__name__}")
        cls.name = name
        _REGISTRY.setdefault(kind, {})[name] = cls
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
    return sorted(_REGISTRY.get(kind, {}))


def external_class(name: str, key: str = "policy") -> type:
    """Import `module:Class` (cwd first on sys.path; envs/sim/external.py); a bad module or class is one
    ConfigError line under `key`."""
    return import_class(name, key, tuple(KINDS.values()))


def point_of(cls: type) -> list[str]:
    """The decision points whose protocol `cls` subclasses."""
    return [k for k, proto in KINDS.items() if issubclass(cls, proto)]


def policy_class(kind: str, name: str) -> type:
    _load_all()
    if kind not in KINDS:
        raise ConfigError(f"policy: decision point {kind!r} unknown; allowed: {', '.join(KINDS)}")
    if is_external(name):
        cls = external_class(name, f"policy.{kind}.name")
        if not issubclass(cls, KINDS[kind]):
            raise ConfigError(f"policy.{kind}.name: {name} does not subclass {KINDS[kind].__module__}."
                              f"{KINDS[kind].__name__}, the protocol of the {kind} decision point")
        return cls
    if name not in _REGISTRY.get(kind, {}):
        raise ConfigError(f"policy.{kind}.name: unknown {name!r}; {did_you_mean(name, names(kind))}allowed: "
                          f"{', '.join(names(kind))}, or module:Class")
    return _REGISTRY[kind][name]


def presets(kind: str) -> list[str]:
    """Configured names of a decision point that are not registered classes: conf/policy/KIND/NAME.yaml presets
    of a registered class with its parameters (sbs_cache, brh_memo, ...). Every place that takes a policy name
    takes these too (make_policy resolves them)."""
    import importlib.resources

    root = importlib.resources.files("pdgym.conf").joinpath("policy", kind)
    if kind not in KINDS or not root.is_dir():
        return []
    have = set(registered(kind))
    return sorted(n for n in (p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml")) if n not in have)


def names(kind: str) -> list[str]:
    """Every name a decision point accepts: registered classes and configured presets."""
    return sorted({*registered(kind), *presets(kind)})


def preset(kind: str, name: str) -> dict | None:
    """The spec of conf/policy/KIND/NAME.yaml ({name: <registered class>, params...}), or None if there is none:
    the preset and the presets its `defaults` list names (siblings, then `_self_`), merged as Hydra would. Read
    directly rather than composed (this runs inside Hydra apps, where Hydra is already initialised)."""
    import importlib.resources

    if not isinstance(name, str) or "/" in name or kind not in KINDS:
        return None
    if not importlib.resources.files("pdgym.conf").joinpath("policy", kind, f"{name}.yaml").is_file():
        return None
    return dict(_preset(kind, name))


@functools.lru_cache(maxsize=128)
def _preset(kind: str, name: str) -> dict:
    import importlib.resources

    from omegaconf import OmegaConf

    node = OmegaConf.create(importlib.resources.files("pdgym.conf").joinpath("policy", kind, f"{name}.yaml").read_text())
    defaults = list(node.pop("defaults", None) or [])
    merged = OmegaConf.create({})
    for entry in defaults or ["_self_"]:
        merged = OmegaConf.merge(merged, node if entry == "_self_" else _preset(kind, str(entry)))
    if "_self_" not in defaults:
        merged = OmegaConf.merge(merged, node)
    return OmegaConf.to_container(merged, resolve=True)


def make_policy(kind: str, spec: str | Mapping[str, Any] | type | Any | None):
    """Build a policy from a name, a mapping {name: ..., <constructor parameters>}, a policy class (built with
    no arguments) or a policy object (returned as it is). A name is a registered class, a configured preset
    (conf/policy/KIND/NAME.yaml: its parameters, then the mapping's) or `module:Class`.

    Unknown names or parameters fail with one line naming the key and what is allowed;
    constructors validate their values and raise ConfigError themselves.
    """
    if spec is None:
        return None
    proto = KINDS.get(kind)
    if proto is not None and isinstance(spec, proto):
        return spec
    if inspect.isclass(spec):
        spec = {"name": spec}
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"policy.{kind}: got {type(spec).__name__} {spec!r}; must be a name, {{name: NAME, params}}, "
                          f"a {proto.__name__ if proto else 'policy'} subclass or an object of one")
    spec = dict(spec)
    name = spec.pop("name", None)
    if name is None:
        raise ConfigError(f"policy.{kind}.name: missing; allowed: {', '.join(names(kind))}")
    if inspect.isclass(name):
        if proto is None or not issubclass(name, proto):
            raise ConfigError(f"policy.{kind}: {name.__name__} does not subclass {proto.__module__}.{proto.__name__}"
                              if proto else f"policy: decision point {kind!r} unknown; allowed: {', '.join(KINDS)}")
        cls = name
        name = cls.__name__
    else:
        pre = preset(kind, name) if not is_external(name) and name not in registered(kind) else None
        if pre is not None:  # a configured preset: its class and parameters, the given parameters over them
            spec = {**{k: v for k, v in pre.items() if k != "name"}, **spec}
            name = pre["name"]
        cls = policy_class(kind, name)
    params = inspect.signature(cls.__init__).parameters
    allowed = [p for p in params if p != "self" and params[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    for k in spec:
        if k not in allowed:
            raise ConfigError(f"policy.{kind}.{k}: not a parameter of {name}; allowed: {', '.join(allowed) or 'none'}")
    if not is_external(name):
        return cls(**spec)
    try:
        return cls(**spec)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 (the user's constructor failing is one line naming it)
        import os
        import traceback

        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            traceback.print_exc()
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        raise ConfigError(f"policy.{kind}.name: {name}({', '.join(spec)}) raised {why[:200]} in its constructor "
                          "(HYDRA_FULL_ERROR=1 prints its traceback)") from None


def make_policies(spec: Mapping[str, Any] | None) -> dict:
    """Policies for every decision point named in `spec` ({'prefill': ..., 'decode': ..., 'batching': ...}); each
    value is whatever make_policy takes: a name, {name, params}, a policy class or a policy object."""
    spec = spec or {}
    check_points(spec, "policy name or {name, params}, e.g. {'decode': 'least_kv'}", point_key="policy")
    return {k: make_policy(k, v) for k, v in spec.items() if v is not None}
