"""`pdgym-repro NAME [overrides]`: run a named reproduction (an experiment config in conf/repro/).

    pdgym-repro NAME [key=value ...]     run it; summary in runs/repro/NAME/summary.json
    pdgym-repro NAME hydra.run.dir=DIR   the same, written to DIR
    pdgym-repro NAME --cfg job           print the composed config and exit
    pdgym-repro --help                   this text and the reproductions

Each conf/repro/NAME.yaml is a global-package config that picks a scenario and holds a
`repro` block: `runner` (module:function) and the runner's parameters. The runner gets the
composed config and the output directory and returns the summary dict; this module writes
config.yaml and summary.json. The run is written to runs/repro/NAME.partial and renamed to
runs/repro/NAME only when complete (a previous run's folder becomes NAME.previous then); a run that
fails or is interrupted (Ctrl-C: one line, exit 130) removes its partial folder, so nothing half-done
looks like a result and the last complete run stays where it was. NAME, NAME.partial and NAME.previous
are created new or replaced only when they are pdgym's own (agents/run_folder.py): a user's folder or file of
such a name is never deleted or moved.
"""

from __future__ import annotations

import importlib
import importlib.resources
import sys
from pathlib import Path

from omegaconf import OmegaConf
from pdgym.agents import run_folder
from pdgym.agents.common import sim_config_from, to_container
from pdgym.agents.compose import compose_checked
from pdgym.agents.errors import fail, one_line_errors, show_each_warning_once
from pdgym.agents.experiments.harness import check_lists, check_scalars, check_within, repro_seeds
from pdgym.agents.front_door import refuse_rerun, split_argv
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError, check_seed
from pdgym.envs.sim.metrics import write_json

APP = "pdgym-repro"
KEY = "hydra.run.dir"  # the run folder's key (default runs/repro/NAME)


def available() -> list[str]:
    root = importlib.resources.files("pdgym.conf") / "repro"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def own_runners() -> dict[str, str]:
    """{runner: reproduction} of the runners the reproductions' own configs (conf/repro/*.yaml) name: the only
    `repro.runner` values accepted, so a command line cannot import and call an arbitrary `module:callable`."""
    root = importlib.resources.files("pdgym.conf") / "repro"
    out = {}
    for name in available():
        runner = OmegaConf.select(OmegaConf.create((root / f"{name}.yaml").read_text()), "repro.runner")
        if isinstance(runner, str):
            out[runner] = name
    return out


def check_runner(value) -> tuple[str, str]:
    """(module, function) of `repro.runner`, or a ConfigError when it is not one of the reproductions' own."""
    runners = own_runners()
    if not isinstance(value, str) or value not in runners:
        raise ConfigError(f"repro.runner: got {value!r}; allowed: the reproductions' own runners "
                          f"({', '.join(sorted(runners))})")
    mod_name, _, fn_name = value.partition(":")
    return mod_name, fn_name


def load(name: str, overrides: list[str]):
    """Compose the root config with repro NAME and command-line overrides (one line on any error)."""
    names = available()
    if name not in names:
        fail(APP, f"NAME: unknown reproduction {name!r}; allowed: {', '.join(names)}")
    return compose_checked(APP, "config", [f"+repro={name}", *overrides])


def validate(cfg, defaults, runner) -> None:
    """What every runner relies on, checked before any folder exists: a valid seed, simulator config and
    `repro` lists and scalars (against the reproduction's defaults, `defaults`)."""
    check_seed(to_container(cfg).get("seed"))
    repro_seeds(cfg)
    added = sorted(set(cfg.repro) - set(defaults.repro))  # `+repro.extra=1`: a key no runner reads
    if added:
        raise ConfigError(f"repro.{added[0]}: not a parameter of this reproduction (no runner reads it); allowed: "
                          f"{', '.join(k for k in defaults.repro if k != 'runner')}")
    check_lists(cfg.repro, defaults.repro, getattr(runner, "may_be_empty", frozenset()))
    check_scalars(cfg.repro, defaults.repro, getattr(runner, "may_be_null", {}), getattr(runner, "within", {}))
    check_within(cfg.repro, getattr(runner, "within", {}))
    if getattr(runner, "check", None) is not None:
        runner.check(cfg.repro)
    sim_config_from(cfg)


def output_folder(name: str, overrides: list[str], out_root: Path) -> tuple[Path, list[str]]:
    """The run folder (`hydra.run.dir=DIR`, as the other apps take it, else OUT_ROOT/NAME) and the overrides
    without it. pdgym-repro composes its config without a Hydra run, so any other hydra.* key would be ignored
    silently: it is refused."""
    out = out_root / name
    rest = []
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key == "hydra.run.dir":
            if not value.strip():
                raise ConfigError("hydra.run.dir: empty; give the folder for the run (default runs/repro/NAME)")
            out = Path(value)
        elif key.startswith("hydra.") or key == "hydra":
            raise ConfigError(f"{key}: not used by pdgym-repro (no Hydra run); allowed: hydra.run.dir=DIR")
        else:
            rest.append(o)
    return out, rest


@one_line_errors(APP)
def run(name: str, overrides: list[str], out_root: Path = Path("runs/repro")) -> dict:
    out, overrides = output_folder(name, overrides, out_root)
    cfg = load(name, overrides)
    mod_name, fn_name = check_runner(OmegaConf.select(cfg, "repro.runner"))
    runner = getattr(importlib.import_module(mod_name), fn_name)
    validate(cfg, load(name, []), runner)
    out = run_folder.check(out, KEY)
    partial, previous = out.parent / f"{out.name}.partial", out.parent / f"{out.name}.previous"
    for p in (partial, previous):  # pdgym's own leftovers only: a user's folder of that name stays untouched
        if p.exists() and not run_folder.is_ours(p):
            raise ConfigError(f"{KEY}: {p} exists and is not a pdgym run folder; pdgym will not delete or move it: "
                              "remove it yourself or give another folder")
    for p in (out, partial, previous):  # and pdgym-repro's own: another app's run is neither moved nor deleted
        run_folder.check_owner(p, KEY, APP)
    run_folder.remove_own(partial, KEY)  # a killed run's partial folder (refused while its run still holds it)
    folder = run_folder.claim(partial, KEY, APP)
    try:
        summary = runner(cfg, partial)
        safe_files.write_text(partial / "config.yaml", OmegaConf.to_yaml(cfg))
        write_json(partial / "summary.json", summary)
    except BaseException:  # a failed run leaves nothing that looks like a result, nor folders it made
        folder.discard()
        raise
    if run_folder.is_ours(out):  # the previous run stays, under another name
        run_folder.remove_own(previous, KEY)
        out.rename(previous)
    elif out.exists():  # an empty folder (run_folder.check): the run takes its place
        out.rmdir()
    partial.rename(out)
    folder.release()
    print(f"{name}: summary in {out / 'summary.json'}")
    return summary


def usage() -> str:
    return (__doc__ or "").strip() + "\n\nreproductions: " + ", ".join(available()) + \
        "\nkeys: those of pdgym-sim (pdgym-sim --help) plus the repro.* block of the reproduction (--cfg job)."


def main(argv: list[str] | None = None) -> None:
    show_each_warning_once()
    argv = sys.argv[1:] if argv is None else list(argv)
    flags, rest = split_argv(argv)
    refuse_rerun(flags, APP)
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
