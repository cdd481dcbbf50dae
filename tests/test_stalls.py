"""An evaluation never hides a stall (agents/evaluation/stalls.py): a run that stopped early leaves no mean over
the requests it chose to finish, its row says STALLED, and pdgym-eval / pdgym-leaderboard exit 1 unless
allow_stalled=true."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from pdgym.agents.apps import leaderboard as L
from pdgym.agents.evaluation import stalls

sys.path.insert(0, str(Path(__file__).parent))
from test_leaderboard import tiny_config  # noqa: E402


def _eval(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    # max_sim_time_s=2: the simulated-time horizon stops seed 0 with most of its 400 requests unresolved
    args = ["pdgym.agents.evaluation.evaluate", "policy=least_kv", "scenario=decode_tier_n16",
            "workload.num_requests=400", "seeds=[0,1]", "progress=false", "hydra.run.dir=out", *extra]
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=180, cwd=tmp,
                          env=dict(os.environ, WANDB_MODE="disabled"), check=False)


def test_a_stopped_seed_makes_pdgym_eval_exit_1_with_one_line_and_no_mean(tmp_path):
    r = _eval(tmp_path, "max_sim_time_s=2")
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "stopped early" in lines[0] and "allow_stalled=true" in lines[0]
    assert "Traceback" not in r.stderr and "STALLED (2/2 seeds)" in r.stdout
    doc = json.loads((tmp_path / "out" / "metrics.json").read_text())  # written before the exit
    m = doc["metrics"]
    assert set(doc["stopped_early"]) == {"0", "1"}
    # the headline latency would be over the finished requests only: there is none
    assert m["ttft_mean"]["mean"] is None and m["ttft_mean"]["stalled"] == 2  # NaN, written as null
    # the counts stay, and they add up to the requests of both seeds
    assert m["rejected"]["mean"] > 0 and m["finished"]["mean"] + m["rejected"]["mean"] == 400
    assert "[min, max]" in r.stdout  # 2 seeds: the interval is their range, and the table says so


def test_allow_stalled_accepts_the_run_and_still_marks_it(tmp_path):
    r = _eval(tmp_path, "max_sim_time_s=2", "allow_stalled=true")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "STALLED" in r.stdout


def test_honest_keeps_counts_and_drops_means():
    iv = {"mean": 5.0, "std": 1.0, "ci_low": 4.0, "ci_high": 6.0, "n": 3}
    assert math.isnan(stalls.honest("imbalance_mean", iv, 1)["mean"])
    assert stalls.honest("rejected", iv, 1)["mean"] == 5.0
    assert stalls.honest("imbalance_mean", iv, 0) == dict(iv, stalled=0)


def test_a_stalled_row_on_the_board_is_marked_ranked_last_and_the_board_exits_1(tmp_path):
    cfg = tiny_config(tmp_path, plots=True)
    del cfg["scenarios"]["prefill_ds_v3_h800"]
    dec = cfg["scenarios"]["decode_ht_n16"]
    # the same router as least_kv, cut at 2 simulated seconds: its finished requests are the easy ones
    dec["headroom"] = [{"label": "cut", "name": "least_kv", "overrides": ["max_sim_time_s=2"]}]
    with pytest.raises(SystemExit) as exc:
        L.build(cfg)
    assert exc.value.code == 1
    board = (tmp_path / "latest").resolve()  # the board is written (and `latest` moved) before the exit
    df = pd.read_csv(board / "leaderboard.csv")
    cut = df[(df.policy == "cut") & (df.metric == "imbalance_mean")].iloc[0]
    assert cut.stalled == 2 and math.isnan(cut["mean"])
    prim = df[df.metric == "imbalance_mean"]
    assert list(prim.policy)[-1] == "cut"  # ranked last, whatever its finished requests' imbalance was
    rej = df[(df.policy == "cut") & (df.metric == "rejected")].iloc[0]
    assert rej["mean"] > 0  # the rejected count is still reported
    assert "STALLED (2/2 seeds)" in (board / "leaderboard.md").read_text()
    assert "STALLED" in (board / "leaderboard.html").read_text()
    pairs = pd.read_csv(board / "paired.csv")
    assert pairs.set_index("policy").loc["cut", "verdict"] == "not comparable"
    ok = L.build(dict(cfg, allow_stalled=True))
    assert ok["stopped_early"] and (tmp_path / "latest").resolve() == Path(ok["out_dir"]).resolve()


def test_a_board_where_every_run_of_an_agent_failed_exits_1(tmp_path, monkeypatch):
    from pdgym.agents.evaluation import leaderboard_run as R

    cfg = tiny_config(tmp_path, plots=False)
    del cfg["scenarios"]["prefill_ds_v3_h800"]
    cfg["agents"] = [{"label": "ghost", "path": "zoo:decode_ht_n16", "scenarios": ["decode_ht_n16"]}]
    real = R._task

    def broken(sc, label, kind, spec, *a):
        if kind == "agent":
            return {"ok": False, "error": "RuntimeError: the model could not run"}
        return real(sc, label, kind, spec, *a)

    monkeypatch.setattr(R, "_task", broken)
    with pytest.raises(SystemExit) as exc:
        L.build(cfg)
    assert exc.value.code == 1 and not (tmp_path / "latest").exists()


def test_a_stalled_job_of_an_eval_multirun_lets_the_sweep_finish_then_exits_1(tmp_path):
    # job 0 is cut at 0.3 simulated seconds; job 1 runs to its end: both are written, the sweep exits 1 at its end
    args = ["-m", "policy=least_kv", "scenario=decode_tier_n8", "workload.num_requests=60", "seeds=[0]",
            "progress=false", "max_sim_time_s=0.3,100", "hydra.sweep.dir=sw"]
    r = subprocess.run([sys.executable, "-m", "pdgym.agents.evaluation.evaluate", *args], capture_output=True, text=True,
                       timeout=180, cwd=tmp_path, env=dict(os.environ, WANDB_MODE="disabled"), check=False)
    assert r.returncode == 1, r.stderr[-2000:]
    jobs = sorted(p for p in (tmp_path / "sw").iterdir() if p.is_dir() and not p.name.startswith("."))
    docs = [json.loads((j / "metrics.json").read_text()) for j in jobs]
    assert [bool(d["stopped_early"]) for d in docs] == [True, False]
    last = r.stderr.strip().splitlines()[-1]
    assert "1 job(s) of the sweep" in last and jobs[0].name in last and "Traceback" not in r.stderr
    ok = subprocess.run([sys.executable, "-m", "pdgym.agents.evaluation.evaluate", *args[:-1], "allow_stalled=true",
                         "hydra.sweep.dir=sw2"], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                        env=dict(os.environ, WANDB_MODE="disabled"), check=False)
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_pdgym_sim_heads_a_set_that_left_requests_unresolved_stalled_and_says_so(tmp_path):
    # the same two sets run to their end (no mark), then cut at 0.3 simulated seconds (max_sim_time_s, one horizon
    # for the whole command): both headed STALLED, each with its warning line and the count requests.csv holds
    args = ["pdgym.agents.apps.sim", "scenario=decode_tier_n8", "workload.num_requests=60", "plots=false",
            "compare=[{label: a, decode: least_kv}, {label: b, decode: br0}]", "hydra.run.dir=out"]
    env = dict(os.environ, WANDB_MODE="disabled")
    whole = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                           env=env, check=False)
    assert whole.returncode == 0 and "STALLED" not in whole.stdout and "warning" not in whole.stderr
    cut = subprocess.run([sys.executable, "-m", *args, "max_sim_time_s=0.3", "hydra.run.dir=cut"], capture_output=True,
                         text=True, timeout=180, cwd=tmp_path, env=env, check=False)
    assert cut.returncode == 0, cut.stderr[-2000:]
    assert "a (STALLED)" in cut.stdout and "b (STALLED)" in cut.stdout
    warn = [ln for ln in cut.stderr.splitlines() if ln.startswith("pdgym-sim: warning:")]
    rejected = pd.read_csv(tmp_path / "cut" / "requests.csv").reason.isin(["stalled", "horizon"]).sum()
    assert len(warn) == 2 and rejected > 0 and f"a: {rejected} of 60 requests never resolved" in warn[0]
