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


# --------------------------------------------------------------------------- a multirun checked whole (issue 47)
def _refuse_one_combination(cfg) -> None:
    if cfg.seed == 1 and cfg.workload.num_requests == 2:
        raise ConfigError("seed: 1 with workload.num_requests=2 refused by this test's validate")


sweep_main = hydra_cli("pdgym-test", "config", validate=_refuse_one_combination)(_task)


def test_a_multirun_is_checked_past_its_256th_job_before_any_runs(tmp_path, monkeypatch, capsys):
    """Job 256 of 510 (seed=1, num_requests=2: Hydra numbers the last axis fastest) is refused only in that
    combination; the front door checked the first 256 jobs (0-255), so this sweep ran 256 jobs and then failed.
    Now it is the second job checked (each value of each axis first)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        sweep_main(["-m", "seed=0,1", "workload.num_requests=range(1,256)", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "job seed=1 workload.num_requests=2" in err, err
    assert os.listdir(tmp_path) == []


def test_check_order_numbers_jobs_as_hydra_and_meets_every_value_first():
    import itertools

    from pdgym.agents.front_door import check_order

    axes = [["a=0", "a=1"], [f"b={i}" for i in range(5)], ["c=x", "c=y", "c=z"]]
    order = list(check_order(axes))
    product = [list(j) for j in itertools.product(*axes)]
    assert sorted(n for n, _ in order) == list(range(30)) and all(product[n] == job for n, job in order)
    first = {v for _, job in order[:5] for v in job}  # max axis length jobs hold every value of every axis
    assert first == {v for a in axes for v in a}
    assert [job for _, job in check_order(axes, every=False)] == [job for _, job in order[:5]]


# --------------------------------------------------------------------------- --info and --cfg as Hydra reads them
@pytest.mark.parametrize("argv, want", [
    (["plots=false", "--info"], ["--info=all"]), (["--info", "plots=false"], ["--info=all"]),
    (["--info", "config", "plots=false"], ["--info=config"]), (["-i", "defaults", "plots=false"], ["-i=defaults"]),
    (["plots=false", "--cfg", "job"], ["--cfg", "job"]), (["--cfg", "hydra", "plots=false"], ["--cfg", "hydra"]),
])
def test_info_and_cfg_with_or_without_a_value_before_or_after_overrides(argv, want):
    from pdgym.agents.front_door import check_flags, split_argv

    check_flags(argv, "pdgym-test")  # no exit: accepted
    assert split_argv(argv) == (want, ["plots=false"])


def test_info_after_an_override_prints_hydras_information_with_it(tmp_path, monkeypatch, capsys):
    """`pdgym-sim plots=false --info` and `--info plots=false` were refused ("--info: unknown 'plots=false'")."""
    from pdgym.agents.apps.sim import main as sim_main

    monkeypatch.chdir(tmp_path)
    for argv in (["plots=false", "--info"], ["--info", "plots=false"], ["--info", "config", "plots=false"]):
        sim_main(argv)
        out = capsys.readouterr().out
        assert "plots: false" in out and "Config search path" in out, argv
    assert os.listdir(tmp_path) == []


def test_an_optuna_sweep_with_no_completed_trial_ends_in_one_line(tmp_path, monkeypatch, capsys):
    """pdgym-sim returns no number for Optuna to rank: every trial failed, and Optuna's "No trials are completed
    yet." ended the sweep in a traceback."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from pdgym.agents.apps.sim import main as sim_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        sim_main(["-m", "seed=0", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "workload.num_requests=10",
                  "plots=false", f"hydra.sweep.dir={tmp_path / 'sw'}"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("pdgym-sim")]
    assert stop.value.code == 1 and len(lines) == 1 and "no trial of the sweep completed" in lines[0]
