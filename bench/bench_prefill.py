"""Prefill-side decision cost and env speed.

SBS + PBAA: microseconds per release decision with 256 buffered requests (a third of them left
over from earlier cycles) on the SBS cluster (3 prefill instances x 8 DP units): the PBAA plan
alone (basic and cache-aware), and the whole SBS release (readiness check, plan, dispatch of the
placed requests, wait counters). PrefillDispatch-v0: env steps per second with random allowed
actions, both action modes.
"""

from __future__ import annotations

import time

import numpy as np
from pdgym.baselines.sbs import SBS
from pdgym.envs.prefill_dispatch import make_env
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import Simulator
from pdgym.envs.sim import requests as R

BUFFER = 256


def loaded(allocation: str) -> tuple[Simulator, SBS]:
    """The SBS scenario with BUFFER requests held at the scheduler, a third of them pending."""
    extra = ["workload.prefix_groups=64", "cluster.prefill.prefix_cache_entries=32"] if "cache" in allocation else []
    sim_cfg = load_scenario("ds_v3_h800_3p1d", [f"workload.num_requests={BUFFER}", *extra]).sim
    pol = SBS(allocation=allocation)
    sim = Simulator(sim_cfg, {"prefill": pol}, seed=0)
    pol.reset(sim)
    req = sim.req
    for rid in range(BUFFER):
        req.state[rid] = R.BUFFERED
        req.arrival[rid] = req.buf_t[rid] = 0.0
        sim.buffer[rid] = None
        if rid % 3 == 0:
            pol.pbaa.wait[rid] = 1
    rng = np.random.default_rng(0)
    for P in sim.prefill:
        if P.caches is not None:
            for cache in P.caches:
                for k in rng.choice(64, 32, replace=False).tolist():
                    cache.touch(int(k))
    pol.cap.r_queued[:] = rng.integers(0, P.chunk_tokens // 2, size=pol.cap.r_queued.shape)
    return sim, pol


def plan_us(allocation: str, reps: int = 300) -> float:
    sim, pol = loaded(allocation)
    avail = pol.cap.c_avail(0)
    pol.pbaa.plan(sim, 0, avail)
    t0 = time.perf_counter()
    for _ in range(reps):
        pol.pbaa.plan(sim, 0, avail)
    return (time.perf_counter() - t0) / reps * 1e6


def release_us(reps: int = 40) -> tuple[float, float]:
    """Whole SBS decision (dual trigger + PBAA + dispatch), fresh state each time: (us, requests placed)."""
    total, placed = 0.0, 0
    for _ in range(reps):
        sim, pol = loaded("pbaa")
        n0 = len(sim.buffer)
        t0 = time.perf_counter()
        pol.try_release(sim)
        total += time.perf_counter() - t0
        placed += n0 - len(sim.buffer)
    return total / reps * 1e6, placed / reps


def env_steps_per_s(mode: str, steps: int = 4000) -> float:
    env = make_env(overrides=["workload.num_requests=3000", "workload.rate=150"], mode=mode)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    n = 0
    t0 = time.perf_counter()
    while n < steps:
        a = int(rng.choice(np.flatnonzero(env.action_masks())))
        _, _, term, trunc, _ = env.step(a)
        n += 1
        if term or trunc:
            env.reset()
    return n / (time.perf_counter() - t0)


def run() -> dict:
    us, placed = release_us()
    return {"pbaa_plan_us_256x24": plan_us("pbaa"), "pbaa_cache_plan_us_256x24": plan_us("pbaa_cache"),
            "sbs_release_us_256x24": us, "sbs_release_placed": placed,
            "env_timing_steps_per_s": env_steps_per_s("timing"),
            "env_allocation_steps_per_s": env_steps_per_s("allocation")}
