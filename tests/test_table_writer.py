"""requests.csv and steps.csv are written from the run's arrays without pandas (issue 46: pandas' import was 0.3 s of
pdgym-sim's ~2 s): the bytes must be what pandas' to_csv writes, which every earlier run folder holds."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from pdgym.envs.sim import metrics, simulate
from test_result_memory import coloc, disagg, tiered


@pytest.mark.parametrize("cfg", [disagg(max_sim_time_s=2.0), coloc(), tiered()], ids=["disagg_horizon", "coloc", "tiered"])
def test_tables_are_pandas_bytes(cfg, tmp_path, monkeypatch):
    """Rejections (NaN times, -1 indices), two classes with a predictor, colocated and disaggregated steps; chunks of
    a few rows (100 cells), so the chunk joins are exercised."""
    monkeypatch.setattr(metrics, "CSV_CHUNK", 100)
    res = simulate(cfg, seed=3)
    res.write(tmp_path)
    want_req = res.requests.to_csv(index=False)
    want_steps = res.step_table().to_csv(index=False)
    assert (tmp_path / "requests.csv").read_text() == want_req
    assert (tmp_path / "steps.csv").read_text() == want_steps
    if "max_sim_time_s" in cfg:
        assert ",," in want_req  # NaN cells are there to be written
    if "classes" in cfg["workload"]:
        assert "predicted_output" in want_req.splitlines()[0] and "chat" in want_req


def test_awkward_values_are_pandas_bytes(tmp_path):
    """Values a run rarely holds: tiny and huge floats (exponent notation), infinities, float32, names that need
    quoting, booleans, an empty table."""
    import pandas as pd

    cols = {"f": np.array([1e-05, 1e16, 123456789012345678.0, -0.0, np.inf, -np.inf, np.nan, 0.1, 2.5]),
            "f32": np.array([0.1, 1e-7, 3.0, np.nan, 7.25, 1e20, 0.0, -1.5, 2.0], dtype=np.float32),
            "i": np.array([0, -1, 2**62, 5, 6, 7, 8, 9, 10]),
            "s": np.array(["a", "b,c", 'say "hi"', "", "x\ny", "plain", "é", "1", "z"], dtype=object),
            "b": np.array([True, False] * 4 + [True])}
    metrics.write_csv(cols, tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text() == pd.DataFrame(cols).to_csv(index=False)
    empty = {k: v[:0] for k, v in cols.items()}
    metrics.write_csv(empty, tmp_path / "e.csv")
    assert (tmp_path / "e.csv").read_text() == pd.DataFrame(empty).to_csv(index=False)


def test_writing_csv_tables_loads_no_pandas(tmp_path):
    """A run, its summary and its CSV tables in a fresh interpreter: pandas (and the pyarrow it loads) never
    imported; parquet tables still go through pandas."""
    code = ("import json, sys; from pdgym.envs.sim import simulate; "
            f"simulate(json.loads({json.dumps(json.dumps(disagg()))}), seed=0).write({str(tmp_path)!r}); "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "False"
    assert (tmp_path / "requests.csv").exists() and (tmp_path / "steps.csv").exists()
