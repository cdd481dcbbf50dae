"""pdgym-enjoy: a baseline replayed on a tiny scenario leaves non-blank PNG frames, a GIF, a text log and a
summary; an unknown policy is one line, exit 2, and no output at all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np

ENV_VARS = dict(os.environ, WANDB_MODE="disabled")
TINY = ["scenario=decode_tier_n8", "workload.num_requests=24", "every=4", "max_frames=5", "batch=2"]


def enjoy(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdgym.agents.apps.enjoy", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=ENV_VARS)


def test_enjoy_replays_a_baseline_into_frames_gif_and_summary(tmp_path):
    import matplotlib.image as mpimg
    from PIL import Image

    out = tmp_path / "run"
    p = enjoy("policy=least_kv", *TINY, f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr
    frames = sorted((out / "frames").glob("*.png"))
    assert [f.name for f in frames] == [f"frame_{i:04d}.png" for i in range(len(frames))]
    assert 2 <= len(frames) <= 5
    shapes = set()
    for f in frames:
        img = mpimg.imread(f)
        assert img.ndim == 3 and float(np.var(img)) > 0, f"{f.name} is blank"
        shapes.add(img.shape)
    assert len(shapes) == 1  # one size per episode: the frames stack into the GIF
    with Image.open(out / "episode.gif") as gif:
        assert gif.format == "GIF" and gif.n_frames == len(frames)
    assert "decision 0:" in (out / "episode.txt").read_text()
    s = json.loads((out / "summary.json").read_text())
    # the action taken at every decision, in words (issue 27): one line each in decisions.txt, and on each frame's text
    log = (out / "decisions.txt").read_text().splitlines()
    assert len(log) == s["decisions"] and all(re.search(r"route req \d+ \(\d+ tok\) -> worker \d$", ln) for ln in log), log
    assert (out / "episode.txt").read_text().count("\nchosen: route req ") == len(frames) - 1  # the last: episode over
    assert s["requests_resolved"] == s["requests"] == 24 and s["decisions"] > 0
    assert s["policy"] == "least_kv" and s["point"] == "decode" and s["n_frames"] == len(frames)
    assert not list(out.glob(".*tmp*"))  # no temporary left behind
    lines = p.stdout.splitlines()
    assert sum(ln.startswith("frames ") for ln in lines) >= 1  # progress, one line per batch of frames
    assert any(ln.startswith("episode return ") and "24/24 requests resolved" in ln for ln in lines), p.stdout


def test_enjoy_unknown_policy_is_one_line_and_no_output(tmp_path):
    out = tmp_path / "run"
    p = enjoy("policy=no_such_policy", *TINY, f"hydra.run.dir={out}")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "no_such_policy" in p.stderr
    assert not out.exists()  # no run folder, no frames
