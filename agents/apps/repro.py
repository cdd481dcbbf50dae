"""`pdgym-repro NAME [overrides]`: run a named reproduction (an experiment config in conf/repro/).

    pdgym-repro NAME [key=value ...]     run it; summary in runs/repro/NAME/summary.json
    pdgym-repro NAME --cfg job           print the composed config and exit
    pdgym-repro --help                   this text and the reproductions

Each conf/repro/NAME.yaml is a global-package config that picks a scenario and holds a
`repro` block: `runner` (module:function) and the runner's parameters. The runner gets the
composed config and the output directory and returns the summary dict; this module writes
config.yaml and, last and atomically, summary.json. A previous run's folder is moved to
runs/repro/NAME.previous first, so an interrupted run (Ctrl-C: one line, exit 130) never leaves
an older summary.json standing as if it were this run's.
"""

from __future__ import annotations

import importlib
import importlib.resources
import shutil
import sys
from pathlib import Path

from omegaconf import OmegaConf
from pdgym.agents.common import compose_checked, fail, one_line_errors, sim_config_from, split_argv, to_container
from pdgym.agents.experiments.harness import repro_seeds
from pdgym.envs.sim.config import check_seed
from pdgym.envs.sim.metrics import write_json

APP = "pdgym-repro"


def available() -> list[str]:
    root = importlib.resources.files("pdgym.conf") / "repro"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load(name: str, overrides: list[str]):
    """Compose the root config with repro NAME and command-line overrides (one line on any error)."""
    names = available()
    if name not in names:
        fail(APP, f"NAME: unknown reproduction {name!r}; allowed: {', '.join(names)}")
    return compose_checked(APP, "config", [f"+repro={name}", *overrides])


def validate(cfg) -> None:
    """What every runner relies on: a valid seed and simulator config (before any folder exists)."""
    check_seed(to_container(cfg).get("seed"))
    repro_seeds(cfg)
    sim_config_from(cfg)


@one_line_errors(APP)
def run(name: str, overrides: list[str], out_root: Path = Path("runs/repro")) -> dict:
    cfg = load(name, overrides)
    validate(cfg)
    mod_name, fn_name = cfg.repro.runner.split(":")
    runner = getattr(importlib.import_module(mod_name), fn_name)
    out = out_root / name
    if out.exists():  # the previous run stays whole, under another name, until this one completes
        previous = out_root / f"{name}.previous"
        shutil.rmtree(previous, ignore_errors=True)
        out.rename(previous)
    out.mkdir(parents=True)
    summary = runner(cfg, out)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    write_json(out / "summary.json", summary)  # last: the mark of a complete run
    print(f"{name}: summary in {out / 'summary.json'}")
    return summary


def usage() -> str:
    return (__doc__ or "").strip() + "\n\nreproductions: " + ", ".join(available()) + \
        "\nkeys: those of pdgym-sim (pdgym-sim --help) plus the repro.* block of the reproduction (--cfg job)."


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    flags, rest = split_argv(argv)
    if any(f in ("--help", "-h") for f in flags):
        print(usage())
        raise SystemExit(0)
    if not rest or "=" in rest[0]:
        fail(APP, f"usage: pdgym-repro NAME [key=value ...]; NAME one of: {', '.join(available())}")
    if flags in (["--cfg", "job"], ["-c", "job"]):
        print(OmegaConf.to_yaml(load(rest[0], rest[1:]), resolve=False))
        return
    if flags:
        fail(APP, f"unknown flags {' '.join(flags)}; allowed: --help, --cfg job")
    run(rest[0], rest[1:])


if __name__ == "__main__":
    main()
