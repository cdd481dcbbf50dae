"""The Hydra front door (agents/front_door.py) on Hydra's public API: the checks run in Hydra's callbacks before
any folder exists, and the front door's own setting of HYDRA_FULL_ERROR (so Hydra raises its errors to be put in
one line) is not what the app's code sees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pdgym.agents.front_door import hydra_cli
from pdgym.envs.sim.config import ConfigError

SEEN: dict[str, object] = {}


def _validate(cfg) -> None:
    SEEN["validate"] = os.environ.get("HYDRA_FULL_ERROR")
    if cfg.seed == 7:
        raise ConfigError("seed: 7 refused by this test's validate")


def _task(cfg) -> None:
    from pdgym.agents.common import run_dir

    SEEN["task"] = os.environ.get("HYDRA_FULL_ERROR")
    SEEN["folder_marked"] = (run_dir() / ".pdgym-run").is_file()


main = hydra_cli("pdgym-test", "config", validate=_validate)(_task)


@pytest.mark.parametrize("users", [None, "0", "1"])
def test_the_apps_code_sees_the_users_hydra_full_error(tmp_path, monkeypatch, users):
    if users is None:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    else:
        monkeypatch.setenv("HYDRA_FULL_ERROR", users)
    SEEN.clear()
    main(["workload.num_requests=5", f"hydra.run.dir={tmp_path / 'run'}"])
    assert dict(SEEN) == {"validate": users, "task": users, "folder_marked": True}
    assert os.environ.get("HYDRA_FULL_ERROR") == users  # and it is the user's again afterwards


def test_a_refusal_in_validate_is_one_line_before_any_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["seed=7", f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == "pdgym-test: error: seed: 7 refused by this test's validate\n"
    assert not (tmp_path / "run").exists()


def test_a_composition_error_hydra_raises_is_one_line(tmp_path, capsys):
    """`nosuch=1` passes the command-line checks and fails in Hydra's composition (Hydra would print several lines
    and exit 1)."""
    with pytest.raises(SystemExit) as stop:
        main(["nosuch=1", f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("pdgym-test: error: nosuch: unknown key") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def _mode_task(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    SEEN.setdefault("modes", []).append(str(HydraConfig.get().mode))


mode_main = hydra_cli("pdgym-test", "config")(_mode_task)


@pytest.mark.parametrize(("flags", "modes", "composed"), [
    ([], ["RunMode.RUN"], 1),  # Hydra's mode probe (a second, multirun composition) skipped
    (["-m", "seed=0,1"], ["RunMode.MULTIRUN"] * 2, 1 + 2),  # the sweep once, then each job by Hydra's launcher
])
def test_a_command_composes_without_hydras_mode_probe_and_keeps_its_mode(tmp_path, monkeypatch, flags, modes, composed):
    from hydra._internal.hydra import Hydra

    calls = []
    own = Hydra.compose_config
    monkeypatch.setattr(Hydra, "compose_config", lambda self, *a, **k: calls.append(1) or own(self, *a, **k))
    SEEN.clear()
    mode_main([*flags, "workload.num_requests=5", f"hydra.run.dir={tmp_path / 'run'}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert SEEN["modes"] == modes
    assert len(calls) == composed
    assert Hydra.get_mode is not Hydra.compose_config and Hydra.get_mode.__name__ == "get_mode"  # Hydra's own again


def test_no_pdgym_config_sets_hydra_mode():
    """The mode probe is skipped because no config of pdgym's sets hydra.mode (the command line may not either)."""
    import importlib.resources

    from omegaconf import OmegaConf

    root = importlib.resources.files("pdgym.conf")
    files = [p for p in Path(str(root)).rglob("*.yaml")]
    assert len(files) > 50
    for p in files:
        assert OmegaConf.select(OmegaConf.load(p), "hydra.mode") is None, p
