"""Colocated simulator speed (iterations per wall second) under MB, EB* and EB+ on one H200 + Qwen3-8B
engine (closed loop, 256 clients, Azure conversation lengths), and PhaseBatching-v0 agent steps per
second (phase mode, random feasible actions)."""

from __future__ import annotations

import time

import numpy as np
from pdgym.baselines import make_policy
from pdgym.envs.phase_batching import make_env
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import Simulator


def iterations_per_s(sim_cfg, policy: str, repeats: int = 3) -> float:
    best = 0.0
    for _ in range(repeats):
        sim = Simulator(sim_cfg, {"batching": make_policy("batching", policy)}, seed=0)
        t0 = time.perf_counter()
        sim.run()
        best = max(best, sim.colocated[0].n_iters / (time.perf_counter() - t0))
    return best


def env_steps_per_s(n: int = 3000) -> float:
    env = make_env(overrides=["workload.num_requests=4000"])
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(n):
        m = env.action_masks()
        _, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(m))))
        if term or trunc:
            env.reset()
    return n / (time.perf_counter() - t0)


def run() -> dict:
    sim_cfg = load_scenario("coloc_h200_qwen3_8b", ["workload.num_requests=6000"]).sim
    out = {f"coloc_iters_per_s_{p}": iterations_per_s(sim_cfg, p) for p in ("mb", "eb_star", "eb_plus")}
    out["env_steps_per_s_phase"] = env_steps_per_s()
    return out
