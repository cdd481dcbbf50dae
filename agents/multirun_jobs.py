"""A multirun, checked whole before its first job (docs/architecture.md, "A multirun, checked whole"): the sweep's
axes as Hydra's basic sweeper lists them, the order its jobs are checked in, each job's composed config (composed
once per combination of config-group choices, the rest set on it), and each job's folder held inside the sweep
folder. The front door's multirun callback (front_door.FrontDoor) drives these."""

from __future__ import annotations

import contextlib
import importlib.resources
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from pdgym.agents.compose import compose_job
from pdgym.agents.errors import fail, fail_error
from pdgym.envs.compose_errors import hydra_error_line
from pdgym.envs.sim.config import ConfigError

# The most jobs one multirun may have (hydra.callbacks.pdgym.max_jobs): every job's config is composed and validated
# before the first runs (~0.1 s a job beyond the first of each config-group choice), so a sweep of 10,000 jobs is
# checked in minutes; a larger one is more likely a typo (seed=range(0,1000000)) than a plan, and says so in one line.
MAX_JOBS = 10_000
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_axes(app: str, config_name: str, overrides: list[str], basic: bool) -> list[list[str]]:
    """Each key's list of `key=value` lines, as Hydra's basic sweeper lists them (BasicSweeper.split_arguments: one
    line for a plain override, in Hydra's spelling of its value; one per value of a choice / range sweep; a key given
    twice keeps its first place and its last value), or one line: an override that does not parse, a sweep with no
    value, a sweep inside a sweep, or an interval sweep given to the basic sweeper (only a sampling sweeper such as
    Optuna's takes one: the basic sweeper raised a HydraException traceback). `overrides`: the sweeper's params,
    then the command line's. Interval sweeps of another sweeper are left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        fail_error(app, exc, hydra_error_line(exc, overrides, config_name))
    axes: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if not o.is_sweep_override():
            axes[key] = [f"{key}={o.get_value_element_as_str()}"]
            continue
        if not o.is_discrete_sweep():
            if basic:
                fail(app, f"{o.input_line}: an interval sweep needs a sweeper that samples it (hydra/sweeper=optuna); "
                          "the basic sweeper takes lists (a,b,c) and range(start,stop[,step])")
            axes.pop(key, None)
            continue
        try:
            values = [f"{key}={v}" for v in o.sweep_string_iterator()]
        except (HydraException, OmegaConfBaseException) as exc:
            fail_error(app, exc, f"{o.input_line}: cannot list this sweep's values (a sweep inside a list is not "
                                 "one); write one list, or one range(start,stop[,step])")
        if not values:
            fail(app, f"{o.input_line}: a sweep with no value; a multirun needs at least one job")
        axes[key] = values
    return list(axes.values())


def check_order(axes: list[list[str]], every: bool = True) -> Iterator[tuple[int, list[str]]]:
    """(job number, overrides) of a multirun's jobs, numbered as Hydra's basic sweeper numbers them (the product of
    the axes, the last fastest), in the order they are checked: first enough jobs to hold every value of every axis
    once (a bad value is found after a few jobs, not after hundreds), then (`every`) the others."""
    sizes = [len(a) for a in axes]

    def number(idx: tuple[int, ...]) -> int:
        n = 0
        for i, size in zip(idx, sizes):
            n = n * size + i
        return n

    seen: set[tuple[int, ...]] = set()
    rest = itertools.product(*map(range, sizes)) if every else iter(())
    for idx in itertools.chain((tuple(i % s for s in sizes) for i in range(max(sizes, default=1))), rest):
        if idx not in seen:
            seen.add(idx)
            yield number(idx), [a[i] for a, i in zip(axes, idx)]


def _is_group(override: str) -> bool:
    """The override picks a config-group option (scenario=X, policy/prefill=Y, hydra/launcher=Z)."""
    key = override.lstrip("+~").split("=", 1)[0].split("@", 1)[0]
    return "/" in key or importlib.resources.files("pdgym.conf").joinpath(key).is_dir() or key.startswith("hydra/")


class JobConfigs:
    """The composed config of each job of a multirun. Hydra composes each job anew (~0.35 s); here the first job
    of each combination of config-group choices is composed so, and a job that differs from it only in plain
    `key=value` overrides is that config with the values that differ set as Hydra's compose sets them after the
    defaults list (OmegaConf.update, merged), in place, and the first job's values put back after (`job`). A job that sweeps
    a `~key`, or a value that is a mapping (merged into the config, not set), is composed in full."""

    def __init__(self, app: str, config_name: str):
        self.app, self.config_name, self.first = app, config_name, {}

    def first_of(self, overrides: list[str]) -> None:
        """Compose (once) the first job of `overrides`' config-group choices."""
        groups = tuple(o for o in overrides if _is_group(o))
        if groups not in self.first:
            self.first[groups] = (overrides, compose_job(self.app, self.config_name, overrides))

    @contextlib.contextmanager
    def job(self, overrides: list[str]) -> Iterator[DictConfig]:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        groups = tuple(o for o in overrides if _is_group(o))
        if groups not in self.first:
            yield compose_job(self.app, self.config_name, overrides)
            return
        first, cfg = self.first[groups]
        # the overrides this job sets otherwise than the first (a sweep's jobs share their keys, in one order);
        # `+key=b` where the first added key=a is `++key=b` on the first's config
        pairs = [(o, f) for o, f in zip(overrides, first) if o != f]
        parser = OverridesParser.create()
        changed = parser.parse_overrides([_forced(o) for o, _ in pairs])
        if any(o.is_delete() or isinstance(o.value(), dict) for o in changed):
            yield compose_job(self.app, self.config_name, overrides)
            return
        if not changed:
            yield cfg
            return
        try:
            self._apply(cfg, changed, overrides)
        except Exception:  # noqa: BLE001 - Hydra's own composition says what is wrong, in its own words
            self._apply(cfg, parser.parse_overrides([_forced(f) for _, f in pairs]), first)
            yield compose_job(self.app, self.config_name, overrides)
            return
        try:
            yield cfg
        finally:
            self._apply(cfg, parser.parse_overrides([_forced(f) for _, f in pairs]), first)

    @staticmethod
    def _apply(cfg: DictConfig, changed: list, overrides: list[str]) -> None:
        """Hydra's override step for plain and `++` overrides on `cfg` (its compose sets each with OmegaConf.update,
        merged; `++` may add the key), and the hydra node's record of the job's overrides: `overrides.task` and
        `job.override_dirname` (the sorted task overrides, minus the excluded keys, joined with item_sep, `=` as
        kv_sep), which name the job's folder."""
        with read_write(cfg):
            for o in changed:
                OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True, force_add=o.is_force_add())
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            task = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
            conf = cfg.hydra.job.config.override_dirname
            lines = sorted(o for o in task if o.lstrip("+~").split("=", 1)[0] not in set(conf.exclude_keys))
            cfg.hydra.job.override_dirname = conf.item_sep.join(lines).replace("=", conf.kv_sep)
            cfg.hydra.overrides.task = task


