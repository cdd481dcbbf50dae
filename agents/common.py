"""What every app reads from its composed config: the simulator config, the policy choice, labels that become
file names, configured policy presets, the run folder, and the commit a result came from.

The Hydra front door is agents/front_door.py, composing without a Hydra run agents/compose.py, the one-line
stderr contract agents/errors.py.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pdgym.envs.sim.config import ConfigError, SimConfig, check_footprint, sim_config

SIM_KEYS = tuple(f.name for f in dataclasses.fields(SimConfig))
DEFAULT_MEMORY_LIMIT_GB = 8.0
# A user label (compare set, leaderboard entry, ...) becomes a file or folder name only if it matches.
SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def _safe_dirname(text: str) -> str:
    """An override string as one folder name: separators and odd characters become '_'."""
    out = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", str(text)).replace("..", "_")
    return out[:150] or "_"


if not OmegaConf.has_resolver("pdgym_dirname"):  # job folders of a multirun survive '/' in overrides
    OmegaConf.register_new_resolver("pdgym_dirname", _safe_dirname)


def to_container(cfg: Any) -> Any:
    if isinstance(cfg, DictConfig) or OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def sim_config_from(cfg: Any) -> SimConfig:
    """The SimConfig part of an app config (hardware, model, cluster, workload, cost, faults, ...).

    Also refuses a run whose estimated memory footprint exceeds the config's `memory_limit_gb`.
    """
    data = to_container(cfg)
    sim = sim_config({k: data[k] for k in SIM_KEYS if k in data})
    check_footprint(sim, data.get("memory_limit_gb", DEFAULT_MEMORY_LIMIT_GB))
    return sim


def policy_spec(cfg: Any) -> dict:
    """The {prefill, decode, batching} policy choice of an app config."""
    data = to_container(cfg)
    return dict(data.get("policy") or {})


def check_label(label: Any, key: str) -> str:
    """A user label that becomes a file or folder name: letters, digits, `_ - .`, no `..`."""
    text = str(label) if isinstance(label, (str, int)) and not isinstance(label, bool) else None
    ok = text is not None and SAFE_NAME.fullmatch(text) is not None and ".." not in text and text not in (".",)
    if not ok:
        raise ConfigError(f"{key}: got {label!r}; a label is 1-100 letters, digits, '_', '-', '.' "
                          "(no '..', no path separators)")
    return text


def inside(root: Path, *parts: str) -> Path:
    """root/parts..., refusing any path that would land outside `root` (defence behind check_label)."""
    root = Path(root).resolve()
    path = root.joinpath(*parts).resolve()
    if path != root and root not in path.parents:
        raise ConfigError(f"output path {path} would be outside the output directory {root}")
    return path


def run_dir() -> Path:
    """Hydra's output directory of the current run."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


# --------------------------------------------------------------------------- configured policy names
def configured_policy(point: str, name: str) -> dict | None:
    """The policy spec of conf/policy/POINT/NAME.yaml ({name: <registered class>, params...}), or None
    (baselines/registry.preset: configured names such as sbs_cache are presets of registered classes)."""
    from pdgym.baselines.registry import preset

    return preset(point, name)


RUN_INPUTS = ("envs", "baselines", "agents", "conf", "data", "pyproject.toml")  # what a run's results come from


def commit_id() -> str:
    """Short commit id of the checkout pdgym runs from (+dirty with uncommitted changes to the tracked code,
    configs or data a run reads; an edited doc changes no result), or "unknown" outside git. Callers take it
    when a run starts: the code a result came from."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True,
                             timeout=10, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                *(f":/{p}" for p in RUN_INPUTS)],  # ":/": paths from the checkout's top
                               check=True, capture_output=True, text=True, timeout=10, cwd=here).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out + ("+dirty" if dirty else "")
