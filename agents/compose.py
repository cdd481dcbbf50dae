"""Composing an app config with Hydra's Compose API, every failure one line (agents/errors.py).

`compose_checked` is for the apps that compose without a Hydra run (pdgym-repro, bench scripts); the Hydra
apps compose through `hydra.main` (agents/front_door.py), which checks each job of a multirun with
`compose_job`. `resolving` makes `${hydra:...}` interpolations resolvable for a check made before Hydra's run.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from pdgym.agents.errors import fail, fail_error
from pdgym.envs.compose_errors import group_options, hydra_error_line, new_root_key
from pdgym.envs.sim.config import ConfigError


def compose_error_line(exc: BaseException, overrides: list[str], config_name: str) -> str | None:
    """One line for an error Hydra or OmegaConf raised while composing `config_name`, or None when `exc` is no
    composition error (the caller re-raises it)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        return hydra_error_line(exc, overrides, config_name)
    if isinstance(exc, ValueError):  # Hydra's own checks: of the defaults list (a config group set to null), of flags
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        culprit = next((o for o in overrides if o.split("=", 1)[-1] == "null" and group_options(o.split("=")[0])),
                       None)
        if culprit is None:
            return first
        return f"{culprit}: {first}; pick one of: {', '.join(group_options(culprit.split('=')[0]))}"
    return None


@contextlib.contextmanager
def resolving(cfg: DictConfig) -> Iterator[None]:
    """Within the block, `${hydra:...}` resolves against `cfg`'s hydra node (train's run name, a run folder's
    template). Hydra's `hydra` resolver reads the global HydraConfig, which Hydra sets only inside run_job, after it
    created the run folder; a check made before that (agents/front_door.py, `compose_checked`) sets it as run_job's
    first line does, and puts the previous one back."""
    from hydra.core.hydra_config import HydraConfig

    holder = HydraConfig.instance()
    before = holder.cfg
    holder.set_config(cfg)
    try:
        yield
    finally:
        holder.cfg = before


def job_of(cfg: DictConfig) -> DictConfig:
    """The job's config (a copy without the `hydra` node)."""
    job = copy.deepcopy(cfg)
    with open_dict(job):
        del job["hydra"]
    return job


def check_resolves(app: str, cfg: DictConfig, overrides: list[str], config_name: str) -> DictConfig:
    """The job config of a composed `cfg` (hydra node included) once every interpolation of it resolves
    (${nonexistent}, ${oc.env:NO_SUCH}), else one line, exit 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        job = job_of(cfg)
        with resolving(cfg):
            OmegaConf.to_container(job, resolve=True)
        return job
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        fail_error(app, exc, compose_error_line(exc, overrides, config_name) or str(exc))


def _composed(app: str, config_name: str, overrides: list[str], compose: Callable[[], DictConfig]) -> DictConfig:
    for o in overrides:  # +KEY=... at the top level: Hydra adds it, no app reads it
        if (line := new_root_key(o, config_name, overrides)) is not None:
            fail(app, line)
    try:
        return compose()
    except Exception as exc:
        line = compose_error_line(exc, overrides, config_name)
        if line is None:
            raise
        fail_error(app, exc, line)


def compose_checked(app: str, config_name: str, overrides: list[str], job_name: str = "app") -> DictConfig:
    """The job config of `config_name` with `overrides`, every interpolation resolvable, or one line and exit 2;
    creates no folder. For apps without a Hydra run (Hydra must not be initialised: hydra.main is not running)."""
    import hydra
    from hydra import initialize_config_module

    def compose() -> DictConfig:
        with initialize_config_module("pdgym.conf", job_name=job_name, version_base=None):
            return hydra.compose(config_name, overrides=overrides, return_hydra_config=True)

    cfg = _composed(app, config_name, overrides, compose)
    return check_resolves(app, cfg, overrides, config_name)


def compose_job(app: str, config_name: str, overrides: list[str]) -> DictConfig:
    """One job's config, hydra node included, composed inside a running hydra.main (a multirun's job, checked
    before the sweep starts), or one line and exit 2."""
    import hydra

    return _composed(app, config_name, overrides,
                     lambda: hydra.compose(config_name, overrides=overrides, return_hydra_config=True))


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
