"""pdgym-train interrupted (SIGINT, SIGKILL) while it writes checkpoints: nothing that looks like a
finished run is left, no damaged checkpoint stands as the newest whole one, and `resume=auto` then
finishes the run. Same pattern as tests/test_interrupts.py (pdgym-sim)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pdgym.agents.learned import model_store
from test_agents import ENV_VARS, SMALL_PPO, TINY  # the tiny training settings, reused
from test_interrupts import _interrupt

BIN = Path(sys.executable).parent
# A checkpoint every 64 steps of a budget it never reaches: the signal lands while checkpoints are written.
ARGS = [*TINY, "agent=maskable_ppo", *SMALL_PPO, "checkpoint_freq=64", "name=interrupted"]


def _started_checkpointing(out: Path) -> bool:
    ck = out / "checkpoints"
    return ck.is_dir() and any(p.name.startswith((".model_", "model_")) for p in ck.iterdir())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_train_interrupted_while_checkpointing_then_resumes(tmp_path, sig):
    out = tmp_path / "run"
    cmd = [str(BIN / "pdgym-train"), *ARGS, f"hydra.run.dir={out}"]
    r = _interrupt([*cmd, "total_timesteps=1000000"], lambda: _started_checkpointing(out), sig, tmp_path, ENV_VARS)
    if sig == signal.SIGINT:
        assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr
    else:
        assert r.returncode == -signal.SIGKILL
    # nothing that looks like a finished run ...
    for name in ("final_model.zip", "metrics.json"):
        assert not (out / name).exists(), name
    # ... and every checkpoint under its final name is whole (a cut write stays under a temporary name)
    ckpts = model_store.checkpoints(out / "checkpoints")
    assert all(model_store.is_complete(c) for c in ckpts), [c.name for c in ckpts]
    newest = model_store.latest_complete(out / "checkpoints")
    assert newest == (ckpts[-1] if ckpts else None)

    r = subprocess.run([*cmd, "total_timesteps=256", "resume=auto"], capture_output=True, text=True, timeout=300,
                       check=False, cwd=tmp_path, env=ENV_VARS)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "metrics.json").read_text())
    assert (out / "final_model.zip").is_file() and model_store.is_complete(out / "final_model.zip")
    assert m["resumed_from"] == (str(newest) if newest is not None else None)
    assert m["timesteps"] >= 256
