"""Evaluation and leaderboard: bounded runs, paired statistics on common random numbers, regime checks,
alias merging, dated boards, bad input; a tiny board (two scenarios, two seeds, baselines + one trained
agent) written as CSV / Markdown / self-contained HTML with plots, rendered in headless Chromium when
it is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pdgym.agents.apps import leaderboard as L
from pdgym.agents.common import sim_config_from
from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.runner import run_bounded, run_one
from pdgym.agents.evaluation.stats import describe, interval, paired_ratio, verdict
from pdgym.agents.training.train import train_from_overrides
from pdgym.baselines import make_policies
from pdgym.envs.scenario import load_scenario, trace_splits
from pdgym.envs.sim import DecodeRouter, SimResult, Simulator, simulate
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.splits import apply_split

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def tiny_config(out: Path, agents: list[dict] | None = None, **extra) -> dict:
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_module("pdgym.conf", version_base=None):
        cfg = compose(config_name="leaderboard", overrides=["preset=tiny", f"out_dir={out}"])
    data = OmegaConf.to_container(cfg, resolve=True)
    data["agents"] = agents or []
    data["scenarios"]["decode_ht_n16"]["baselines"] = ["least_kv", "jsq", "random"]
    data["scenarios"]["decode_ht_n16"]["overrides"].append("max_sim_time_s=20")  # bounds an untrained agent
    data.update(extra)
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
    return Path(summary["out_dir"]), summary


# --------------------------------------------------------------------------- statistics
def test_interval_stays_inside_the_values_so_non_negative_metrics_keep_non_negative_bounds():
    s = interval([0.0, 0.0, 0.0, 12.0, float("nan")])  # a Student-t interval would go below zero here
    assert s["n"] == 4 and s["mean"] == pytest.approx(3.0)
    assert 0.0 <= s["ci_low"] <= s["mean"] <= s["ci_high"] <= 12.0
    assert interval([5.0])["ci_low"] == interval([5.0])["ci_high"] == 5.0


def test_paired_ratio_sees_a_constant_ratio_through_seed_noise():
    y = np.array([10.0, 200.0, 35.0, 4000.0])  # seeds differ by orders of magnitude ...
    p = paired_ratio(1.1 * y, y)  # ... the policy is 10% above the reference on every seed
    assert p["rel"] == pytest.approx(0.1) and p["ci_low"] == pytest.approx(0.1) and p["ci_high"] == pytest.approx(0.1)
    assert interval(1.1 * y)["ci_low"] < interval(y)["ci_high"]  # unpaired intervals overlap


def test_wording_follows_the_metric_direction():
    worse = describe("imbalance_mean", "agent", "least_kv", {"rel": 0.272, "ci_low": 0.1, "ci_high": 0.4, "n": 5})
    assert worse.startswith("agent is 27.2% worse than least_kv") and "lower is better" in worse
    assert verdict("rps", 0.05, 0.01, 0.09) == "better" and verdict("ttft_mean", 0.05, 0.01, 0.09) == "worse"
    assert verdict("rps", 0.05, -0.01, 0.09) == "no clear difference"


# --------------------------------------------------------------------------- common random numbers, bounded runs
def _raw(scenario: str, n: int) -> dict:
    return load_scenario(scenario, [f"workload.num_requests={n}"]).raw


def test_every_policy_sees_the_same_traffic_per_seed():
    raw = _raw("ds_v3_h800_3p1d", 120)
    split = trace_splits()["test"]
    tables = {}
    for name in ("round_robin", "jsq", "sbs"):
        for i in (0, 1):
            out = run_one(raw, raw["policy"], candidates.resolve(name, "prefill"), split, i)
            tables[name, i] = out.result.requests.sort_values("id")
    cols = ["arrival", "prompt", "output"]
    for i in (0, 1):
        ref = tables["round_robin", i][cols].to_numpy()
        for name in ("jsq", "sbs"):
            np.testing.assert_array_equal(tables[name, i][cols].to_numpy(), ref)
        assert not tables["jsq", i].ttft.equals(tables["sbs", i].ttft)  # the policies do differ
    assert not np.array_equal(tables["round_robin", 0].arrival, tables["round_robin", 1].arrival)


def test_heartbeat_pauses_leave_the_history_unchanged():
    # 1,000 requests: a run long enough (~0.2 s) for many heartbeats however fast the simulator gets (300
    # ran in ~0.07 s after the hot-path work and saw as few as one pause before it ended). The heartbeat
    # thread needs the GIL to pause the loop: a short switch interval lets it in often, but on a loaded
    # machine the OS may still run it only once (seen once in CI beside another test process), so the
    # claim asserted is the one that matters: at least one pause mid-run, and the same history.
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        raw = _raw("decode_tier_n16", 1000)
        cfg = sim_config_from(raw)
        sim = Simulator(cfg, make_policies(dict(raw["policy"], decode="br0")), seed=4)
        seen = []
        assert run_bounded(sim, None, lambda done, n: seen.append(done), heartbeat_s=0.0005) == ""
    finally:
        sys.setswitchinterval(old)
    assert len(seen) >= 2 and seen[0] < 1000 and seen[-1] == 1000 and seen == sorted(seen)
    ref = simulate(cfg, make_policies(dict(raw["policy"], decode="br0")), seed=4)
    assert SimResult(sim).requests.equals(ref.requests)


class SkipForever(DecodeRouter):
    """Admits nothing and polls every microsecond of simulated time: a run that never ends on its own."""

    def reset(self, sim):
        sim.set_timer(sim.now + 1e-6, "decode")

    def on_timer(self, sim, tag):
        sim.set_timer(sim.now + 1e-6, "decode")


def test_a_router_that_skips_forever_is_stopped_by_the_wall_budget_and_says_why():
    raw = _raw("decode_tier_n16", 200)
    sim = Simulator(sim_config_from(raw), dict(make_policies(raw["policy"]), decode=SkipForever()), seed=0)
    why = run_bounded(sim, 0.5, heartbeat_s=0.05)
    assert why.startswith("wall budget 0.5 s reached") and "200 of 200 requests unresolved" in why
    r = SimResult(sim).requests
    assert (r.status == "rejected").all() and (r.reason == "horizon").all()


def _decode_agent(predict) -> candidates.Candidate:
    agent = candidates.LoadedAgent(Path("."), {"env_id": "pdgym/DecodeRouting-v0", "point": "decode", "env_kwargs": {}},
                          predict)
    return candidates.Candidate("scripted", "agent", "decode", agent=agent)


def test_an_agent_whose_decisions_per_request_explode_stops_at_its_budget_as_stalled():
    # SKIP whenever allowed: every step boundary offers the whole pool, so decisions grow with the pool at
    # every step while simulated time barely moves (no wall budget here: the decision budget stops it)
    from pdgym.envs.base import DECISIONS_PER_REQUEST

    calls = []

    def skip(obs, mask):
        calls.append(1)
        return len(mask) - 1 if mask[-1] else int(np.argmax(mask))

    raw = _raw("decode_tier_n16", 300)
    out = run_one(raw, raw["policy"], _decode_agent(skip), trace_splits()["test"], 0)
    limit = int(DECISIONS_PER_REQUEST["decode"] * 300)
    assert out.stopped.startswith(f"stalled: {limit} decisions for 300 requests")
    assert len(calls) == limit  # past the budget the network is not called again
    r = out.result.requests
    assert (r.status == "finished").sum() + (r.reason == "stalled").sum() == 300 and (r.reason == "stalled").any()


def test_an_agent_within_its_budget_runs_to_the_end_with_the_history_of_an_unbounded_run():
    # least-loaded feasible worker, never SKIP: one decision per request, far inside the budget
    def least(obs, mask):
        n = len(mask) - 2
        return int(np.argmin(np.where(mask[:n], obs[13:12 + 8 * n:8], np.inf))) if mask[:n].any() else n

    raw = _raw("decode_tier_n16", 300)
    out = run_one(raw, raw["policy"], _decode_agent(least), trace_splits()["test"], 0)
    assert out.stopped == "" and out.metrics["finished"] == 300
    from pdgym.envs.decode_routing import AgentPolicy

    ref, seed = apply_split(raw, trace_splits()["test"], 0)
    plain = simulate(sim_config_from(ref), dict(make_policies(ref["policy"]), decode=AgentPolicy(least)), seed=seed)
    assert plain.requests.equals(out.result.requests)


# --------------------------------------------------------------------------- the tiny board
def test_csv_has_the_contract_columns_and_ranks_by_the_primary_metric(board):
    out, summary = board
    df = pd.read_csv(out / "leaderboard.csv")
    assert list(df.columns) == ["scenario", "policy", "kind", "metric", "mean", "ci_low", "ci_high", "seeds", "stalled"]
    assert set(df.scenario) == {"prefill_ds_v3_h800", "decode_ht_n16"}
    assert (df.seeds == 2).all() and set(df.kind) == {"baseline", "agent"}
    dec = df[(df.scenario == "decode_ht_n16") & (df.metric == "imbalance_mean")]
    assert set(dec.policy) == {"least_kv", "jsq", "random", "tiny_agent"}
    assert dec["mean"].is_monotonic_increasing  # lower imbalance ranks first
    assert (dec.ci_low <= dec["mean"]).all() and (dec["mean"] <= dec.ci_high).all()
    # the agent is a decode router: not run on the prefill scenario
    assert "tiny_agent" not in set(df[df.scenario == "prefill_ds_v3_h800"].policy)
    assert not summary["failures"]
    st = {s["scenario"]: s for s in summary["standings"]}
    assert st["decode_ht_n16"]["best_agent"] == "tiny_agent"
    assert st["decode_ht_n16"]["agent_verdict"] in ("better", "worse", "no clear difference")


def test_paired_table_and_regime_are_written_and_flag_an_out_of_regime_scenario(board):
    out, summary = board
    pairs = pd.read_csv(out / "paired.csv")
    dec = pairs[pairs.scenario == "decode_ht_n16"].set_index("policy")
    ref = dec.reference.iloc[0]
    assert ref in {"least_kv", "jsq", "random"} and dec.loc[ref, "verdict"] == "reference"
    for pol, r in dec.drop(index=ref).iterrows():  # worse-ranked policies are never called better
        assert r.verdict in ("worse", "no clear difference") and r.rel >= 0, pol
    reg = {r["scenario"]: r for r in summary["regimes"]}
    # the tiny decode scenario is the thin-pool tier: declared saturated, measured not, flagged
    assert not reg["decode_ht_n16"]["in_regime"] and "pool mean" in reg["decode_ht_n16"]["flag"]
    assert "OUT OF REGIME" in (out / "leaderboard.md").read_text()
    agg = pd.read_csv(out / "aggregate.csv").set_index("policy")
    assert agg.loc[ref, "iqm_score"] == pytest.approx(1.0, abs=0.5)
    assert ((agg.prob_improvement >= 0) & (agg.prob_improvement <= 1)).all()


def test_the_regime_policy_runs_even_when_the_baselines_leave_it_out(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg["scenarios"]["decode_ht_n16"]["baselines"] = ["jsq", "random"]  # regime_policy is least_kv
    sc = next(s for s in L.check_config(cfg)["scenarios"] if s.key == "decode_ht_n16")
    assert L.regime_policy(sc) == "least_kv"
    labels = [label for label, _, _ in L.board_candidates(sc, [])]
    assert labels == ["jsq", "random", "least_kv"]  # else the regime would be measured on no runs (NaN, flagged)


def test_markdown_html_and_plots_are_written_and_latest_points_at_the_board(board):
    out, _ = board
    assert (out.parent / "latest").resolve() == out.resolve()
    md = (out / "leaderboard.md").read_text()
    assert "## decode_ht_n16" in md and "| rank |" in md.replace("|   rank |", "| rank |")
    assert "imbalance_mean (KV tokens)" in md and "vs reference (paired)" in md
    page = (out / "leaderboard.html").read_text()
    assert page.count("<table class='leaderboard'") == 2 and "data:image/png;base64," in page
    assert "sortBy(this)" in page
    assert "http://" not in page and "https://" not in page  # self-contained
    plots = {p.name for p in (out / "plots").glob("*.png")}
    assert {"decode_ht_n16_imbalance_mean.png", "decode_ht_n16_ttft_tpot.png"} <= plots


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
def test_html_renders_in_headless_chromium_with_a_visible_table(board, tmp_path):
    from PIL import Image

    out, _ = board
    url = (out / "leaderboard.html").resolve().as_uri()
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    r = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-500:]
    dom = r.stdout
    assert dom.count('class="leaderboard"') == 2 and "tiny_agent" in dom and "least_kv" in dom
    assert dom.count("<img") >= 4
    shot = tmp_path / "leaderboard.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1400,900", url], capture_output=True,
                   timeout=120, check=False)
    img = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert img.shape[0] >= 800 and img.std() > 10  # not blank
    # the first table's borders and text: dark rows of pixels below the heading
    dark_rows = (img < 100).sum(axis=1)
    assert (dark_rows > 0.3 * img.shape[1]).sum() >= 2 or (dark_rows > 50).sum() > 100
    shutil.copy(shot, out / "leaderboard_screenshot.png")


def test_the_seeds_rule_adds_seeds_where_the_paired_interval_is_wider_than_the_effect(tmp_path):
    cfg = tiny_config(tmp_path, plots=False, max_seeds=4)
    cfg["scenarios"]["prefill_ds_v3_h800"] = None
    cfg["scenarios"]["decode_ht_n16"]["baselines"] = ["least_kv", "random"]
    cfg["scenarios"]["decode_ht_n16"]["effect"] = 1e-9  # no interval is that narrow: seeds grow to max_seeds
    summary = L.build(cfg)
    assert summary["meta"]["seeds_added"] == {"decode_ht_n16": [2, 3]}
    assert not summary["seeds_rule"][0]["seeds_enough"]
    df = pd.read_csv(Path(summary["out_dir"]) / "leaderboard.csv")
    assert (df.seeds == 4).all()
    assert "Seeds added by the seeds rule: [2, 3]" in (Path(summary["out_dir"]) / "leaderboard.md").read_text()


def test_a_board_in_worker_processes_is_the_serial_board(tmp_path):
    """Issue 46: the runs in two worker processes give the board a serial run gives (every run is seeded and alone
    in its process): the same tables, byte for byte, but for the wall times."""
    boards = {}
    for n in (1, 2):
        cfg = tiny_config(tmp_path / f"n{n}", plots=False, print=False, n_jobs=n)
        cfg["scenarios"]["decode_ht_n16"]["baselines"] = ["least_kv", "jsq"]
        boards[n] = L.build(cfg)
    one, two = (Path(boards[n]["out_dir"]) for n in (1, 2))
    assert boards[1]["meta"]["n_jobs"] == 1 and boards[2]["meta"]["n_jobs"] == 2
    for name in ("leaderboard.csv", "paired.csv", "aggregate.csv", "regime.csv"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    a, b = (pd.read_csv(d / "runs.csv").drop(columns="wall_time_s") for d in (one, two))
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 2 * 3  # 2 seeds x (prefill: round_robin; decode: least_kv, jsq)
    for key in ("standings", "regimes", "seeds_rule", "failures", "stopped_early"):
        assert boards[1][key] == boards[2][key], key


def test_the_default_board_uses_every_core():
    from pdgym.agents.evaluation.leaderboard_run import workers

    assert workers(None) == workers(-1) == len(os.sched_getaffinity(0)) and workers(3) == 3


# --------------------------------------------------------------------------- aliases, failures, bad input
def test_aliases_with_equal_results_are_one_row(tmp_path):
    cfg = tiny_config(tmp_path, plots=False)
    cfg["scenarios"] = {"batch": {"scenario": "coloc_h200_qwen3_8b", "point": "batching", "primary": "rps",
                                  "overrides": ["workload.num_requests=80"],
                                  "baselines": ["mixed", "mb", "prefill_first", "v0", "fcfs"]}}
    summary = L.build(cfg)
    df = pd.read_csv(Path(summary["out_dir"]) / "leaderboard.csv")
    assert set(df.policy) == {"mixed", "prefill_first", "fcfs"}
    assert summary["aliases"] == {"batch/mixed": ["mb"], "batch/prefill_first": ["v0"]}
    assert "mixed (= mb)" in (Path(summary["out_dir"]) / "leaderboard.md").read_text()


def test_a_scenario_where_every_run_fails_exits_non_zero_and_keeps_latest(tmp_path):
    good = L.build(tiny_config(tmp_path, plots=False))
    cfg = tiny_config(tmp_path, plots=False)
    cfg["scenarios"]["decode_ht_n16"]["baselines"] = [{"name": "br0", "window": 0}]
    cfg["scenarios"]["decode_ht_n16"]["regime"] = {}  # no regime to measure: no regime-policy runs either
    with pytest.raises(SystemExit) as exc:
        L.build(cfg)
    assert exc.value.code == 1
    assert (tmp_path / "latest").resolve() == Path(good["out_dir"]).resolve()
    assert len([d for d in tmp_path.iterdir() if d.is_dir() and d.name != "latest"]) == 2  # nothing overwritten
    tolerated = L.build(dict(cfg, tolerate_failures=True))
    assert (tmp_path / "latest").resolve() == Path(tolerated["out_dir"]).resolve()


@pytest.mark.parametrize("key, value, match", [
    ("train", [{"label": "../../x"}], "train.label"),
    ("agents", [{"label": "/abs", "path": "."}], "agents.label"),
    ("agents", ["/nonexistent/run"], "agents: entry"),
    ("split", "holdout", "split: got 'holdout'"),
    ("n_jobs", 0, "n_jobs"),
    ("metrics", ["bogus"], "metrics: unknown metric 'bogus'"),
    ("budget_s", -1, "budget_s"),
])
def test_bad_board_inputs_fail_before_anything_is_written(tmp_path, key, value, match):
    with pytest.raises(ConfigError, match=match):
        L.build(tiny_config(tmp_path / "o", **{key: value}))
    assert not (tmp_path / "o").exists()


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=180, check=False,
                          cwd=cwd, env=dict(os.environ, WANDB_MODE="disabled"))


@pytest.mark.parametrize("args, match", [
    (["pdgym.agents.apps.leaderboard", "split=holdout"], "split"),
    (["pdgym.agents.apps.leaderboard", "n_jobs=0"], "n_jobs"),
    (["pdgym.agents.evaluation.evaluate", "policy=least_kv", "show=[bogus_metric]"], "show"),
    (["pdgym.agents.evaluation.evaluate", "policy="], "policy: missing"),
    (["pdgym.agents.evaluation.evaluate", "policy=least_kv", "budget_s=0"], "budget_s"),
])
def test_cli_bad_input_is_one_line_exit_2_and_no_result(tmp_path, args, match):
    r = _cli([*args, "hydra.run.dir=out", "out_dir=lb"] if "leaderboard" in args[0] else [*args, "hydra.run.dir=out"],
             tmp_path)
    assert r.returncode == 2, r.stderr[-1500:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "metrics.json").exists() and not list(tmp_path.glob("lb/*/leaderboard.csv"))


def test_cli_eval_writes_metrics_with_the_stop_reason(tmp_path):
    r = _cli(["pdgym.agents.evaluation.evaluate", "policy=least_kv", "scenario=decode_tier_n16",
              "workload.num_requests=100", "seeds=[0]", "progress=false", "hydra.run.dir=out"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert doc["stopped_early"] == {} and doc["per_seed"]["0"]["stopped"] == ""
    assert "lower is better" in r.stdout and (tmp_path / "out" / "requests.csv").is_file()


def test_cli_runs_the_tiny_preset(tmp_path):
    r = _cli(["pdgym.agents.apps.leaderboard", "preset=tiny", f"out_dir={tmp_path}", "print=true"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ranked by" in r.stdout and (tmp_path / "latest" / "leaderboard.csv").is_file()
    # the board's reference is the best heuristic, recomputed here from the per-seed runs: on each scenario the
    # baseline (not a headroom row, not an agent) with the best mean of the primary metric in its direction
    board = tmp_path / "latest"
    runs, pairs = pd.read_csv(board / "runs.csv"), pd.read_csv(board / "paired.csv")
    summary = json.loads((board / "summary.json").read_text())
    for st in summary["standings"]:
        means = runs[(runs.scenario == st["scenario"]) & (runs.kind == "baseline")].groupby("policy")[st["primary"]].mean()
        best = means.idxmax() if st["direction"] == "higher is better" else means.idxmin()
        assert set(pairs[pairs.scenario == st["scenario"]].reference) == {best} and st["best_baseline"] == best


def test_the_boards_progress_flag_reaches_the_training_it_runs(tmp_path, monkeypatch):
    """progress=false on the board silences the training bars too (BC's collection bar was printed into logs),
    unless the train entry sets its own."""
    from pdgym.agents.training import train

    seen = []
    monkeypatch.setattr(train, "train_from_overrides", lambda overrides, run, name: seen.append(overrides))
    entries = [{"label": "a", "overrides": ["experiment=x"]}, {"label": "b", "overrides": ["progress=true"]}]
    agents = L.train_agents(entries, tmp_path, progress=False)
    assert seen == [["experiment=x", "progress=false"], ["progress=true"]]
    assert [a["label"] for a in agents] == ["a", "b"]


def test_a_board_where_every_run_of_an_agent_fails_exits_non_zero(tmp_path, monkeypatch, capsys):
    """The board's only agent fails on every scenario (its error noted in the board's table): the board exits 1,
    names the agent on stderr and leaves `latest` alone; it exited 0 printing nothing (issue 38)."""
    from pdgym.agents.evaluation import leaderboard_run

    real = leaderboard_run._task

    def failing(sc, label, *args):
        return {"ok": False, "error": "RuntimeError: boom"} if label == "z" else real(sc, label, *args)

    monkeypatch.setattr(leaderboard_run, "_task", failing)
    cfg = tiny_config(tmp_path, [{"label": "z", "path": "zoo:decode_ht_n16"}], plots=False, print=False, seeds=[0])
    cfg["scenarios"]["decode_ht_n16"]["regime"] = {}
    cfg["scenarios"]["prefill_ds_v3_h800"] = None  # one scenario is enough
    with pytest.raises(SystemExit) as exc:
        L.build(cfg)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "every run of agent z failed" in err and "tolerate_failures=true" in err
    assert not (tmp_path / "latest").exists()
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["failed_agents"] == ["z"] and not summary["failed_scenarios"]
    assert {f["policy"] for f in summary["failures"]} == {"z"}


def test_the_saved_board_says_which_agent_row_is_a_transfer_and_that_two_seeds_give_a_range(tmp_path, monkeypatch):
    """The zoo agent (trained on decode_tier_ht_n16) ranked on the tiny board's decode_tier_n16: the transfer was
    only a stderr line at the start, absent from leaderboard.md / .html / summary.json (issue 37's trial); and a
    2-seed board called its intervals 95% while its columns were [min, max]."""
    from pdgym.agents.evaluation import leaderboard_run

    real = leaderboard_run._task
    monkeypatch.setattr(leaderboard_run, "_task", lambda sc, label, *a: (
        {"ok": False, "error": "RuntimeError: not run here"} if label == "z" else real(sc, label, *a)))
    cfg = tiny_config(tmp_path, [{"label": "z", "path": "zoo:decode_ht_n16"}], plots=False, print=False,
                      seeds=[0, 1], tolerate_failures=True)
    cfg["scenarios"]["decode_ht_n16"]["regime"] = {}
    cfg["scenarios"]["prefill_ds_v3_h800"] = None
    out = Path(L.build(cfg)["out_dir"])
    md = (out / "leaderboard.md").read_text()
    assert "Transfer: z was trained on decode_tier_ht_n16" in md and "decode_tier_n16 is a transfer" in md
    assert "Transfer: z was trained on decode_tier_ht_n16" in (out / "leaderboard.html").read_text()
    assert json.loads((out / "summary.json").read_text())["meta"]["transfers"][0].startswith("z was trained on")
    assert "95% percentile-bootstrap" not in md.split("## ")[0] and "[min, max] over seeds" in md
    assert "widest paired 95% interval" not in md


def test_an_agent_whose_every_scenario_is_nulled_is_not_a_failed_agent(tmp_path, monkeypatch, capsys):
    """`scenarios.decode_ht_n16=null` takes the zoo agent's only scenario off the board: it had no run to fail, so
    the board is good and names no failed agent (it exited 1 with "every run of agent ... failed")."""
    from pdgym.agents.evaluation import leaderboard_run

    ran = []
    real = leaderboard_run._task
    monkeypatch.setattr(leaderboard_run, "_task", lambda sc, label, *a: ran.append(label) or real(sc, label, *a))
    cfg = tiny_config(tmp_path, [{"label": "z", "path": "zoo:decode_ht_n16", "scenarios": ["decode_ht_n16"]}],
                      plots=False, print=False, seeds=[0])
    cfg["scenarios"]["decode_ht_n16"] = None
    cfg["scenarios"]["prefill_ds_v3_h800"]["regime"] = {}
    summary = L.build(cfg)
    assert "z" not in ran and ran  # the prefill scenario ran its baselines, the agent nothing
    assert summary["failed_agents"] == [] and (tmp_path / "latest").exists()
    assert "every run of agent" not in capsys.readouterr().err
