"""Multi-seed learning curves (agents/training/curves.py): two tiny training runs, one figure with a
baseline reference line; the PNG is written and not blank."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from pdgym.agents.training.train import train_from_overrides
from test_agents import ENV_VARS, SMALL_PPO, TINY  # the tiny training settings, reused


def test_seed_curves_of_two_runs_with_a_baseline_line(tmp_path):
    import matplotlib.image as mpimg

    runs = []
    for seed in (0, 1):
        run = tmp_path / f"seed{seed}"
        train_from_overrides([*TINY, "agent=maskable_ppo", *SMALL_PPO, "eval.freq=128", f"seed={seed}"], run)
        runs.append(run)
    out = tmp_path / "curves.png"
    p = subprocess.run([sys.executable, "-m", "pdgym.agents.training.curves", *map(str, runs), "--baselines", "least_kv",
                        "--out", str(out)], capture_output=True, text=True, timeout=120, check=False, env=ENV_VARS)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == str(out)
    assert any(ln.startswith("least_kv: validation imbalance_mean ") for ln in p.stdout.splitlines()), p.stdout
    img = mpimg.imread(out)
    assert img.ndim == 3 and min(img.shape[:2]) > 100 and float(np.var(img)) > 0
    for run in runs:  # and one figure per run beside it
        assert float(np.var(mpimg.imread(run / "curves.png"))) > 0


def test_a_mean_is_drawn_only_over_seeds_of_one_recipe(tmp_path):
    from pdgym.agents.training.curves import same_recipe

    def cfg(run, lr, seed):
        run.mkdir()
        (run / "config.yaml").write_text(f"seed: {seed}\nname: r_s{seed}\nagent: {{kwargs: {{learning_rate: {lr}}}}}\n")
        return run

    a, b, c = cfg(tmp_path / "a", 0.001, 0), cfg(tmp_path / "b", 0.001, 1), cfg(tmp_path / "c", 0.0001, 2)
    assert same_recipe([a, b]) and not same_recipe([a, b, c])
