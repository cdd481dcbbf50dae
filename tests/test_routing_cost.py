"""Routing cost under overload is bounded by each router's window, not by the pool (issue 10 item 14).

Machine-independent: the pool is replaced by a dict that counts the entries a router touches
(iterated, in either direction, or looked up), and the count per route() call is compared between
a small and a large pool of the same overloaded run. Wall time is never asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
from pdgym.baselines import make_policy
from pdgym.envs.sim import Simulator
from pdgym.envs.sim import requests as R

LINEAR = {"kind": "linear", "params": {"a_p": 0.002, "b_p": 1e-6, "a_d": 0.004, "b_d": 2e-5, "b_kv": 1e-7}}


class CountingPool(dict):
    """The decode pool, counting every entry a reader touches."""

    touched = 0

    def __iter__(self):
        for k in super().__iter__():
            CountingPool.touched += 1
            yield k

    def __reversed__(self):
        for k in super().__reversed__():
            CountingPool.touched += 1
            yield k

    def __contains__(self, k):
        CountingPool.touched += 1
        return super().__contains__(k)


def overloaded(num: int, kv: int = 10**6) -> dict:
    """4 workers x 8 slots fed at about 8x what they drain: the pool grows through the run."""
    return {"hardware": "h800", "model": "qwen3_30b_a3b", "cost": LINEAR, "oracle": True,
            "cluster": {"topology": "disaggregated",
                        "prefill": {"count": 2, "dp": 4, "ep": 4, "chunk_tokens": 65536, "kv_capacity_tokens": 10**6},
                        "decode": {"count": 1, "dp": 4, "ep": 4, "batch_limit": 8, "kv_capacity_tokens": kv}},
            "workload": {"num_requests": num, "arrival": "poisson", "rate": 3000.0,
                         "prompt": {"dist": "lognormal", "mean": 600, "cv": 1.0, "max": 4000},
                         "output": {"dist": "lognormal", "mean": 60, "cv": 1.5, "max": 800}}}


def touched_per_call(spec, num: int = 2500, kv: int = 10**6) -> tuple[np.ndarray, np.ndarray, Simulator]:
    """Pool size and entries touched at every route() call of an overloaded run."""
    pol = make_policy("decode", spec)
    sim = Simulator(overloaded(num, kv), {"decode": pol}, seed=0)
    sim.pool = CountingPool()
    inner, sizes, counts = pol.route, [], []

    def route(s, inst):
        n, t0 = len(s.pool), CountingPool.touched
        inner(s, inst)
        sizes.append(n)
        counts.append(CountingPool.touched - t0)

    pol.route = route
    sim.run()
    return np.asarray(sizes), np.asarray(counts), sim


ROUTERS = ["br0", {"name": "br0", "order": "length"}, {"name": "brh", "predictor": "oracle", "horizon": 16},
           "iqr", "power_of_two", "random", "round_robin", "jsq", "least_kv_immediate"]


@pytest.mark.parametrize("spec", ROUTERS, ids=lambda s: s if isinstance(s, str) else "-".join(map(str, s.values())))
def test_routing_touches_a_window_not_the_pool(spec):
    sizes, counts, sim = touched_per_call(spec)
    assert (sim.req.state == R.FINISHED).all()
    small = (sizes >= 100) & (sizes < 400)
    large = sizes >= 1200
    assert small.sum() >= 50 and large.sum() >= 50, "regime: the pool must grow well past the window"
    # The pool grows 3x and more between the two groups of calls; the work per call does not.
    assert counts[large].mean() <= 1.5 * counts[small].mean() + 4
    assert counts[large].mean() < 0.05 * sizes[large].mean()


def test_tight_kv_skips_stay_correct_and_bounded():
    """Requests that fit no worker (tight KV) are skipped and kept; with the heap order (IQR) the
    work per call still does not scale with the pool."""
    sizes, counts, sim = touched_per_call("iqr", num=1500, kv=6000)
    assert (sim.req.state >= R.FINISHED).all() and not sim.stalled
    large = sizes >= 600
    assert large.sum() >= 20
    assert counts[large].mean() < 0.1 * sizes[large].mean()
