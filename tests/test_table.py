"""pdgym-table (agents/apps/sweep_table.py) on the jobs of each app's multirun: pdgym-eval's metrics.json holds a mean
per metric (over its seeds), pdgym-train's its best validation value; a metric the jobs lack is one line, exit 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

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
