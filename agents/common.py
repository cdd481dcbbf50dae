"""Glue between Hydra configs and the simulator shared by every command-line app.

`hydra_cli` is the front door of every Hydra app (pdgym-sim, -eval, -leaderboard, -train): it composes
the config and runs the app's `validate` BEFORE Hydra creates a run directory, so bad input gives one
line on stderr, exit status 2, and no run folder (no `.hydra/` claiming a run); Hydra's own multi-line
errors become one line naming the key and what is allowed. `--help` is app-specific (only the config
groups that app composes). Inside a run, `one_line_errors` keeps the same contract and turns Ctrl-C into
one line (exit 130).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import importlib.resources
import itertools
import re
import sys
import warnings
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from pdgym.agents import run_folder
from pdgym.envs.compose_errors import config_choices, group_options, hydra_error_line, new_root_key
from pdgym.envs.sim.config import ConfigError, SimConfig, check_footprint, check_key_path, sim_config
from pdgym.envs.sim.validation import did_you_mean

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


def fail(app: str, msg: str, code: int = 2):
    """Print one clear line and exit: the contract for bad input in every app."""
    msg = " ".join(str(msg).split())  # one line, whatever the message held
    print(f"{app}: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


class OneLineParser(argparse.ArgumentParser):
    """argparse for pdgym's non-Hydra commands: a usage error is one line and exit 2 (`fail`), not a usage block."""

    def error(self, message: str):
        fail(self.prog, f"{message} (--help lists the arguments)")


def show_each_warning_once() -> None:
    """From now on, print each distinct warning (category and text) once in this process. Python's own
    once-per-place registry is cleared by every `warnings.catch_warnings` (pandas, tqdm and SB3 use it), so a
    reproduction replaying a short trace printed the same WorkloadWarning some fifty times. Errors raised by
    warning filters and `pytest.warns` records are untouched: only the printing is filtered."""
    show = warnings.showwarning
    if getattr(show, "once", False):
        return
    shown: set[tuple[type, str]] = set()

    def once(message, category, filename, lineno, file=None, line=None):
        if (category, str(message)) not in shown:
            shown.add((category, str(message)))
            show(message, category, filename, lineno, file, line)

    once.once = True
    warnings.showwarning = once


def interrupted(exc: BaseException | None) -> bool:
    """A Ctrl-C, or an error raised while one unwound: a library's cleanup (OmegaConf's flag_override, Hydra's
    compose) can fail on the half-built object the interrupt left, and that error then replaces the
    KeyboardInterrupt; it is still the user's Ctrl-C, reported as one line and exit status 130."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__context__
    return False


INTERRUPTED = "interrupted; this run wrote no result (files written so far are partial)"


def fail_error(app: str, exc: BaseException, line: str):
    """`line` for the error `exc`, exit status 2; the interrupt's line and 130 when `exc` was raised while a Ctrl-C
    unwound (`interrupted`: Hydra wraps OmegaConf's failed cleanup of a half-built config in its own error)."""
    if interrupted(exc):
        fail(app, INTERRUPTED, 130)
    fail(app, line)


def one_line_errors(app: str) -> Callable:
    """Decorator: ConfigError / missing files become one line on stderr and exit status 2; Ctrl-C one line, 130."""

    def deco(fn):
        @wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ConfigError as exc:
                fail_error(app, exc, str(exc))
            except FileNotFoundError as exc:
                fail_error(app, exc, f"file not found: {exc.filename or exc}")
            except (KeyboardInterrupt, Exception) as exc:
                if not interrupted(exc):
                    raise
                fail(app, INTERRUPTED, 130)

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


# --------------------------------------------------------------------------- Hydra front door
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--shell-completion", "-sc", "--experimental-rerun"}
_INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
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


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra flags with their values, overrides)."""
    flags, overrides, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and not a.startswith("--") and "=" in a:  # not a flag: a negative-looking value
            overrides.append(a)
        elif a.startswith("-"):
            flags.append(a)
            takes = a in _FLAGS_WITH_VALUE or (a in ("--info", "-i") and i + 1 < len(argv)
                                                 and argv[i + 1] in _INFO_VALUES)
            if takes and i + 1 < len(argv):
                flags.append(argv[i + 1])
                i += 1
        else:
            overrides.append(a)
        i += 1
    return flags, overrides


def compose_checked(app: str, config_name: str, overrides: list[str], job_name: str = "app",
                    keep_hydra: bool = False) -> DictConfig:
    """Compose like Hydra would (hydra: interpolations resolvable), or fail with one line; creates no folder.
    `keep_hydra`: the config keeps its `hydra` node (for run_composed), else it is the job's config alone."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    for o in overrides:  # +KEY=... at the top level: Hydra adds it, no app reads it
        if (line := new_root_key(o, config_name, overrides)) is not None:
            fail(app, line)
    try:
        with initialize_config_module("pdgym.conf", job_name=job_name, version_base=None):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        job = copy.copy(cfg)
        with open_dict(job):
            del job["hydra"]
        OmegaConf.to_container(job, resolve=True)  # every interpolation resolves (${nonexistent}, ${oc.env:NO_SUCH})
        if not keep_hydra:
            with open_dict(cfg):
                del cfg["hydra"]
        return cfg
    except (HydraException, OmegaConfBaseException) as exc:
        fail_error(app, exc, hydra_error_line(exc, overrides, config_name))
    except ValueError as exc:  # Hydra's own checks of the defaults list (a config group set to null)
        culprit = next((o for o in overrides if o.split("=", 1)[-1] == "null" and group_options(o.split("=")[0])),
                       "config")
        fail_error(app, exc, f"{culprit}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; pick "
                             f"one of: {', '.join(group_options(culprit.split('=')[0]))}")


