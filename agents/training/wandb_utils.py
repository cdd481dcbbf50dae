"""Weights & Biases glue: offline by default, one SB3 logger output that mirrors every record to wandb.

`wandb.mode` in the train config: offline (default; files under the run directory, sync later with
`wandb sync runs/train/.../wandb/offline-run-*`), online (needs `wandb login`), disabled. A WANDB_MODE in
the environment is a ceiling: the more private of it and the config wins, so `WANDB_MODE=offline make run`
can never go online, and a config that says disabled starts no wandb process whatever the environment says.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pdgym.envs.sim.config import ConfigError
from stable_baselines3.common.logger import KVWriter

MODES = ("offline", "online", "disabled")
PRIVACY = ("disabled", "offline", "online")  # most private first


def effective_mode(configured: str, environment: str | None) -> str:
    """The more private of the config's mode and the environment's WANDB_MODE (a ceiling, when set)."""
    environment = environment or None  # an empty WANDB_MODE is no ceiling
    for key, value in (("wandb.mode", configured), ("WANDB_MODE (environment)", environment)):
        if value is not None and value not in MODES:
            raise ConfigError(f"{key}: got {value!r}; allowed: {', '.join(MODES)}")
    return min(configured, environment, key=PRIVACY.index) if environment else configured


def init(cfg: dict, run_dir: Path, config: dict, name: str, resume_id: str | None = None):
    """Start a wandb run (or return None when disabled); the run id is kept for resuming."""
    mode = effective_mode(cfg.get("mode", "offline"), os.environ.get("WANDB_MODE"))
    if mode == "disabled":
        return None
    os.environ["WANDB_MODE"] = mode  # wandb reads it too (an empty value would fail its settings)
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    return wandb.init(project=cfg.get("project", "pdgym"), entity=cfg.get("entity"), group=cfg.get("group"),
                      tags=list(cfg.get("tags") or []), name=name, config=config, dir=str(run_dir), mode=mode,
                      id=resume_id, resume="allow" if resume_id else None, reinit="finish_previous")


class WandbWriter(KVWriter):
    """SB3 logger output format: every dump (train/*, rollout/*, metrics/*, eval/*) goes to wandb too."""

    def __init__(self, run):
        self.run = run

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        data = {k: v for k, v in key_values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if data:
            self.run.log(data, step=int(step))

    def close(self) -> None:
        """The run is finished by the trainer (it outlives the logger on resume)."""
