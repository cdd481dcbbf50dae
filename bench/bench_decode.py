"""Decode routing cost: per-step dispatch time of BR-0, BR-H and IQR on a saturated tier of N = 32 workers,
B = 64, with a pool of about 256 requests (a closed loop holding N B + 256 requests), and the speed of the
DecodeRouting-v0 env under a trivial agent (first allowed action)."""

from __future__ import annotations

import time

import numpy as np
from pdgym.baselines import make_policy
from pdgym.envs.decode_routing import make_env
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import Simulator

N, B, POOL = 32, 64, 256
EXTRA = 220  # requests in prefill and KV transfer at any time in the steady state
ROUTERS = {"br0": "br0", "brh_oracle": {"name": "brh", "predictor": "oracle"},
           "brh_memo": {"name": "brh", "predictor": "memo"}, "iqr": "iqr", "least_kv": "least_kv"}


def dispatch_ms(spec, num_requests: int = 9000) -> tuple[float, float]:
    """Mean milliseconds per route() call of the saturated tier (at most 10% of the slots free, the pool
    holding 200-320 requests: the steady state, not the initial fill), and the mean pool size."""
    sc = load_scenario("decode_tier_n32", ["oracle=true", "workload.arrival=closed", f"workload.concurrency={N * B + POOL + EXTRA}",
                                           f"workload.num_requests={num_requests}", f"cluster.decode.batch_limit={B}"])
    pol = make_policy("decode", spec)
    inner = pol.route
    times, pools = [], []

    def timed(sim, inst):
        n = len(sim.pool)
        d = sim.decode[inst]
        steady = (d.batch_limit - d.batch).sum() <= 0.1 * d.dp * d.batch_limit
        t = time.perf_counter()
        inner(sim, inst)
        if steady and 200 <= n <= 320:
            times.append(time.perf_counter() - t)
            pools.append(n)

    pol.route = timed
    Simulator(sc.sim, {"decode": pol}, seed=0).run()
    return 1e3 * float(np.mean(times)), float(np.mean(pools))


def env_steps_per_s(n: int = 20000) -> float:
    env = make_env(scenario="decode_tier_n16", overrides=["workload.num_requests=6000", "workload.rate=600"])
    env.reset(seed=0)
    k = 0
    t = time.perf_counter()
    while k < n:
        _, _, term, trunc, _ = env.step(int(np.argmax(env.action_masks())))
        k += 1
        if term or trunc:
            env.reset()
    return k / (time.perf_counter() - t)


def run() -> dict:
    out = {}
    for name, spec in ROUTERS.items():
        out[f"{name}_ms_per_step"], out[f"{name}_pool_mean"] = dispatch_ms(spec)
    out["env_agent_steps_per_s"] = env_steps_per_s()
    return out
