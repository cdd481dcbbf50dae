"""Glue between Hydra configs and the simulator shared by every command-line app."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pdgym.envs.sim.config import ConfigError, SimConfig, sim_config

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
