"""Re-run every case of issue 47's hostile sweep, each as a user runs it (a fresh working directory, the installed
commands), and print one row per case: its exit status, the lines on stderr, what it left behind, and whether
that is the contract (bad input: exit 2, one line, nothing written; valid input: exit 0).

    .venv/bin/python tests/issue47_cases.py            # ~3 minutes on 2 cores; not collected by pytest

The tests that pin each case are named in docs/architecture.md ("A multirun, checked whole") and in the test
files (tests/test_run_folders.py, test_front_door.py, test_slo.py, test_bad_input.py, test_table.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
PY = sys.executable


def classes(n: int) -> str:
    return "workload.classes=[" + ",".join(f"{{name: c{i}}}" for i in range(n)) + "]"


def labelled_trace(path: Path, n_labels: int, rows: int) -> Path:
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,class\n"
                    + "".join(f"{0.01 * i:.2f},{100 + i % 50},{5 + i % 7},c{i % n_labels}\n" for i in range(rows)))
    return path


def table_job(root: Path, doc: dict) -> Path:
    job = root / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    (job / "metrics.json").write_text(json.dumps(doc))
    return root


def sim_run_folder(root: Path) -> Path:
    code = ("import sys; from pdgym.agents import run_folder; "
            "run_folder.claim(sys.argv[1], 'hydra.run.dir', 'pdgym-sim').release()")
    subprocess.run([PY, "-c", code, str(root / "simrun")], check=True)
    return root / "simrun"


def py(code: str) -> list[str]:
    return [PY, "-c", code]


# (case, argv builder(tmp) -> argv, expected exit status); a builder may prepare files in tmp (outside `cwd`)
SIM = str(BIN / "pdgym-sim")
CASES = [
    ("sweep subdir=../../escape", lambda t: [SIM, "-m", "seed=0,1", "workload.num_requests=20", "plots=false",
                                              "hydra.sweep.dir=W/out", "hydra.sweep.subdir=../../escape"], 2),
    ("sweep subdir shared by two jobs", lambda t: [SIM, "-m", "seed=0,1", "workload.num_requests=20", "plots=false",
                                                   "hydra.sweep.dir=W/out", "hydra.sweep.subdir=same"], 2),
    ("output_subdir=../x", lambda t: [SIM, "workload.num_requests=20", "hydra.output_subdir=../x"], 2),
    ("predictor.sigma=1000", lambda t: [SIM, "workload.predictor.kind=lognormal", "workload.predictor.sigma=1000"], 2),
    ("sigma=60 with queue.order=sjf", lambda t: [SIM, "workload.predictor.kind=lognormal",
                                                 "workload.predictor.sigma=60", "queue.order=sjf"], 2),
    ("PrefillAdmit-v0 with 200 classes", lambda t: py(
        "import gymnasium as gym, pdgym.envs, sys\nfrom pdgym.envs.sim.config import ConfigError\n"
        "t = '[' + ','.join('{name: c%d, share: 0.005}' % i for i in range(200)) + ']'\n"
        "try:\n gym.make('pdgym/PrefillAdmit-v0', scenario='slo_pd_tiers', overrides=['workload.classes=' + t]).reset(seed=0)\n"
        "except ConfigError as e:\n print(e, file=sys.stderr); raise SystemExit(2)\n"), 2),
    ("pdgym-sim with 200 classes", lambda t: [SIM, classes(200)], 2),
    ("200 labels, 200 classes", lambda t: [SIM, f"workload.trace={labelled_trace(t / 'l200.csv', 200, 400)}",
                                           "workload.class_by=label", classes(200), "workload.num_requests=400"], 2),
    # 10,000 classes are longer than one command-line argument may be (128 kB): through the Python API instead
    ("10,000 labels, 10,000 classes (Python API)", lambda t: py(
        "import sys\nfrom pdgym.envs.sim import ConfigError, Simulator\nfrom pdgym.envs.scenario import load_scenario, "
        "merge_sim_config\n"
        f"tr = {str(labelled_trace(t / 'l1e4.csv', 10000, 10000))!r}\n"
        "over = {'workload': {'trace': tr, 'class_by': 'label', 'num_requests': 10000,\n"
        "                     'classes': [{'name': f'c{i}'} for i in range(10000)]}}\n"
        "try:\n Simulator(merge_sim_config(load_scenario('coloc_h100_qwen3_8b').sim, over), seed=0)\n"
        "except ConfigError as e:\n print(e, file=sys.stderr); raise SystemExit(2)\n"), 2),
    ("class_by=prompt, decreasing max_prompt", lambda t: [
        SIM, "workload.class_by=prompt", "workload.classes=[{name: a, max_prompt: 1000}, {name: b, max_prompt: 500}]"], 2),
    ("pdgym-table over NaN", lambda t: [str(BIN / "pdgym-table"), str(table_job(
        t / "nan", {"objective": float("nan"), "val_final": {}}))], 2),
    ("pdgym-table over inf", lambda t: [str(BIN / "pdgym-table"), str(table_job(
        t / "inf", {"objective": float("inf"), "val_final": {}}))], 2),
    ("pdgym-table over a missing per-seed value", lambda t: [str(BIN / "pdgym-table"), str(table_job(
        t / "miss", {"metrics": {"ttft_mean": {"mean": 1.0}}, "per_seed": {"0": {"ttft_mean": 1.0}, "1": {}}}))], 2),
    ("predictor.buckets=1000000000", lambda t: [SIM, "workload.predictor.kind=buckets",
                                                "workload.predictor.buckets=1000000000"], 2),
    ("gym.make obs_requests=10**9", lambda t: py(
        "import gymnasium as gym, pdgym.envs, sys\nfrom pdgym.envs.sim.config import ConfigError\n"
        "try:\n gym.make('pdgym/PrefillAdmit-v0', obs_requests=10**9)\n"
        "except ConfigError as e:\n print(e, file=sys.stderr); raise SystemExit(2)\n"), 2),
    ("-m seed=range(0,300),abc", lambda t: [SIM, "-m", "seed=range(0,300),abc"], 2),
    ("-m seed=interval(0,1)", lambda t: [SIM, "-m", "seed=interval(0,1)"], 2),
    ("-m seed=0,1 hydra/sweeper=optuna", lambda t: [SIM, "-m", "seed=0,1", "hydra/sweeper=optuna",
                                                    "hydra.sweeper.n_trials=2", "workload.num_requests=10",
                                                    "plots=false", "hydra.sweep.dir=sw"], 1),
    ("pdgym-table, a folder at sweep_table.csv", lambda t: [str(BIN / "pdgym-table"), str(_with_folder(table_job(
        t / "fold", {"objective": 1.0, "val_final": {}})))], 2),
    ("-m workload.num_requests=1,abc seed=range(0,300)", lambda t: [SIM, "-m", "workload.num_requests=1,abc",
                                                                     "seed=range(0,300)"], 2),
    ("-m seed=range(0,10001) (default max_jobs)", lambda t: [SIM, "-m", "seed=range(0,10001)"], 2),
    ("-m seed=range(0,1000) max_jobs=999", lambda t: [SIM, "-m", "seed=range(0,1000)",
                                                      "hydra.callbacks.pdgym.max_jobs=999"], 2),
    ("plots=false --info", lambda t: [SIM, "plots=false", "--info"], 0),
    ("--info plots=false", lambda t: [SIM, "--info", "plots=false"], 0),
    ("a 1 MB class label", lambda t: [SIM, f"workload.trace={_huge_label(t)}", "workload.class_by=label",
                                      "workload.classes=[{name: chat}, {name: batch}]", "workload.num_requests=2"], 2),
    ("pdgym-table, no arguments", lambda t: [str(BIN / "pdgym-table")], 2),
    ("leaderboard out_dir inside a pdgym-sim run", lambda t: [str(BIN / "pdgym-leaderboard"),
                                                              f"out_dir={sim_run_folder(t) / 'boards'}"], 2),
    ("eval: best_model.zip a folder, final_model.zip taken", lambda t: py(
        "import sys, pathlib; from pdgym.agents.evaluation.candidates import model_file\n"
        f"d = pathlib.Path({str(t)!r}) / 'trainrun'; (d / 'best_model.zip').mkdir(parents=True)\n"
        "(d / 'final_model.zip').write_bytes(b'PK')\n"
        "assert model_file(d).name == 'final_model.zip'\n"), 0),
    ("a WorkloadWarning before a trace's error line", lambda t: [SIM, f"workload.trace={_short_trace(t)}",
                                                                 "workload.num_requests=10", "workload.class_by=label",
                                                                 "workload.classes=[{name: a}, {name: b}]"], 2),
]


def _with_folder(root: Path) -> Path:
    (root / "sweep_table.csv").mkdir()
    return root


def _huge_label(t: Path) -> Path:
    p = t / "huge.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,class\n0.0,100,5,chat\n0.5,200,6," + "g" * 2**20 + "\n")
    return p


def _short_trace(t: Path) -> Path:
    p = t / "short.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n1.0,20,6\n2.0,30,7\n")
    return p


def run(name: str, build, want: int) -> tuple[str, int, int, int, str, bool]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "files").mkdir()
        cwd = tmp / "cwd"
        cwd.mkdir()
        argv = build(tmp / "files")
        p = subprocess.run(argv, check=False, cwd=cwd, capture_output=True, text=True, timeout=600)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith(("[", "\x1b["))]
        left = [str(q.relative_to(cwd)) for q in cwd.rglob("*")]
        if want == 2:
            ok = p.returncode == 2 and len(lines) == 1 and not left and "Traceback" not in p.stderr
        elif want == 1:
            ok = p.returncode == 1 and len([ln for ln in lines if ln.startswith("pdgym")]) == 1
        else:
            ok = p.returncode == 0 and "Traceback" not in p.stderr
        shown = (lines[-1] if lines else p.stdout.strip().splitlines()[0] if p.stdout.strip() else "")[:110]
        return name, p.returncode, len(lines), len(left), shown, ok


def main() -> None:
    rows = [run(*c) for c in CASES]
    print("| case | exit | stderr lines | files left | line | clean |\n|---|---|---|---|---|---|")
    for name, code, n, left, line, ok in rows:
        print(f"| {name} | {code} | {n} | {left} | {line.replace('|', '/')} | {'yes' if ok else 'NO'} |")
    bad = [r[0] for r in rows if not r[-1]]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} clean" + (f"; not clean: {', '.join(bad)}" if bad else ""))
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
