"""The front door of pdgym's Hydra apps (pdgym-sim, -eval, -enjoy, -leaderboard, -train, -profile), on Hydra's
public API.

`hydra_cli(app, config_name, validate=...)` turns a task function into the app's `main(argv=None)`, which runs it
with `hydra.main`. Before Hydra: `--help` lists only the config groups the app composes, and the checks of the
command line alone run (an unknown group option, a key the app never reads, a `+KEY` adding a top-level key nothing
reads, a sweeper or launcher whose plugin is missing, Hydra's --experimental-rerun). Then the callback `FrontDoor`
(registered in the apps' configs: `hydra.callbacks.pdgym`) checks the config Hydra composed, in `on_run_start` / `on_multirun_start`,
before Hydra creates any folder: every interpolation resolves, the app's `validate(cfg)` passes (for each job of a
basic multirun), and the run or sweep folder is claimed (agents/run_folder.py). Any failure is one line, exit
status 2, and no folder; Hydra's own composition errors become one line naming the key (envs/compose_errors.py).
Inside the run, agents/errors.one_line_errors keeps that contract and makes a Ctrl-C one line, exit 130.

Three shims remain, each because Hydra 1.3's public API offers no other way:
- `command_line`: hydra.main reads its command line from sys.argv only (it has no argv parameter), so `main(argv)`
  called from Python (tests, scripts) and the `policy=X` alias of pdgym-eval / -enjoy (`rewrite_argv`: `policy` is
  also a config group) set sys.argv for the call, and put it back.
- `raising_hydra_errors`: HYDRA_FULL_ERROR=1 for Hydra's own code, its documented switch that makes it raise its
  composition errors instead of printing them over many lines and exiting 1; they are turned into one line here.
  pdgym's checks and the task see the user's own value (`users_environment`).
- agents/compose.resolving: `${hydra:...}` resolves only against the global HydraConfig, which Hydra sets only in
  run_job (after creating the folder); the checks of `on_run_start` set it, as run_job's first line does, and put
  the previous one back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.resources
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from pdgym.agents import interrupts, run_folder
from pdgym.agents.common import SIM_KEYS
from pdgym.agents.compose import check_resolves, compose_error_line, resolving, validated
from pdgym.agents.errors import fail, fail_error, one_line_errors, show_each_warning_once
from pdgym.agents.multirun_jobs import (
    BASIC_SWEEPER,
    MAX_JOBS,
    JobConfigs,
    check_job_folders,
    check_order,
    job_folder,
    sweep_axes,
)
from pdgym.envs.compose_errors import config_choices, group_options, new_root_key
from pdgym.envs.sim.config import ConfigError, check_key_path
from pdgym.envs.sim.validation import did_you_mean

# --------------------------------------------------------------------------- the command line, before Hydra
_INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
# Hydra 1.3's flags (hydra/_internal/utils.get_args_parser): name -> None (no value), () (a value of any kind) or
# the values allowed; --info's value is optional. Its argparse answers an unknown flag or value with a usage block.
HYDRA_FLAGS: dict[str, tuple[str, ...] | None] = {
    "--help": None, "-h": None, "--hydra-help": None, "--version": None, "--cfg": ("job", "hydra", "all"),
    "-c": ("job", "hydra", "all"), "--resolve": None, "--package": (), "-p": (), "--run": None, "-r": None,
    "--multirun": None, "-m": None, "--shell-completion": None, "-sc": None, "--config-path": (), "-cp": (),
    "--config-name": (), "-cn": (), "--config-dir": (), "-cd": (), "--experimental-rerun": (),
    "--info": tuple(sorted(_INFO_VALUES)), "-i": tuple(sorted(_INFO_VALUES)),
}
# split_argv keeps a flag's value beside it: the flags that take one (--info's only when it is one of its values),
# and -sc's operand (install=bash: argparse's switch, but its operand is no override of the app's config)
_FLAGS_WITH_VALUE = ({f for f, v in HYDRA_FLAGS.items() if v is not None and f not in ("--info", "-i")}
                     | {"--shell-completion", "-sc"})
# Hydra's rerun flag unpickles the file it names (code runs from a file): no pdgym app needs it. argparse takes any
# unambiguous prefix of a long flag (--exp FILE), and it is Hydra's only flag starting with --e.
_REFUSED_FLAG = "--experimental-rerun"


def refuse_rerun(flags: list[str], app: str) -> None:
    """Fail with one line if a flag is (a prefix argparse would expand to) --experimental-rerun."""
    for f in flags:
        name = f.split("=", 1)[0]
        if name.startswith("--e") and _REFUSED_FLAG.startswith(name):
            fail(app, f"{name}: not accepted by pdgym (it would unpickle a file, running its code); "
                      f"rerun a job with its overrides from the run folder's .hydra/overrides.yaml instead")


def _flag_name(arg: str) -> str | None:
    """The Hydra flag `arg` names (argparse also takes an unambiguous prefix of a long flag), else None."""
    name = arg.split("=", 1)[0]
    if name in HYDRA_FLAGS:
        return name
    longs = [f for f in HYDRA_FLAGS if f.startswith("--") and f.startswith(name)] if name.startswith("--") else []
    return longs[0] if len(longs) == 1 else None


def _attached(arg: str) -> tuple[str, str] | None:
    """(flag, value) of a short flag written with its value attached, as argparse reads it (-cjob, -iconfig)."""
    if arg.startswith("--") or len(arg) <= 2 or "=" in arg:
        return None
    flag = arg[:2]
    return (flag, arg[2:]) if HYDRA_FLAGS.get(flag) and arg not in HYDRA_FLAGS else None


def _info_value(arg: str) -> bool:
    """The argument after --info is its value: a word, not an override (key=value, ~key) nor a flag. argparse takes
    any next argument for it and refuses `--info plots=false` ("invalid choice"); an override is never one of its
    values, so pdgym reads it as the override it is."""
    return not arg.startswith(("-", "~", "+")) and "=" not in arg


def check_flags(argv: list[str], app: str) -> None:
    """Fail with one line (not Hydra's argparse usage block) if a flag is not one of Hydra's, or its value is
    missing or not allowed (`--cfg bogus`, `--info bogus`). --info's value is optional: the next argument is its
    value unless it is an override or a flag (`--info plots=false` is --info, then an override)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("-") or (not a.startswith("--") and "=" in a):  # an override (or a negative value)
            continue
        name = _flag_name(a)
        if name is None and (attached := _attached(a)) is not None:
            name, a = attached[0], f"{attached[0]}={attached[1]}"
        if name is None:
            flags = ", ".join(f for f in HYDRA_FLAGS if f.startswith("--"))
            fail(app, f"{a.split('=', 1)[0]}: unknown flag; {app} takes key=value overrides and Hydra's flags: "
                      f"{flags} (--help lists the config groups)")
        allowed = HYDRA_FLAGS[name]
        if allowed is None:
            continue
        optional = name in ("--info", "-i")
        if "=" in a:
            value = a.split("=", 1)[1]
        elif optional:
            if i >= len(argv) or not _info_value(argv[i]):
                continue
            value, i = argv[i], i + 1
        elif i < len(argv) and not argv[i].startswith("-"):
            value, i = argv[i], i + 1
        else:
            want = f": {', '.join(allowed)}" if allowed else ""
            fail(app, f"{name}: needs a value{want}")
        if allowed and value not in allowed:
            fail(app, f"{name}: unknown {value!r}; allowed: {', '.join(allowed)}")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra flags with their values, overrides). A bare --info (no value of its own) becomes `--info=all`, its
    default: Hydra's argparse is given the flags first and the overrides after, and would take the first override
    for --info's value."""
    flags, overrides, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and not a.startswith("--") and "=" in a:  # not a flag: a negative-looking value
            overrides.append(a)
        elif a.startswith("-"):
            name = _flag_name(a)
            if name in ("--info", "-i") and "=" not in a:
                if i + 1 < len(argv) and _info_value(argv[i + 1]):
                    flags.append(f"{name}={argv[i + 1]}")
                    i += 1
                else:
                    flags.append(f"{name}=all")
            else:
                flags.append(a)
                if (name or a) in _FLAGS_WITH_VALUE and "=" not in a and i + 1 < len(argv):
                    flags.append(argv[i + 1])
                    i += 1
        else:
            overrides.append(a)
        i += 1
    return flags, overrides


