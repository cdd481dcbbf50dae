"""The compiled-core prototype (bench/bench_compiled.py) measures the same work as the engine: run as plain
Python (no numba needed), its decode-tier loop finishes every request when the engine does."""

from __future__ import annotations

import numpy as np
import pytest

from bench import bench_compiled  # the repository root is on sys.path under `python -m pytest` (make test)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_prototype_replays_the_engines_decode_tier(monkeypatch):
    monkeypatch.setattr(bench_compiled, "SCENARIO", ["scenario=decode_tier_n16", "workload.num_requests=1500"])
    sim, wall, frac = bench_compiled.python_run()
    assert wall > 0 and 0.1 < frac < 0.95  # the decode chain is a real share of the run, not all of it
    args, order = bench_compiled.prototype_inputs(sim)
    assert len(order) > 1000 and int(sim.req.preemptions.sum()) == 0
    finish, steps = bench_compiled.decode_tier_loop(*args)
    assert steps == sim.decode[0].steps
    np.testing.assert_allclose(finish, sim.req.finish[order], rtol=1e-9, atol=1e-9)