def validated(app: str, validate: Callable[[DictConfig], Any] | None, cfg: DictConfig, where: str = "") -> None:
    """An app's validate hook on a composed config: bad input is one line and exit 2, before any folder."""
    if validate is None:
        return
    try:
        validate(cfg)
    except ConfigError as exc:
        fail_error(app, exc, f"{exc}{where}")
    except FileNotFoundError as exc:
        fail_error(app, exc, f"file not found: {exc.filename or exc}")


def run_composed(cfg: DictConfig, config_name: str, task: Callable[[DictConfig], Any]) -> Any:
    """Run one job on a config composed once (compose_checked(keep_hydra=True)), as Hydra's run mode does:
    callbacks, the run folder with its .hydra/ files, job logging, HydraConfig. hydra.main would compose the
    same config twice more (once to find the mode, once to run): 0.9 s of pdgym-sim's 2.3 s on 5,000
    requests (cProfile, bench/bench_cli.py)."""
    from hydra._internal.callbacks import Callbacks  # hydra-core 1.3 (pinned in pyproject.toml)
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    ret = run_job(hydra_context=HydraContext(config_loader=None, callbacks=callbacks), task_function=task,
                  config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, configure_logging=True)
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
    return ret.return_value  # raises the task's exception, as Hydra's run does


def sweep_jobs(overrides: list[str], cap: int = 256) -> list[list[str]]:
    """The override lists of a basic multirun's jobs (choice / range sweeps; interval sweeps left out)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    axes = []
    for o in parsed:
        if not o.is_sweep_override():
            axes.append([o.input_line])
        elif o.is_discrete_sweep():
            axes.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
    return [list(job) for job in itertools.islice(itertools.product(*axes), cap)]


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


def _install_hint(module: str) -> str:
    return next((v for k, v in PLUGIN_INSTALL.items() if module.startswith(k)), "install the plugin")


def _plugin_modules(kind: str, choice: str) -> list[str]:
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
        for module in _plugin_modules(key.split("/")[1], choice):
            try:
                importlib.import_module(module)
            except ImportError:
                fail(app, f"{key}={choice}: needs the Hydra plugin {module.split('.')[1]}, which is not installed; "
                          f"{_install_hint(module)}")


def check_plugins(app: str) -> None:
    """Fail with one line if the composed multirun's sweeper or launcher is a plugin that is not installed.

    Hydra would say "Unknown plugin class" in a traceback, exit 1. Reads the config `compose_checked`
    left in HydraConfig.
    """
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    for kind in ("sweeper", "launcher"):
        target = str(OmegaConf.select(hc, f"{kind}._target_") or "")
        module, _, cls = target.rpartition(".")
        if not module:
            continue
        try:
            found = hasattr(importlib.import_module(module), cls)
        except ImportError:
            found = False
        if not found:
            choice = hc.runtime.choices.get(f"hydra/{kind}", "?")
            fail(app, f"hydra/{kind}={choice}: the Hydra plugin {target} is not installed; {_install_hint(module)}")


def _given(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in overrides)


def _quoted(text: str) -> str:
    """`text` as a quoted value of a Hydra override."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _claimed(app: str, claim: Callable[[], Any]) -> Any:
    """The run folder `claim()` returns, or one line and exit 2 when it is refused."""
    try:
        return claim()
    except ConfigError as exc:
        fail(app, str(exc))


