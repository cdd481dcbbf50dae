"""The Hydra front door (agents/front_door.py) on Hydra's public API: the checks run in Hydra's callbacks before
any folder exists, and the front door's own setting of HYDRA_FULL_ERROR (so Hydra raises its errors to be put in
one line) is not what the app's code sees."""

from __future__ import annotations

import os

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
