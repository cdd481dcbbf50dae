"""Hydra's optional plugins (the `optuna` and `launchers` extras) run the apps end to end.

Each test skips where its plugin is not installed (pip install 'pdgym[optuna,launchers]'; `make test` installs them;
the Ray launcher is not an extra: see its test).
"""

from __future__ import annotations

import json
import sys

import pytest


def test_optuna_sweep_of_two_tiny_training_trials(tmp_path, monkeypatch):
    """hydra/sweeper=optuna_ppo: 2 trials, each a whole (tiny) pdgym-train run with its model and metrics."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from pdgym.agents.training.train import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    sweep = tmp_path / "sweep"
    main(["-m", "hydra/sweeper=optuna_ppo", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
          f"hydra.sweep.dir={sweep}", "total_timesteps=32", "n_envs=1", "eval.freq=32", "eval.seeds=[0]",
          "checkpoint_freq=32", "env.overrides=['workload.num_requests=60']", "agent.kwargs.n_steps=32",
          "agent.kwargs.batch_size=32", "progress=false"])
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 2, list(sweep.iterdir())
    for job in jobs:
        assert (job / "final_model.zip").is_file() and (job / ".hydra" / "overrides.yaml").is_file()
        assert "agent.kwargs.learning_rate" in (job / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((job / "metrics.json").read_text())
    assert (sweep / "optimization_results.yaml").is_file()  # the sweeper's best parameters and value


def test_submitit_local_multirun_of_two_sim_jobs(tmp_path, monkeypatch):
    """hydra/launcher=submitit_local: 2 pdgym-sim jobs, each in its own process, each with its metrics."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from pdgym.agents.apps.sim import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["pdgym-sim"])
    sweep = tmp_path / "sweep"
    main(["-m", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}", "workload.num_requests=50",
          "seed=0,1", "plots=false"])
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name[:1].isdigit())
    assert [p.name.split("_")[0] for p in jobs] == ["0", "1"], list(sweep.iterdir())
    seeds = set()
    for job in jobs:
        metrics = json.loads((job / "metrics.json").read_text())
        assert metrics and (job / "requests.csv").is_file()
        seeds.add((job / ".hydra" / "overrides.yaml").read_text().count("seed=1"))
    assert seeds == {0, 1}  # one job per seed
    assert (sweep / ".submitit").is_dir()  # the jobs really went through submitit


def test_ray_multirun_on_a_local_ray_instance(tmp_path, monkeypatch):
    """hydra/launcher=ray (conf/hydra/launcher/ray.yaml): 2 pdgym-sim jobs as Ray tasks on a Ray instance
    this process starts (init.address=null). Not a pdgym extra (hydra-ray-launcher pins cloudpickle<3, which
    joblib 1.6 refuses): it runs where the plugin is installed, e.g. the side environment of docs/agents.md."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher.ray_launcher")
    from pdgym.agents.apps.sim import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["pdgym-sim"])
    sweep = tmp_path / "sweep"
    main(["-m", "hydra/launcher=ray", "hydra.launcher.ray.init.address=null", "+hydra.launcher.ray.init.num_cpus=2",
          "hydra.launcher.ray.remote.num_cpus=1", f"hydra.sweep.dir={sweep}", "workload.num_requests=50",
          "seed=0,1", "plots=false"])
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name[:1].isdigit())
    assert [p.name.split("_")[0] for p in jobs] == ["0", "1"], list(sweep.iterdir())
    assert all(json.loads((job / "metrics.json").read_text()) for job in jobs)
