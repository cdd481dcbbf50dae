"""The command-line contract: pdgym-sim and pdgym-repro outputs, trace replay, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pdgym.agents.run_folder import MARKER
from pdgym.envs.sim.metrics import SUMMARY_KEYS

BIN = Path(sys.executable).parent


def run(app: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / app), *args], capture_output=True, text=True, cwd=cwd, timeout=300, check=False)


def test_sim_writes_metrics_json_with_the_design_keys(tmp_path):
    out = tmp_path / "run"
    p = run("pdgym-sim", "scenario=ds_v3_h800_3p1d", "seed=3", "workload.num_requests=300", f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr
    m = json.loads((out / "metrics.json").read_text())
    assert set(m) == set(SUMMARY_KEYS) | {"num_requests"}
    assert m["num_requests"] == 300 and m["finished"] + m["rejected"] == 300
    assert (out / "requests.csv").exists() and (out / "latency_cdf.png").stat().st_size > 1000


def test_sim_plots_a_colocated_cluster_without_a_decode_kv_figure(tmp_path):
    """A colocated cluster has no decode steps, so no decode-KV figure: the run still finishes with its metrics
    (it used to exit 2 on a temporary figure file never written), and a stale figure in a reused folder goes."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "decode_kv_spread.png").write_bytes(b"stale")
    (out / MARKER).write_text("")  # an earlier pdgym run's folder
    p = run("pdgym-sim", "scenario=coloc_h200_qwen3_8b", "workload.num_requests=200", f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr
    assert (out / "metrics.json").is_file() and (out / "latency_cdf.png").is_file()
    assert not (out / "decode_kv_spread.png").exists() and not list(out.glob(".*partial*"))


def test_sim_tables_parquet_hold_what_csv_holds(tmp_path):
    """tables=parquet: the same tables as csv (typed columns), and no .csv beside them."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    args = ("scenario=ds_v3_h800_3p1d", "seed=2", "workload.num_requests=200", "plots=false")
    for fmt in ("csv", "parquet"):
        p = run("pdgym-sim", *args, f"tables={fmt}", f"hydra.run.dir={tmp_path / fmt}")
        assert p.returncode == 0, p.stderr
    assert not list((tmp_path / "parquet").glob("*.csv"))
    for name in ("requests", "steps"):
        a = pd.read_csv(tmp_path / "csv" / f"{name}.csv")
        b = pd.read_parquet(tmp_path / "parquet" / f"{name}.parquet")
        assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0
        text = [c for c in b.columns if not pd.api.types.is_numeric_dtype(b[c])]
        a[text] = a[text].astype(object).fillna("")  # CSV reads an empty string back as NaN; Parquet keeps it
        b[text] = b[text].astype(object)  # requests' `class` is categorical in Parquet, names in CSV
        pd.testing.assert_frame_equal(a, b, check_dtype=False, rtol=1e-12)


@pytest.mark.parametrize("fmt", ["azure", "vidur", "vidur_no_times"])
def test_any_workload_can_be_a_trace(tmp_path, fmt):
    rows = [(0.0, 500, 20), (0.05, 900, 5), (0.3, 120, 40), (0.31, 2000, 12)] * 10
    path = tmp_path / f"{fmt}.csv"
    if fmt == "azure":
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
            f"2023-11-16 18:17:{int(i * 0.5):02d}.{i:07d},{p},{o}" for i, (_, p, o) in enumerate(rows)]
    elif fmt == "vidur":
        lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"] + [
            f"{i * 0.5 + t},{p},{o}" for i, (t, p, o) in enumerate(rows)]
    else:
        lines = ["num_prefill_tokens,num_decode_tokens"] + [f"{p},{o}" for _, p, o in rows]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    p = run("pdgym-sim", "scenario=ds_v3_h800_3p1d", f"workload.trace={path}", "workload.rate=20",
            "workload.trace_arrivals=recorded", "workload.num_requests=40", f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr
    req = __import__("pandas").read_csv(out / "requests.csv")
    assert sorted(req.prompt) == sorted(r[1] for r in rows)
    span = req.arrival.max() - req.arrival.min()
    assert 39 / span == pytest.approx(20, rel=0.35 if fmt == "vidur_no_times" else 0.05)


@pytest.mark.parametrize("args,key", [
    (["scenario=nope"], "scenario"),
    (["hardware=tpu_v9"], "hardware"),
    (["workload.rate=0"], "workload.rate"),
    (["workload.rate=abc"], "workload.rate"),
    (["cluster.prefill.count=0"], "cluster.prefill.count"),
    (["cluster.decode.kv_capacity_tokens=100"], "kv_capacity_tokens"),
    (["workload.bogus=1"], "workload.bogus"),
    (["workload.trace=/no/such.csv"], "workload.trace"),
])
def test_bad_input_is_one_line_and_leaves_no_result(tmp_path, args, key):
    out = tmp_path / "run"
    p = run("pdgym-sim", *args, f"hydra.run.dir={out}")
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in p.stderr
    assert not (out / "metrics.json").exists()


def test_trace_with_missing_columns_or_unsorted_times(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,10\n")
    p = run("pdgym-sim", f"workload.trace={bad}", f"hydra.run.dir={tmp_path / 'a'}")
    assert p.returncode == 2 and "workload.trace" in p.stderr and "GeneratedTokens" in p.stderr
    unsorted = tmp_path / "unsorted.csv"
    unsorted.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,10,5\n0.5,10,5\n")
    p = run("pdgym-sim", f"workload.trace={unsorted}", "workload.arrival=trace", f"hydra.run.dir={tmp_path / 'b'}")
    assert p.returncode == 2 and "workload.trace" in p.stderr


def test_head_to_head_runs_every_set_on_the_same_traffic(tmp_path):
    out = tmp_path / "run"
    p = run("pdgym-sim", "scenario=ds_v3_h800_3p1d", "workload.num_requests=200",
            "compare=[{label: rr},{label: rr2, prefill: round_robin}]", f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr
    import pandas as pd

    cmp_ = pd.read_csv(out / "compare.csv", index_col=0)
    assert list(cmp_.index) == ["rr", "rr2"]
    assert cmp_.loc["rr", "ttft_mean"] == cmp_.loc["rr2", "ttft_mean"]


def test_repro_md1_check(tmp_path):
    p = run("pdgym-repro", "md1_check", "repro.num_requests=4000", "repro.max_requests=4000", "repro.rhos=[0.5]", "repro.rho=0.5",
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "runs/repro/md1_check/summary.json").read_text())
    assert s["wait_sim"] == pytest.approx(s["wait_theory"], rel=0.1)
    assert (tmp_path / "runs/repro/md1_check/md1_wait.png").exists()


def test_repro_writes_to_hydra_run_dir(tmp_path):
    """hydra.run.dir=DIR is the run folder, as for the other apps (it was ignored: the run went to runs/repro)."""
    out = tmp_path / "mine" / "md1"
    p = run("pdgym-repro", "md1_check", "repro.num_requests=2000", "repro.max_requests=2000", "repro.rhos=[0.5]", "repro.rho=0.5",
            f"hydra.run.dir={out}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (out / "summary.json").exists() and (out / "md1_wait.png").exists()
    assert not (tmp_path / "runs").exists() and sorted(os.listdir(out.parent)) == ["md1"]


def test_repro_unknown_name_is_one_line(tmp_path):
    p = run("pdgym-repro", "no_such_repro", cwd=tmp_path)
    assert p.returncode == 2 and "md1_check" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_seeds_give_distinct_replicates_on_a_trace_scenario(tmp_path):
    """decode_tier_n16 replays azure_conv: seeds 1 and 2 re-draw its arrival times (same rows)."""
    import pandas as pd

    reqs = {}
    for seed in (1, 2, 1):
        out = tmp_path / f"s{seed}"
        p = run("pdgym-sim", "scenario=decode_tier_n16", f"seed={seed}", "workload.num_requests=300", "plots=false",
                f"hydra.run.dir={out}")
        assert p.returncode == 0, p.stderr
        reqs[seed] = (out / "requests.csv").read_bytes()
    assert reqs[1] != reqs[2]
    a, b = (pd.read_csv(tmp_path / f"s{s}" / "requests.csv") for s in (1, 2))
    assert list(a.prompt) == list(b.prompt) and not a.arrival.equals(b.arrival)


def test_every_configured_policy_name_resolves_in_pdgym_eval():
    """`policy/POINT=NAME` works in pdgym-sim for every conf/policy file; pdgym-eval policy=NAME must too."""
    from pdgym.agents.common import configured_policy
    from pdgym.agents.evaluation.evaluate import resolve
    from pdgym.baselines import make_policies
    from pdgym.envs.compose_errors import group_options
    from pdgym.envs.sim.points import POINTS

    for point in POINTS:
        for name in group_options(f"policy/{point}"):
            cand = resolve(name, point=point)
            assert cand.point == point and cand.label == name
            make_policies({point: cand.spec})  # a buildable spec
        assert configured_policy(point, "no_such_preset") is None
    memo = resolve("brh_memo").spec  # inherits brh through its defaults list
    assert memo["name"] == "brh" and memo["predictor"] == "memo"
    assert resolve("sbs_cache").spec["allocation"] == "pbaa_cache"


def test_multirun_folders_survive_slashes_and_aggregate_into_one_table(tmp_path):
    from pdgym.agents.apps import sweep_table

    out = tmp_path / "sweep"
    p = run("pdgym-sim", "-m", "policy/decode=least_kv,random", "seed=0,1", "scenario=decode_tier_n8",
            "workload.num_requests=120", "plots=false", f"hydra.sweep.dir={out}")
    assert p.returncode == 0, p.stderr[-2000:]
    jobs = sorted(d for d in out.iterdir() if d.is_dir())
    assert len(jobs) == 4 and all((d / "metrics.json").exists() for d in jobs)  # one level: '/' became '_'
    (jobs[0] / "metrics.json").unlink()  # an interrupted job is skipped, not averaged
    t = sweep_table.main([str(out), "ttft_mean", "imbalance_mean"])
    assert sorted(t.seeds) == [1, 2] and len(t) == 2
    assert (t.imbalance_mean_ci_low >= 0).all() and (t.imbalance_mean_ci_low <= t.imbalance_mean).all()
    assert (out / "sweep_table.csv").exists()


def test_hardware_and_model_files_list_every_profile_field():
    """hydra_error_line tells a user a hardware / model key cannot be added (CLOSED_SECTIONS) because every file
    lists every field of its profile; a file that left one out would make that advice wrong."""
    import dataclasses

    import yaml
    from pdgym.envs.sim.hardware import HardwareProfile
    from pdgym.envs.sim.models import ModelProfile

    conf = Path(__file__).resolve().parents[1] / "conf"
    for group, profile in (("hardware", HardwareProfile), ("model", ModelProfile)):
        fields = {f.name for f in dataclasses.fields(profile)}
        for path in sorted((conf / group).glob("*.yaml")):
            assert set(yaml.safe_load(path.read_text())) == fields, path.name
