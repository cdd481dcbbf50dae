"""Glue between Hydra configs and the simulator shared by every command-line app."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pdgym.envs.sim.config import ConfigError, SimConfig, check_key_path, sim_config

SIM_KEYS = tuple(f.name for f in dataclasses.fields(SimConfig))


def to_container(cfg: Any) -> Any:
    if isinstance(cfg, DictConfig) or OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def sim_config_from(cfg: Any) -> SimConfig:
    """The SimConfig part of an app config (hardware, model, cluster, workload, cost, faults, ...)."""
    data = to_container(cfg)
    return sim_config({k: data[k] for k in SIM_KEYS if k in data})


def policy_spec(cfg: Any) -> dict:
    """The {prefill, decode, batching} policy choice of an app config."""
    data = to_container(cfg)
    return dict(data.get("policy") or {})


def fail(app: str, msg: str, code: int = 2):
    """Print one clear line and exit: the contract for bad input in every app."""
    print(f"{app}: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def one_line_errors(app: str) -> Callable:
    """Decorator: ConfigError / missing files become one line on stderr and exit status 2."""

    def deco(fn):
        @wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ConfigError as exc:
                fail(app, str(exc))
            except FileNotFoundError as exc:
                fail(app, f"file not found: {exc.filename or exc}")

        return inner

    return deco


def run_dir() -> Path:
    """Hydra's output directory of the current run."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def check_group_choices(argv: list[str], app: str) -> None:
    """Fail with one line if a command-line override picks a config-group option that does not exist.

    Hydra would say so too, over several lines and after creating the run directory.
    """
    import importlib.resources

    root = importlib.resources.files("pdgym.conf")
    for arg in argv:
        if "=" not in arg or arg.startswith(("hydra", "-")):
            continue
        key, _, value = arg.lstrip("+~").partition("=")
        if "." in key and key.split(".")[0] in SIM_KEYS and not arg.startswith("+"):
            try:
                check_key_path(key)
            except ConfigError as exc:
                fail(app, str(exc))
            continue
        group = root.joinpath(*key.split("/"))
        if not group.is_dir() or "," in value or value in ("null", ""):
            continue
        options = sorted(p.name[:-5] for p in group.iterdir() if p.name.endswith(".yaml"))
        if value not in options:
            fail(app, f"{key}: unknown {value!r}; allowed: {', '.join(options)}")
