"""Every app's `--cfg job` over a fixed set of overrides, against tests/golden/cfg_job.txt.

The golden file was recorded with the Hydra front door of agents/common.hydra_cli before it moved onto Hydra's
public API (issue 34, item 4): the composed job config of every app, and its one-line refusals, are the same.
Regenerate only for a deliberate config change: PDGYM_UPDATE_GOLDEN=1 pytest tests/test_cfg_job.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BIN = Path(sys.executable).parent
GOLDEN = Path(__file__).parent / "golden" / "cfg_job.txt"
UPDATE = os.environ.get("PDGYM_UPDATE_GOLDEN") == "1"

CASES: list[tuple[str, ...]] = [
    ("pdgym-sim",),
    ("pdgym-sim", "scenario=decode_tier_n16", "seed=3", "workload.num_requests=300", "policy/decode=brh",
     "slo.ttft_s=1.5"),
    ("pdgym-sim", "scenario=coloc_h100_qwen3_8b", "policy/batching=chunked", "faults.detect_s=2", "--resolve"),
    ("pdgym-sim", "scenario=nope"),
    ("pdgym-sim", "+nokey=1"),
    ("pdgym-repro", "pd_ratio"),
    ("pdgym-repro", "chunk_knee", "seed=5"),
    ("pdgym-train",),
    ("pdgym-train", "experiment=prefill_bc_maskable_ppo", "seed=2", "total_timesteps=500"),
    ("pdgym-eval", "policy=jsq"),
    ("pdgym-eval", "policy=brh", "scenario=decode_tier_n16", "seeds=[0,1]", "split=val"),
    ("pdgym-eval", "policy=jsq", "plots=false"),
    ("pdgym-leaderboard",),
    ("pdgym-leaderboard", "preset=quick", "n_jobs=1"),
    ("pdgym-enjoy", "policy=least_kv", "scenario=decode_tier_n8", "index=2"),
    ("pdgym-profile",),
    ("pdgym-profile", "hardware=h200", "model=qwen3_30b_a3b", "profile.layers=4"),
]


def render(case: tuple[str, ...], cwd: Path) -> str:
    """The case's header, exit status, the app's own stderr lines (one-line errors) and stdout."""
    app, *args = case
    p = subprocess.run([str(BIN / app), "--cfg", "job", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                       check=False)
    errors = [line for line in p.stderr.splitlines() if line.startswith(f"{app}:")]
    return "\n".join([f"### {' '.join(case)}", f"rc={p.returncode}", *errors, p.stdout.rstrip(), ""])


def render_all(cwd: Path) -> str:
    with ThreadPoolExecutor(2) as pool:
        return "\n".join(pool.map(lambda c: render(c, cwd), CASES))


def test_cfg_job_of_every_app_is_unchanged(tmp_path):
    text = render_all(tmp_path)
    if UPDATE:
        GOLDEN.write_text(text)
    golden = GOLDEN.read_text()
    assert text == golden
    assert not list(tmp_path.iterdir())  # `--cfg job` and a refusal create no folder
    apps = {c[0] for c in CASES}
    assert {f"pdgym-{a}" for a in ("sim", "repro", "train", "eval", "leaderboard", "enjoy", "profile")} <= apps
