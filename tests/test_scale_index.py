"""Issue 36 item 3: what scanned every instance per decision now reads an index, with the same decisions.

The decode tier keeps the set of instances that neither step nor wait to start (`DecodeInstance.asleep`): a KV
transfer wakes those (in index order) instead of calling every instance. Checked here: the set matches the
instances' state between events, an instance with no batch holds no KV (what start_step's no-op shortcut relies
on), and whole runs equal the scan's (every instance woken) request for request, preemption and rejection included.
"""

from __future__ import annotations

import numpy as np
import pytest
from pdgym.envs.sim import Simulator
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.engine import Simulator as EngineSimulator

LINEAR = {"kind": "linear", "params": {"a_p": 0.01, "b_p": 2e-5, "a_d": 0.008, "b_d": 5e-5}}


def cluster(decode_count: int, kv: int = 20000, policy: str = "preempt", n: int = 400) -> dict:
    return {
        "hardware": "h800", "model": "deepseek_v3", "cost": LINEAR,
        "cluster": {"topology": "disaggregated", "kv_policy": policy,
                    "prefill": {"count": 3, "dp": 2, "ep": 2, "chunk_tokens": 2048, "kv_capacity_tokens": 100000},
                    "decode": {"count": decode_count, "dp": 4, "ep": 4, "batch_limit": 8, "kv_capacity_tokens": kv}},
        "workload": {"num_requests": n, "arrival": "poisson", "rate": 60.0,
                     "prompt": {"dist": "uniform", "low": 16, "high": 2048},
                     "output": {"dist": "geometric", "mean": 40, "max": 400}},
    }


def scan_kv_ready(self, rid: int) -> None:
    """The engine's KV_READY before the index: every decode instance is asked to wake."""
    self.req.state[rid] = R.POOL
    self.pool[rid] = None
    for d in self.decode:
        d.wake()


@pytest.mark.parametrize("decode_count", [1, 5])
def test_asleep_set_matches_state(decode_count):
    sim = Simulator(cluster(decode_count), None, seed=3)
    t, slices = 0.0, 0
    while not sim.run(until=t):
        t += 0.05
        slices += 1
        for d in sim.decode:
            assert (d.idx in d.asleep) == (not d.busy and not d.start_queued), (t, d.idx)
            if d.n_batch == 0:
                assert not d.kv.any(), "an instance with no batch holds KV"
    assert slices > 20 and sim.n_resolved == sim.req.n


@pytest.mark.parametrize(("decode_count", "kv", "policy"), [(4, 20000, "preempt"), (3, 6000, "preempt"),
                                                             (3, 6000, "reject"), (1, 20000, "preempt")])
def test_same_run_as_the_scan(monkeypatch, decode_count, kv, policy):
    cfg = cluster(decode_count, kv, policy)
    new = Simulator(cfg, None, seed=1)
    new.run()
    monkeypatch.setattr(EngineSimulator, "_kv_ready", scan_kv_ready)
    old = Simulator(cfg, None, seed=1)
    old.run()
    for col in ("state", "worker", "decode_inst", "done", "admit_step", "reason"):
        assert np.array_equal(getattr(new.req, col), getattr(old.req, col)), col
    for col in ("finish", "first_token", "decode_admit", "itl_max"):
        assert np.array_equal(getattr(new.req, col), getattr(old.req, col), equal_nan=True), col
    assert len(new.steps) == len(old.steps)
    assert new.n_events <= old.n_events
