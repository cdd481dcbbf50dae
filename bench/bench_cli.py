"""`pdgym-sim` end to end: wall time of the whole command (interpreter start, imports, Hydra, simulate,
tables, plots) for 5,000 requests of the DeepSeek-V3 disaggregated scenario, against the `simulate()`
time it reports in metrics.json (`wall_time_s`). Also the import time of the command's module, and
whether it loads torch / stable_baselines3 / matplotlib (it should load none of them until plotting)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARGS = ["scenario=ds_v3_h800_3p1d", "workload.num_requests=5000", "seed=0"]
HEAVY = ("torch", "stable_baselines3", "matplotlib")
PROBE = ("import sys, time; t = time.perf_counter(); import pdgym.agents.apps.sim; "
         "print(time.perf_counter() - t); print(','.join(m for m in {heavy!r} if m in sys.modules))")


def end_to_end(extra: list[str]) -> tuple[float, float]:
    """(command wall seconds, simulate() seconds) of one pdgym-sim run in a fresh process."""
    exe = str(Path(sys.executable).with_name("pdgym-sim"))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([exe, *ARGS, *extra, f"hydra.run.dir={tmp}"], check=True, capture_output=True,
                       env={**os.environ, "WANDB_MODE": "offline"})
        wall = time.perf_counter() - t0
        sim = json.loads((Path(tmp) / "metrics.json").read_text())["wall_time_s"]
    return wall, sim


def import_probe() -> tuple[float, int]:
    """Seconds to import the pdgym-sim module in a fresh interpreter, and how many heavy modules it loads."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], check=True, capture_output=True,
                         text=True).stdout.splitlines()
    return float(out[0]), len([m for m in out[1].split(",") if m]) if len(out) > 1 else 0


def run() -> dict:
    wall, sim = min(end_to_end([]) for _ in range(2))
    wall_np, sim_np = min(end_to_end(["plots=false"]) for _ in range(2))
    imp, heavy = import_probe()
    return {"e2e_wall_s_5k": wall, "e2e_simulate_s_5k": sim, "e2e_over_simulate": wall / sim,
            "e2e_noplots_wall_s_5k": wall_np, "e2e_noplots_over_simulate": wall_np / sim_np,
            "import_s": imp, "heavy_modules_at_import": heavy}