def _forced(override: str) -> str:
    """`+key=v` as `++key=v`: set on a config where the first job already added the key."""
    return "+" + override if override.startswith("+") and not override.startswith("++") else override


def job_folder(app: str, cfg: DictConfig, num: int) -> str:
    """Job `num`'s `hydra.sweep.subdir`, resolved as Hydra's launcher will (its number set), or one line; within
    `resolving(cfg)`."""
    from omegaconf.errors import OmegaConfBaseException

    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.job.num = cfg.hydra.job.id = num
    try:
        return str(cfg.hydra.sweep.subdir)
    except OmegaConfBaseException as exc:
        fail_error(app, exc, f"hydra.sweep.subdir: {str(exc).splitlines()[0]}")


def check_job_folders(sweep: Path, subdirs: dict[int, str], every: bool) -> None:
    """Every job's folder (the sweep folder joined with its `hydra.sweep.subdir`, as Hydra's run_job joins them)
    lies inside the sweep folder, below it, and (`every`: all jobs are known) no two jobs share one: Hydra writes
    wherever the join points (`subdir=../../x` wrote every job outside, each over the last)."""
    owner: dict[str, int] = {}
    root = os.path.normpath(sweep)
    for num, subdir in sorted(subdirs.items()):
        path = os.path.normpath(os.path.join(sweep, subdir))
        if os.path.commonpath([root, path]) != root or path == root:
            raise ConfigError(f"hydra.sweep.subdir: job {num}'s folder {subdir!r} is {path}, not a folder inside the "
                              f"sweep folder {sweep}; a job's subdir is a relative path below it (the default: "
                              "${hydra.job.num}_...)")
        if path in owner:
            why = "" if every else " (the sweeper's trials are numbered ${hydra.job.num}: name its folders by it)"
            raise ConfigError(f"hydra.sweep.subdir: jobs {owner[path]} and {num} would share the folder {path}, each "
                              f"writing over the other's results; give each job its own, e.g. with ${{hydra.job.num}}"
                              + why)
        owner[path] = num
