"""Simulator speed on the DeepSeek-V3 / H800 disaggregated scenario (3 prefill x DP 8, 1 decode x DP 32)
replaying the Azure conversation trace (all 19,366 requests, rescaled to a sustainable rate)."""

from __future__ import annotations

import time

from pdgym.envs.sim import SimResult, Simulator
from pdgym.envs.sim.events import PassKind

CONFIG = {
    "hardware": "h800", "model": "deepseek_v3",
    "cluster": {"topology": "disaggregated",
                "prefill": {"count": 3, "dp": 8, "ep": 8, "chunk_tokens": 3072},
                "decode": {"count": 1, "dp": 32, "ep": 32, "batch_limit": 128}},
    "workload": {"num_requests": 19366, "arrival": "trace", "trace": "azure_conv", "rate": 60.0},
}


def run() -> dict:
    best = None
    for _ in range(3):
        sim = Simulator(CONFIG, None, seed=0)
        t0 = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, sim)
    wall, sim = best
    m = SimResult(sim).summary()
    return {"requests_per_wall_s": sim.req.n / wall, "events_per_wall_s": sim.n_events / wall,
            "decode_steps": float((SimResult(sim).steps.kind == PassKind.DECODE).sum()), "sim_time_s": m["sim_time_s"],
            "finished": m["finished"]}
