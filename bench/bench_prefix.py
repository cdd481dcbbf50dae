"""Prefix-cache replay speed: the whole Mooncake conversation trace (12,031 requests, 288,500 block hashes) on
prefix_mooncake (8 prefill x DP 8, a block LRU per unit, 1 decode x DP 32), simulate() wall time with the engine's
round-robin dispatch and with cache_ttft (which matches every request against all 64 units' caches).
Best of two runs each (the machine is shared; the CartPole reference is measured beside them)."""

from __future__ import annotations

import time

from pdgym.baselines import make_policies
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import Simulator


def replay(policy: str | None, repeats: int = 2) -> tuple[float, int]:
    cfg = load_scenario("prefix_mooncake", []).sim
    best = None
    for _ in range(repeats):
        sim = Simulator(cfg, make_policies({"prefill": policy}) if policy else None, seed=0)
        t0 = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - t0
        best = wall if best is None else min(best, wall)
    return best, sim.req.n


def run() -> dict:
    out = {}
    for label, policy in (("round_robin", None), ("cache_ttft", "cache_ttft")):
        wall, n = replay(policy)
        out[f"mooncake_{label}_wall_s"] = wall
        out[f"mooncake_{label}_requests_per_wall_s"] = n / wall
    return out
