"""Routing cost under overload (issue 10 item 14): wall seconds of whole runs of 10,000 and 40,000
requests at 2,000 req/s (Azure-conversation lengths, Poisson) into the N = 16 decode tier, which drains
about 475: the pool grows through the run. A router whose round costs its window stays near 4x from
10k to 40k; one whose round reads the pool grows quadratically. Target: every router within 2x of
least KV at 40k."""

from __future__ import annotations

import time

from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import Simulator

ROUTERS = ("least_kv", "br0", "brh", "iqr", "power_of_two")
SIZES = (10_000, 40_000)
WORKLOAD = ["workload.rate=2000", "workload.trace=null", "workload.arrival=poisson",
            "workload.prompt.dist=empirical", "workload.prompt.source=azure_conv",
            "workload.output.dist=empirical", "workload.output.source=azure_conv"]


def wall(router: str, n: int) -> tuple[float, int]:
    """Wall seconds of one run and the largest pool it saw (sampled at the end of each decode step)."""
    sc = load_scenario("decode_tier_n16", [f"workload.num_requests={n}", *WORKLOAD])
    pol = make_policy("decode", router)
    sim = Simulator(sc.sim, {"decode": pol}, seed=0)
    inner, peak = pol.route, [0]

    def route(s, inst):
        peak[0] = max(peak[0], len(s.pool))
        inner(s, inst)

    pol.route = route
    t0 = time.perf_counter()
    sim.run()
    return time.perf_counter() - t0, peak[0]


def run() -> dict:
    out = {}
    for n in SIZES:
        for r in ROUTERS:
            out[f"{r}_wall_s_{n // 1000}k"], out[f"pool_max_{n // 1000}k"] = wall(r, n)
    big = SIZES[-1] // 1000
    for r in ROUTERS:
        out[f"{r}_over_least_kv_{big}k"] = out[f"{r}_wall_s_{big}k"] / out[f"least_kv_wall_s_{big}k"]
        out[f"{r}_growth_{SIZES[0] // 1000}k_to_{big}k"] = out[f"{r}_wall_s_{big}k"] / out[f"{r}_wall_s_{SIZES[0] // 1000}k"]
    return out