def _sweep_jobs_checked(app: str, config_name: str, overrides: list[str]) -> list[list[str]]:
    """`sweep_jobs`, or one line when an override does not parse or a sweep has no value (`seed=range(0)`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        for o in OverridesParser.create().parse_overrides(overrides):
            if o.is_discrete_sweep() and not list(o.sweep_string_iterator()):
                fail(app, f"{o.input_line}: a sweep with no value; a multirun needs at least one job")
        return sweep_jobs(overrides)
    except HydraException as exc:
        fail_error(app, exc, hydra_error_line(exc, overrides, config_name))


def refuse_unused(overrides: list[str], app: str, unused: dict[str, str]) -> None:
    """Fail with one line if an override sets a key the app composes but never reads (`unused`: top-level key or
    group -> what to use instead): it would be dropped without a word."""
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        top = re.split(r"[./]", key, maxsplit=1)[0]
        if top in unused:
            fail(app, f"{key}: not used by {app}; {unused[top]}")


def hydra_cli(app: str, config_name: str, *, validate: Callable[[DictConfig], Any] | None = None,
              rewrite_argv: Callable[[list[str]], list[str]] | None = None,
              unused: dict[str, str] | None = None) -> Callable:
    """Decorator: the task function `fn(cfg)` becomes `main(argv=None)`, the app's entry point.

    Before Hydra runs: app `--help`; keys the app never reads (`unused`) refused; `check_group_choices`; the
    config is composed (every interpolation resolved) and `validate(cfg)` run (every job of a basic multirun);
    the run or sweep folder claimed (agents/run_folder.py) -- any failure is one line, exit 2, and no folder. Then
    Hydra runs `fn` in its run directory with `one_line_errors`. The task is looked up by import so
    launchers that run jobs in other processes pickle it by reference.
    """

    def deco(fn: Callable) -> Callable:
        mod, name = fn.__module__, fn.__name__
        if mod == "__main__":  # `python -m pdgym....`: workers of a launcher import the real module name
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            mod = spec.name if spec is not None else mod

        def main(argv: list[str] | None = None) -> Any:
            import hydra

            show_each_warning_once()
            args = list(sys.argv[1:] if argv is None else argv)
            if rewrite_argv is not None:
                args = rewrite_argv(args)
            flags, overrides = split_argv(args)
            refuse_rerun(flags, app)
            if any(f in ("--help", "-h") for f in flags):
                print(app_help(app, config_name, sys.modules[mod].__doc__ or ""))
                raise SystemExit(0)
            refuse_unused(overrides, app, unused or {})
            check_group_choices(overrides, app)
            check_plugin_choices(overrides, app)
            multirun = any(f in ("-m", "--multirun") for f in flags)

            def task(cfg: DictConfig) -> Any:
                target = getattr(importlib.import_module(mod), name)
                return one_line_errors(app)(getattr(target, "__wrapped__", target))(cfg)

            task.__module__ = mod  # Hydra names the job after the app's module

            if any(o.lstrip("+~").split("=", 1)[0] == "hydra.mode" for o in overrides):
                fail(app, "hydra.mode: not set on the command line; a multirun is -m (--multirun)")
            if not flags:
                # a plain run: compose once (with the mode hydra.main would add), check, run as Hydra's run mode
                full = compose_checked(app, config_name, [*overrides, "hydra.mode=RUN"],
                                       job_name=mod.rsplit(".", 1)[-1], keep_hydra=True)
                job = copy.deepcopy(full)
                with open_dict(job):
                    del job["hydra"]
                validated(app, validate, job)
                folder = _claimed(app, lambda: run_folder.claim_hydra(full.hydra, job, "run", app,
                                                                      _given(overrides, "hydra.run.dir")))
                try:
                    run_composed(full, config_name, task)
                except BaseException as exc:
                    run_folder.settle(folder, exc, single=True)
                    raise
                run_folder.settle(folder, None, single=True)
                return None  # as hydra.main: a console script's exit status is 0, not the task's value
            folder = None
            if multirun and not set(flags) - {"-m", "--multirun"}:
                jobs = _sweep_jobs_checked(app, config_name, overrides)
                for job in jobs:
                    cfg = compose_checked(app, config_name, job)
                    validated(app, validate, cfg, f" (job {' '.join(job)})")
                    check_plugins(app)
                from hydra.core.hydra_config import HydraConfig

                folder = _claimed(app, lambda: run_folder.claim_hydra(HydraConfig.get(), cfg, "sweep", app,
                                                                      _given(overrides, "hydra.sweep.dir")))
                args = [a for a in args if a.lstrip("+~").split("=", 1)[0] != "hydra.sweep.dir"]
                args.append(f"hydra.sweep.dir={_quoted(str(folder.path))}")  # the claimed folder, pinned
            elif flags in (["--cfg", "job"], ["-c", "job"]):
                compose_checked(app, config_name, overrides)

            saved = sys.argv
            sys.argv = [saved[0] if saved else app, *args]
            try:
                return hydra.main(version_base=None, config_path="pkg://pdgym.conf", config_name=config_name)(task)()
            except BaseException as exc:
                if folder is not None:
                    run_folder.settle(folder, exc, single=False)
                    folder = None
                raise
            finally:
                sys.argv = saved
                if folder is not None:
                    run_folder.settle(folder, None, single=False)

        main.__wrapped__ = fn
        main.__doc__ = fn.__doc__
        return main

    return deco


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
