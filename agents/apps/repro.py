"""`pdgym-repro NAME [overrides]`: run a named reproduction (an experiment config in conf/repro/).

Each conf/repro/NAME.yaml is a global-package config that picks a scenario and holds a
`repro` block: `runner` (module:function) and the runner's parameters. The runner gets the
composed config and the output directory and returns the summary dict; this module writes
it to runs/repro/NAME/summary.json (atomically, only when the run completed).
"""

from __future__ import annotations

import importlib
import importlib.resources
import sys
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import OmegaConf
from pdgym.agents.common import fail, one_line_errors
from pdgym.envs.sim.metrics import write_json


def available() -> list[str]:
    root = importlib.resources.files("pdgym.conf") / "repro"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load(name: str, overrides: list[str]):
    """Compose the root config with repro NAME and command-line overrides."""
    names = available()
    if name not in names:
        fail("pdgym-repro", f"NAME: unknown reproduction {name!r}; allowed: {', '.join(names)}")
    with initialize_config_module("pdgym.conf", version_base=None):
        try:
            return compose(config_name="config", overrides=[f"+repro={name}", *overrides])
        except HydraException as exc:
            fail("pdgym-repro", str(exc).splitlines()[0])


@one_line_errors("pdgym-repro")
def run(name: str, overrides: list[str], out_root: Path = Path("runs/repro")) -> dict:
    cfg = load(name, overrides)
    mod_name, fn_name = cfg.repro.runner.split(":")
    runner = getattr(importlib.import_module(mod_name), fn_name)
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    summary = runner(cfg, out)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    write_json(out / "summary.json", summary)
    print(f"{name}: summary in {out / 'summary.json'}")
    return summary


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        fail("pdgym-repro", f"usage: pdgym-repro NAME [key=value ...]; NAME one of: {', '.join(available())}")
    run(argv[0], argv[1:])


if __name__ == "__main__":
    main()
