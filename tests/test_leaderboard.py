"""Leaderboard: a tiny board (two scenarios, two seeds, baselines + one trained agent) written as CSV /
Markdown / self-contained HTML with plots; the page checked in headless Chromium when it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from pdgym.agents.evaluation import evaluate as E
from pdgym.agents.evaluation import leaderboard as L
from pdgym.agents.training.train import train_from_overrides

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def tiny_config(out: Path, agents: list[dict]) -> dict:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_module("pdgym.conf", version_base=None):
        cfg = compose(config_name="leaderboard", overrides=["preset=tiny", f"out_dir={out}"])
    data = OmegaConf.to_container(cfg, resolve=True)
    data["agents"] = agents
    data["scenarios"]["decode_azure_n16"]["baselines"] = ["least_kv", "jsq", "random"]
    data["scenarios"]["decode_azure_n16"]["overrides"].append("max_sim_time_s=20")  # bounds an untrained agent
    return data


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    root = tmp_path_factory.mktemp("board")
    train_from_overrides(["env=decode_routing", 'env.overrides=["workload.num_requests=120","max_sim_time_s=8"]',
                          "agent=maskable_ppo", "+env.kwargs.skip=false", "agent.kwargs.n_steps=64",
                          "agent.kwargs.batch_size=64", "total_timesteps=128", "eval.freq=0", "eval.seeds=[0]",
                          "wandb.mode=disabled", "progress=false", "max_segments=1"], root / "agent")
    out = root / "lb"
    summary = L.build(tiny_config(out, [{"label": "tiny_agent", "path": str(root / "agent")}]))
    return out, summary


def test_csv_has_the_contract_columns_and_ranks_by_the_primary_metric(board):
    out, summary = board
    df = pd.read_csv(out / "leaderboard.csv")
    assert list(df.columns) == ["scenario", "policy", "kind", "metric", "mean", "ci_low", "ci_high", "seeds"]
    assert set(df.scenario) == {"prefill_ds_v3_h800", "decode_azure_n16"}
    assert (df.seeds == 2).all() and set(df.kind) == {"baseline", "agent"}
    dec = df[(df.scenario == "decode_azure_n16") & (df.metric == "imbalance_mean")]
    assert set(dec.policy) == {"least_kv", "jsq", "random", "tiny_agent"}
    assert dec["mean"].is_monotonic_increasing  # lower imbalance ranks first
    assert (dec.ci_low <= dec["mean"]).all() and (dec["mean"] <= dec.ci_high).all()
    # the agent is a decode router: not run on the prefill scenario
    assert "tiny_agent" not in set(df[df.scenario == "prefill_ds_v3_h800"].policy)
    assert not summary["failures"]
    st = {s["scenario"]: s for s in summary["standings"]}
    assert st["decode_azure_n16"]["best_agent"] == "tiny_agent"


def test_markdown_html_and_plots_are_written(board):
    out, _ = board
    md = (out / "leaderboard.md").read_text()
    assert "## decode_azure_n16" in md and "| rank |" in md.replace("|   rank |", "| rank |")
    page = (out / "leaderboard.html").read_text()
    assert page.count("<table class='leaderboard'") == 2 and "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page  # self-contained
    plots = {p.name for p in (out / "plots").glob("*.png")}
    assert {"decode_azure_n16_imbalance_mean.png", "decode_azure_n16_ttft_tpot.png"} <= plots


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
def test_html_renders_in_headless_chromium(board):
    out, _ = board
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                        (out / "leaderboard.html").resolve().as_uri()],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-500:]
    dom = r.stdout
    assert dom.count('class="leaderboard"') == 2 and "tiny_agent" in dom and "least_kv" in dom
    assert dom.count("<img") >= 4


def test_cli_runs_the_tiny_preset(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pdgym.agents.evaluation.leaderboard", "preset=tiny", f"out_dir={tmp_path}",
                        "print=true"], capture_output=True, text=True, timeout=120, check=False,
                       env=dict(os.environ, WANDB_MODE="disabled"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ranked by" in r.stdout and (tmp_path / "leaderboard.csv").is_file()


def test_bad_scenario_entry_is_one_line(tmp_path):
    with pytest.raises(E.ConfigError, match="scenarios.x.primary"):
        L.board_scenarios({"x": {"scenario": "decode_tier_n16", "point": "decode", "primary": "speed"}})