def check_group_choices(argv: list[str], app: str) -> None:
    """Fail with one line if a command-line override picks a config-group option that does not exist.

    Hydra would say so too, over several lines and after creating the run directory.
    """
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
        if not group.is_dir() or "," in value or value == "null":
            continue
        options = group_options(key)
        if not options:  # a folder of groups (policy/): the choice is made per sub-group
            subs = sorted(p.name for p in group.iterdir() if p.is_dir() and not p.name.startswith("_"))
            fail(app, f"{key}: missing or not a single choice; pick one per decision point: "
                      + ", ".join(f"{key}/{s}=NAME" for s in subs))
        if value == "":
            fail(app, f"{key}: empty; allowed: {', '.join(options)}")
        if value not in options:
            fail(app, f"{key}: unknown {value!r}; {did_you_mean(value, options)}allowed: {', '.join(options)}")


def refuse_unused(overrides: list[str], app: str, unused: dict[str, str]) -> None:
    """Fail with one line if an override sets a key the app composes but never reads (`unused`: top-level key or
    group -> what to use instead): it would be dropped without a word."""
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        top = re.split(r"[./]", key, maxsplit=1)[0]
        if top in unused:
            fail(app, f"{key}: not used by {app}; {unused[top]}")


def app_help(app: str, config_name: str, doc: str) -> str:
    """`--help`: the app's docstring, then only the config groups this app composes, with their options."""
    choices = config_choices(config_name)
    lines = [doc.strip(), "", f"usage: {app} [key=value ...] [group=option ...]",
             f"       {app} --cfg job               print the composed config and exit",
             f"       {app} -m key=a,b ...           multirun (one job per combination; runs/README.md)",
             f"       {app} --hydra-help            Hydra's own flags", "", "config groups (group=option):"]
    for group, choice in choices.items():
        if group.startswith("hydra/") and group not in ("hydra/launcher", "hydra/sweeper"):
            continue
        opts = group_options(group)
        if group.startswith("hydra/"):
            opts = sorted(set(opts) | {"basic"})
        lines.append(f"  {group:16s} default {choice}; options: {', '.join(opts) or '-'}")
    lines.append("")
    lines.append(f"See the composed defaults with `{app} --cfg job`; a key's value with key=value.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- sweeper and launcher plugins
# Hydra plugins an option of conf/hydra/{sweeper,launcher} may need: module -> how to install it.
PLUGIN_INSTALL = {
    "hydra_plugins.hydra_optuna_sweeper": "pip install 'pdgym[optuna]'",
    "hydra_plugins.hydra_submitit_launcher": "pip install 'pdgym[launchers]'",
    "hydra_plugins.hydra_joblib_launcher": "pip install hydra-joblib-launcher",
    "hydra_plugins.hydra_ray_launcher": "pip install hydra-ray-launcher (not a pdgym extra: docs/agents.md)",
}

# Hydra options (hydra/sweeper=NAME, hydra/launcher=NAME, or a `defaults` entry of ours) -> plugin module.
PLUGIN_OPTIONS = {
    "optuna": "hydra_plugins.hydra_optuna_sweeper", "submitit_local": "hydra_plugins.hydra_submitit_launcher",
    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher",
    "joblib": "hydra_plugins.hydra_joblib_launcher",
    "ray": "hydra_plugins.hydra_ray_launcher", "ray_aws": "hydra_plugins.hydra_ray_launcher",
}


def install_hint(module: str) -> str:
    return next((v for k, v in PLUGIN_INSTALL.items() if module.startswith(k)), "install the plugin")


def plugin_modules(kind: str, choice: str) -> list[str]:
    """Plugin modules a `hydra/KIND=CHOICE` option needs: our conf/hydra/KIND/CHOICE.yaml's `_target_` and
    `defaults`, or the plugin's own option name."""
    path = importlib.resources.files("pdgym.conf").joinpath("hydra", kind, f"{choice}.yaml")
    if not path.is_file():
        return [PLUGIN_OPTIONS[choice]] if choice in PLUGIN_OPTIONS else []
    try:
        node = OmegaConf.create(path.read_text())
    except Exception:  # noqa: BLE001 - Hydra reports a broken file itself
        return []
    mods = [PLUGIN_OPTIONS[str(d)] for d in (node.get("defaults") or []) if str(d) in PLUGIN_OPTIONS]
    target = str(node.get("_target_") or "")
    if target.startswith("hydra_plugins."):
        mods.append(target.rpartition(".")[0])
    return mods


def check_plugin_choices(argv: list[str], app: str) -> None:
    """Fail with one line if an override picks a sweeper / launcher whose Hydra plugin is not installed
    (before composing: Hydra would fail there, or later with "Unknown plugin class", over many lines)."""
    for arg in argv:
        key, _, choice = arg.lstrip("+").partition("=")
        if key not in ("hydra/sweeper", "hydra/launcher") or not choice or "," in choice:
            continue
        for module in plugin_modules(key.split("/")[1], choice):
            try:
                importlib.import_module(module)
            except ImportError:
                fail(app, f"{key}={choice}: needs the Hydra plugin {module.split('.')[1]}, which is not installed; "
                          f"{install_hint(module)}")


def check_plugins(app: str, hydra_node: DictConfig) -> None:
    """Fail with one line if the composed multirun's sweeper or launcher (`hydra_node`: its config's hydra node)
    is a plugin that is not installed; Hydra would say "Unknown plugin class" in a traceback, exit 1."""
    for kind in ("sweeper", "launcher"):
        target = str(OmegaConf.select(hydra_node, f"{kind}._target_") or "")
        module, _, cls = target.rpartition(".")
        if not module:
            continue
        try:
            found = hasattr(importlib.import_module(module), cls)
        except ImportError:
            found = False
        if not found:
            choice = hydra_node.runtime.choices.get(f"hydra/{kind}", "?")
            fail(app, f"hydra/{kind}={choice}: the Hydra plugin {target} is not installed; {install_hint(module)}")


# --------------------------------------------------------------------------- Hydra's callbacks
@dataclasses.dataclass
class Door:
    """The app `hydra_cli` is running in this process: what the callback checks against, and the folder it claimed."""

    app: str
    config_name: str
    overrides: list[str]
    validate: Callable[[DictConfig], Any] | None
    composed: bool = False  # Hydra composed the config: an error from now on is no composition error
    folder: run_folder.RunFolder | None = None
    single: bool = True  # a run (not a multirun): settled as one


_DOOR: list[Door] = []  # the running app's Door (none: a Hydra run pdgym's front door did not start)


def _given(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in overrides)


def _claimed(app: str, claim: Callable[[], run_folder.RunFolder]) -> run_folder.RunFolder:
    """The run folder `claim()` returns, or one line and exit 2 when it is refused."""
    try:
        return claim()
    except ConfigError as exc:
        fail(app, str(exc))


@contextlib.contextmanager
def callback_errors(app: str) -> Iterator[None]:
    """Any error of a front-door check as one line, exit 2: Hydra catches an Exception a callback raises, warns, and
    carries on (a bad sweep ran its jobs after a 101-line warning); only SystemExit passes through it."""
    try:
        yield
    except ConfigError as exc:
        fail_error(app, exc, str(exc))
    except Exception as exc:  # noqa: BLE001 - turned into the one line Hydra would swallow
        door = _DOOR[-1] if _DOOR else None
        line = None if door is None else compose_error_line(exc, door.overrides, door.config_name)
        fail_error(app, exc, line or f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def check_output_subdir(app: str, hydra_node: DictConfig) -> None:
    """`hydra.output_subdir` (where Hydra writes a job's config.yaml, hydra.yaml, overrides.yaml) is null or a
    relative path inside the job's folder: Hydra joins it to the folder and writes there, wherever that is."""
    sub = hydra_node.get("output_subdir")
    if sub is None:
        return
    norm = os.path.normpath(str(sub))
    if os.path.isabs(norm) or norm == ".." or norm.startswith(".." + os.sep):
        fail(app, f"hydra.output_subdir: got {str(sub)!r}, outside the job's folder; a relative path inside it "
                  "(default .hydra) or null (Hydra then writes no config copy)")


class FrontDoor(Callback):
    """Hydra callback (conf: hydra.callbacks.pdgym): check the composed config and claim the run or sweep folder
    before Hydra creates it. Does nothing in a Hydra run pdgym's front door did not start (a launcher's worker).
    `max_jobs`: the most jobs a multirun may have (MAX_JOBS)."""

    def __init__(self, max_jobs: int = MAX_JOBS) -> None:
        self.max_jobs = max_jobs

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _DOOR:
            return
        door = _DOOR[-1]
        door.composed = True
        with callback_errors(door.app):
            job = check_resolves(door.app, config, door.overrides, door.config_name)
            check_output_subdir(door.app, config.hydra)
            with resolving(config), users_environment():  # train's validate reads the run folder (${hydra:...})
                validated(door.app, door.validate, job)
                door.folder = _claimed(door.app, lambda: run_folder.claim_hydra(
                    config.hydra, job, "run", door.app, _given(door.overrides, "hydra.run.dir")))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _DOOR:
            return
        door = _DOOR[-1]
        door.composed, door.single = True, False
        with callback_errors(door.app):
            self._check_multirun(door, config)

    def _check_multirun(self, door: Door, config: DictConfig) -> None:
        """Every job of a basic multirun composed and validated before the first runs (another sweeper chooses its
        jobs as it goes: each value of its lists is checked once), each job's folder inside the sweep folder and
        its own."""
        app, max_jobs = door.app, self.max_jobs
        if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1:
            fail(app, f"hydra.callbacks.pdgym.max_jobs: got {max_jobs!r}; must be an integer >= 1")
        basic = str(OmegaConf.select(config, "hydra.sweeper._target_")) == BASIC_SWEEPER
        # the basic sweeper's params are jobs' overrides as the command line's are (another sweeper's, such as
        # Optuna's, are its search space: its own)
        params = (OmegaConf.select(config, "hydra.sweeper.params") or {}) if basic else {}
        axes = sweep_axes(app, door.config_name, [f"{k}={v}" for k, v in params.items()] + door.overrides, basic)
        count = math.prod(len(a) for a in axes)
        if basic and count > max_jobs:
            fail(app, f"this multirun has {count:,} jobs, more than hydra.callbacks.pdgym.max_jobs={max_jobs:,} (each "
                      "is checked before the first runs; a sweep this large is more often a typo than a plan): sweep "
                      "fewer values, or raise hydra.callbacks.pdgym.max_jobs")
        check_output_subdir(app, config.hydra)
        order = list(check_order(axes, every=basic))
        configs = JobConfigs(app, door.config_name)
        # the first job of each config-group choice composed before any job is validated: a validate hook may
        # compose a scenario itself (envs/scenario.load_scenario), which clears the Hydra instance the Compose API
        # needs; the other jobs are copies of those (JobConfigs), made and checked one at a time
        for _, overrides in order:
            configs.first_of(overrides)
        subdirs: dict[int, str] = {}
        job = None
        for num, overrides in order:
            with configs.job(overrides) as cfg:
                job = check_resolves(app, cfg, overrides, door.config_name)
                with resolving(cfg):
                    with users_environment():
                        validated(app, door.validate, job, f" (job {' '.join(overrides)})")
                    check_plugins(app, cfg.hydra)
                    if basic:
                        subdirs[num] = job_folder(app, cfg, num)
                    elif not subdirs:  # the sweeper numbers its trials as it goes: two numbers, two folders
                        subdirs = {n: job_folder(app, cfg, n) for n in (0, 1)}
        with resolving(config):
            door.folder = _claimed(app, lambda: run_folder.claim_hydra(
                config.hydra, job, "sweep", app, _given(door.overrides, "hydra.sweep.dir")))
        try:
            check_job_folders(door.folder.path, subdirs, every=basic)
        except ConfigError as exc:
            door.folder.discard()
            door.folder = None
            fail(app, str(exc))


# --------------------------------------------------------------------------- the shims around hydra.main
@contextlib.contextmanager
def command_line(args: list[str]) -> Iterator[None]:
    """sys.argv is `args` within the block: hydra.main reads its command line from sys.argv only (Hydra 1.3 has no
    argv parameter). Nothing changes when `args` is what the process was given."""
    saved = sys.argv
    if args != saved[1:]:
        sys.argv = [saved[0] if saved else "pdgym", *args]
    try:
        yield
    finally:
        sys.argv = saved


def _set_full_error(value: str | None) -> None:
    if value is None:
        os.environ.pop("HYDRA_FULL_ERROR", None)
    else:
        os.environ["HYDRA_FULL_ERROR"] = value


_USERS_FULL_ERROR: list[str | None] = []  # the user's HYDRA_FULL_ERROR while `raising_hydra_errors` replaces it


@contextlib.contextmanager
def raising_hydra_errors() -> Iterator[None]:
    """HYDRA_FULL_ERROR=1 within the block, for Hydra's own code: Hydra raises its errors (documented: "Set the
    environment variable HYDRA_FULL_ERROR=1 for a complete stack trace") rather than printing them and exiting 1.
    pdgym's code inside the block (the callback's checks, the task) sees the user's value (`users_environment`)."""
    _USERS_FULL_ERROR.append(os.environ.get("HYDRA_FULL_ERROR"))
    _set_full_error("1")
    try:
        yield
    finally:
        _set_full_error(_USERS_FULL_ERROR.pop())


@contextlib.contextmanager
def users_environment() -> Iterator[None]:
    """Within `raising_hydra_errors`: the user's own HYDRA_FULL_ERROR again (a policy prints its traceback only
    when the user asked for it), and Hydra's afterwards."""
    if not _USERS_FULL_ERROR:
        yield
        return
    hydras = os.environ.get("HYDRA_FULL_ERROR")
    _set_full_error(_USERS_FULL_ERROR[-1])
    try:
        yield
    finally:
        _set_full_error(hydras)


def no_trial_completed(exc: BaseException) -> bool:
    """Optuna's answer when asked for the best trial of a study none of whose trials completed (Hydra's Optuna
    sweeper asks once its trials are run)."""
    return isinstance(exc, ValueError) and "No trials are completed yet" in str(exc)


# --------------------------------------------------------------------------- the decorator
def hydra_cli(app: str, config_name: str, *, validate: Callable[[DictConfig], Any] | None = None,
              rewrite_argv: Callable[[list[str]], list[str]] | None = None,
              unused: dict[str, str] | None = None, after_sweep: Callable[[list[Path]], None] | None = None) -> Callable:
    """Decorator: the task function `fn(cfg)` becomes `main(argv=None)`, the app's entry point (module docstring).
    `after_sweep(job_dirs)`: called once a multirun's jobs have all run, with the folders this sweep added to its
    sweep folder (not those an earlier sweep left there); it may exit, e.g. 1 when a job stalled.

    The task is looked up by import when Hydra runs it, so launchers that run jobs in other processes pickle it
    by reference.
    """

    def deco(fn: Callable) -> Callable:
        mod, name = fn.__module__, fn.__name__
        if mod == "__main__":  # `python -m pdgym....`: workers of a launcher import the real module name
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            mod = spec.name if spec is not None else mod

        def task(cfg: DictConfig) -> Any:
            interrupts.raise_if_interrupted()  # a Ctrl-C lost while Hydra composed: no run starts
            target = getattr(importlib.import_module(mod), name)
            with users_environment():
                return one_line_errors(app)(getattr(target, "__wrapped__", target))(cfg)

        task.__module__ = mod  # Hydra names the job after the app's module

        def main(argv: list[str] | None = None) -> Any:
            import hydra

            show_each_warning_once()
            args = list(sys.argv[1:] if argv is None else argv)
            if rewrite_argv is not None:
                args = rewrite_argv(args)
            flags, overrides = split_argv(args)
            refuse_rerun(flags, app)
            check_flags(args, app)
            if any(f in ("--help", "-h") for f in flags):
                print(app_help(app, config_name, sys.modules[mod].__doc__ or ""))
                raise SystemExit(0)
            refuse_unused(overrides, app, unused or {})
            check_group_choices(overrides, app)
            check_plugin_choices(overrides, app)
            for o in overrides:  # +KEY=... at the top level: Hydra adds it, no app reads it
                if (line := new_root_key(o, config_name, overrides)) is not None:
                    fail(app, line)
            if _given(overrides, "hydra.mode"):
                fail(app, "hydra.mode: not set on the command line; a multirun is -m (--multirun)")
            door = Door(app, config_name, overrides, validate)
            _DOOR.append(door)
            try:
                # flags first: Hydra's argparse takes the overrides as one positional list (tests put some before -m)
                with command_line([*flags, *overrides]), raising_hydra_errors():
                    hydra.main(version_base=None, config_path="pkg://pdgym.conf", config_name=config_name)(task)()
                if after_sweep is not None and not door.single and door.folder is not None:
                    after_sweep([p for p in door.folder.added() if p.is_dir() and not p.name.startswith(".")])
            except BaseException as exc:
                where = None if door.folder is None else door.folder.path
                if door.folder is not None:
                    run_folder.settle(door.folder, exc, single=door.single)
                    door.folder = None
                if not door.single and no_trial_completed(exc):
                    fail(app, "no trial of the sweep completed: each job failed or returned no number (a sampling "
                              "sweeper such as Optuna's ranks the number a job returns: pdgym-train's objective; "
                              f"pdgym-sim, -eval and -leaderboard return none){'' if where is None else f'; jobs in {where}'}",
                         1)
                if not door.composed and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
                    line = compose_error_line(exc, overrides, config_name)
                    if line is not None:
                        fail_error(app, exc, line)
                raise
            finally:
                _DOOR.remove(door)
                if door.folder is not None:
                    run_folder.settle(door.folder, None, single=door.single)
            return None  # as hydra.main: a console script's exit status is 0, not the task's value

        main.__wrapped__ = fn
        main.__doc__ = fn.__doc__
        return main

    return deco
