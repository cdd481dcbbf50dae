"""Named scenarios (conf/scenario/NAME.yaml) as plain objects, for code that runs outside a Hydra app.

The Gymnasium envs, the reproductions and the tests build their clusters from the same
files the command-line apps use, so a scenario means one thing everywhere.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from dataclasses import dataclass
from functools import lru_cache

from omegaconf import OmegaConf
from pdgym.envs.compose_errors import hydra_error_line
from pdgym.envs.sim.config import ConfigError, SimConfig, sim_config
from pdgym.envs.sim.validation import did_you_mean


@dataclass
class Scenario:
    name: str
    sim: SimConfig  # validated simulator config
    policy: dict  # {prefill, decode, batching}: the scenario's default policy specs
    raw: dict  # the whole composed config (for keys beyond the simulator's)


def scenario_names() -> list[str]:
    root = importlib.resources.files("pdgym.conf") / "scenario"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


@lru_cache(maxsize=64)
def _compose(name: str, overrides: tuple[str, ...]) -> dict:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    full = [f"scenario={name}", *overrides]
    try:
        with initialize_config_module("pdgym.conf", version_base=None):
            cfg = compose(config_name="config", overrides=full)
    except HydraException as exc:  # in the CLI's words: the key, and the keys or choices allowed there
        raise ConfigError(f"overrides: {hydra_error_line(exc, full, 'config')}") from None
    return OmegaConf.to_container(cfg, resolve=True)


def load_scenario(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Compose conf/config.yaml with scenario NAME and Hydra-style overrides ('workload.rate=5')."""
    names = scenario_names()
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"overrides: got {overrides!r}; must be a list of 'key=value' strings, "
                          "e.g. ['workload.num_requests=600']")
    if name not in names:
        raise ConfigError(f"scenario: unknown {name!r}; {did_you_mean(name, names)}allowed: {', '.join(names)}")
    raw = _compose(name, tuple(overrides))
    sim = sim_config({k: raw[k] for k in ("hardware", "model", "cluster", "workload", "cost", "faults", "slo",
                                          "oracle", "max_sim_time_s", "check_policies")})
    return Scenario(name=name, sim=sim, policy=dict(raw.get("policy") or {}), raw=raw)


def merge_sim_config(sim_cfg: SimConfig, config: dict | None) -> SimConfig:
    """`sim_cfg` with `config` (a nested dict of SimConfig fields) merged over it, validated again."""
    if not config:
        return sim_cfg

    def deep(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return sim_config(deep(dataclasses.asdict(sim_cfg), config))


def trace_splits() -> dict[str, dict]:
    """conf/splits/default.yaml: {train, val, test} -> {seed_base, trace_from, trace_to} (disjoint rows)."""
    text = (importlib.resources.files("pdgym.conf") / "splits" / "default.yaml").read_text()
    return OmegaConf.to_container(OmegaConf.create(text))
