"""pdgym-table (agents/apps/sweep_table.py) on the jobs of each app's multirun: pdgym-eval's metrics.json holds a mean
per metric (over its seeds), pdgym-train's its best validation value; a metric the jobs lack is one line, exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from pdgym.agents.apps import sweep_table
from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.runner import evaluate, write_evaluation
from pdgym.envs.scenario import load_scenario


def _job(root: Path, i: int, overrides: list[str]) -> Path:
    job = root / str(i)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return job


def test_an_eval_multirun_tabulates_each_jobs_means(tmp_path):
    raw = load_scenario("decode_tier_n8", ["workload.num_requests=60"]).raw
    means = {}
    for i, name in enumerate(["least_kv", "br0"]):
        ev = evaluate(raw, candidates.resolve(name, "decode"), [0, 1])  # what pdgym-eval writes, by its writer
        write_evaluation(ev, _job(tmp_path, i, [f"policy={name}"]), "decode_tier_n8")
        means[f"policy={name}"] = ev.stats()["imbalance_mean"]["mean"]
    out = sweep_table.main([str(tmp_path), "imbalance_mean"])
    got = dict(zip(out.group, out.imbalance_mean))
    assert got.keys() == means.keys() and all(math.isclose(got[k], means[k]) for k in means)


def test_a_train_multirun_tabulates_the_objective(tmp_path):
    for i, (lr, obj) in enumerate([("1e-4", 7000.0), ("3e-4", 6500.0)]):
        job = _job(tmp_path, i, [f"agent.kwargs.learning_rate={lr}"])
        (job / "metrics.json").write_text(json.dumps({"objective": obj, "val_final": {"imbalance_mean": obj + 1}}))
    out = sweep_table.main([str(tmp_path)])
    assert list(out.objective) == [7000.0, 6500.0] and list(out.imbalance_mean) == [7001.0, 6501.0]


def test_a_sweep_without_the_asked_metric_is_one_line_exit_2(tmp_path, capsys):
    job = _job(tmp_path, 0, ["seed=0"])
    (job / "metrics.json").write_text(json.dumps({"objective": 1.0, "val_final": {}}))
    with pytest.raises(SystemExit) as exc:
        sweep_table.main([str(tmp_path), "ttft_mean"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "ttft_mean" in err[0]
    (job / "metrics.json").write_text(json.dumps({"scenario": "x", "note": "no metric here"}))
    with pytest.raises(SystemExit) as exc:
        sweep_table.main([str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "metric: none of" in err[0]


def test_an_eval_job_counts_each_of_its_seeds_not_their_mean_alone(tmp_path):
    """One pdgym-eval job of 3 seeds: the group has 3 values and their interval (the trial's table showed seeds 1
    and [m, m] for a job whose own 95% CI was wide); two jobs of 2 seeds each are 4 values."""
    from pdgym.agents.evaluation.stats import interval

    def eval_job(i, overrides, values):
        job = _job(tmp_path / overrides[0], i, overrides)
        per = {str(s): {"imbalance_mean": v} for s, v in enumerate(values)}
        stats = {"imbalance_mean": dict(interval(values), direction="lower")}
        (job / "metrics.json").write_text(json.dumps({"metrics": stats, "per_seed": per}))

    eval_job(0, ["policy=a"], [4000.0, 6000.0, 8000.0])
    out = sweep_table.main([str(tmp_path / "policy=a"), "imbalance_mean"])
    assert out.seeds.tolist() == [3] and out.jobs.tolist() == [1]
    assert out.imbalance_mean_ci_low[0] < 6000.0 < out.imbalance_mean_ci_high[0]
    assert (out.imbalance_mean_ci_low[0], out.imbalance_mean_ci_high[0]) == pytest.approx(
        (interval([4000.0, 6000.0, 8000.0])["ci_low"], interval([4000.0, 6000.0, 8000.0])["ci_high"]))
    eval_job(0, ["policy=b", "seed=0"], [1.0, 3.0])
    eval_job(1, ["policy=b", "seed=1"], [5.0, 7.0])
    out = sweep_table.main([str(tmp_path / "policy=b"), "imbalance_mean"])
    assert out.seeds.tolist() == [4] and out.jobs.tolist() == [2] and out.imbalance_mean[0] == 4.0


def test_a_group_with_a_stalled_eval_job_is_marked_has_no_mean_and_exits_1(tmp_path, capsys):
    # two seeds of one group: seed 0 runs to its end, seed 1 is cut at 0.3 simulated seconds (horizon): a mean over the
    # finished job alone would pass for the group's
    raw = load_scenario("decode_tier_n8", ["workload.num_requests=60"]).raw
    cand = candidates.resolve("least_kv", "decode")
    for i, extra in enumerate([{}, {"max_sim_time_s": 0.3}]):
        ev = evaluate(dict(raw, **extra), cand, [i])
        write_evaluation(ev, _job(tmp_path, i, ["policy=least_kv", f"seed={i}"]), "decode_tier_n8")
        assert bool(ev.per_seed[0]["stopped"]) == bool(extra)
    with pytest.raises(SystemExit) as exc:
        sweep_table.main([str(tmp_path), "imbalance_mean", "rejected"])
    out, err = capsys.readouterr()
    assert exc.value.code == 1 and len(err.strip().splitlines()) == 1 and "--allow-stalled" in err
    assert "STALLED (1/2 jobs)" in out
    csv = pd.read_csv(tmp_path / "sweep_table.csv")  # written before the exit
    row = csv.iloc[0]
    assert row.stalled == 1 and math.isnan(row.imbalance_mean) and row.rejected > 0  # the counts stay
    ok = sweep_table.main([str(tmp_path), "imbalance_mean", "--allow-stalled"])
    assert ok.stalled.tolist() == [1] and math.isnan(ok.imbalance_mean[0])


# --------------------------------------------------------------------------- values a mean cannot be taken over (issue 47)
def _eval_job(root: Path, i: int, per_seed: dict) -> None:
    job = _job(root, i, [f"policy=p{i}"])
    means = {"imbalance_mean": {"mean": 1.0}}
    (job / "metrics.json").write_text(json.dumps({"metrics": means, "per_seed": per_seed}))


@pytest.mark.parametrize("doc, words", [
    ({"objective": float("nan"), "val_final": {}}, "holds nan for objective"),
    ({"objective": float("inf"), "val_final": {}}, "holds inf for objective"),
    ({"objective": None, "val_final": {}}, "holds null (missing) for objective"),
])
def test_a_non_finite_or_missing_value_is_one_line_and_no_table(doc, words, tmp_path, capsys):
    """pdgym-table wrote sweep_table.csv over NaN, inf or null and exited 0: the interval skips them, so the mean
    of the values left passed for one over every job."""
    (_job(tmp_path, 0, ["seed=0"]) / "metrics.json").write_text(json.dumps({"objective": 1.0, "val_final": {}}))
    (_job(tmp_path, 1, ["seed=1"]) / "metrics.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as exc:
        sweep_table.main([str(tmp_path), "objective"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "sweep_table.csv").exists()


@pytest.mark.parametrize("seeds, words", [
    ({"0": {"imbalance_mean": 1.0}, "1": {}}, "null (missing) for imbalance_mean in per_seed (seed #1)"),
    ({"0": {"imbalance_mean": float("nan")}, "1": {"imbalance_mean": 1.0}}, "nan for imbalance_mean in per_seed"),
    ({"0": {"imbalance_mean": 1.0}, "1": {"imbalance_mean": float("-inf")}}, "-inf for imbalance_mean in per_seed"),
])
def test_a_missing_or_non_finite_per_seed_value_is_one_line(seeds, words, tmp_path, capsys):
    _eval_job(tmp_path, 0, seeds)
    with pytest.raises(SystemExit) as exc:
        sweep_table.main([str(tmp_path), "imbalance_mean"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "sweep_table.csv").exists()


def test_a_folder_at_the_tables_name_and_no_arguments_are_one_line(tmp_path, capsys):
    (_job(tmp_path, 0, ["seed=0"]) / "metrics.json").write_text(json.dumps({"objective": 1.0, "val_final": {}}))
    (tmp_path / "sweep_table.csv").mkdir()
    for argv, words in (([str(tmp_path)], "sweep_table.csv is not a regular file"), ([], "DIR: missing; usage:")):
        with pytest.raises(SystemExit) as exc:
            sweep_table.main(argv)
        err = capsys.readouterr()
        lines = err.err.strip().splitlines()
        assert exc.value.code == 2 and len(lines) == 1 and words in lines[0] and err.out == "", err
    assert (tmp_path / "sweep_table.csv").is_dir()
