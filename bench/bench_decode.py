"""Decode routing cost: per-step dispatch time of BR-0, BR-H, IQR and least KV on a tier of N = 32
workers, B = 64, in two regimes: normal (saturated, a pool of about 256 requests: a closed loop holding
N B + 256 requests) and overloaded (2,000 req/s of Azure-conversation lengths into a tier that drains
about 900: the pool grows to about 3,000 over 16,000 requests); and the speed of the DecodeRouting-v0 env under a trivial agent
(first allowed action)."""

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


OVERLOAD = ["oracle=true", "workload.trace=null", "workload.arrival=poisson", "workload.rate=2000",
            "workload.prompt.dist=empirical", "workload.prompt.source=azure_conv",
            "workload.output.dist=empirical", "workload.output.source=azure_conv"]


def dispatch_ms(spec, num_requests: int = 9000, overloaded: bool = False) -> tuple[float, float]:
    """Mean milliseconds per route() call of the saturated tier (at most 10% of the slots free: the steady
    state, not the initial fill) and the mean pool size over the calls timed: pools of 200-320
    requests (normal), or of 1,500 and more (overloaded: six times the normal pool, 125 windows)."""
    if overloaded:
        over = [*OVERLOAD, f"workload.num_requests={num_requests}", f"cluster.decode.batch_limit={B}"]
        sc = load_scenario("decode_tier_n32", over)
        lo, hi = 1500, 10**9
    else:
        sc = load_scenario("decode_tier_n32", ["oracle=true", "workload.arrival=closed",
                                               f"workload.concurrency={N * B + POOL + EXTRA}",
                                               f"workload.num_requests={num_requests}", f"cluster.decode.batch_limit={B}"])
        lo, hi = 200, 320
    pol = make_policy("decode", spec)
    inner = pol.route
    times, pools = [], []

    def timed(sim, inst):
        n = len(sim.pool)
        d = sim.decode[inst]
        steady = (d.batch_limit - d.batch).sum() <= 0.1 * d.dp * d.batch_limit
        t = time.perf_counter()
        inner(sim, inst)
        if steady and lo <= n <= hi:
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
        out[f"{name}_ms_per_step_overload"], out[f"{name}_pool_mean_overload"] = dispatch_ms(spec, 16000, True)
    out["env_agent_steps_per_s"] = env_steps_per_s()
    return out
