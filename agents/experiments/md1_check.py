"""M/D/1 check: a colocated instance with one slot, fixed lengths, Poisson arrivals and FCFS
is an M/D/1 queue, so its mean wait must match Pollaczek-Khinchine: W = rho D / (2 (1 - rho))."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from pdgym.agents import plots
from pdgym.agents.common import policy_spec
from pdgym.baselines import make_policies
from pdgym.envs.sim import simulate
from tqdm import tqdm

from .harness import Experiment, experiment


def service_time(sim_cfg, policies) -> float:
    """The deterministic service time D: one request alone, arrival to finish."""
    one = dataclasses.replace(sim_cfg, workload=dataclasses.replace(sim_cfg.workload, num_requests=1))
    res = simulate(one, make_policies(policies), seed=0)
    r = res.requests.iloc[0]
    return float(r.finish - r.arrival)


def wait_for(sim_cfg, policies, d: float, rho: float, n: int, seed: int) -> tuple[float, float]:
    wl = dataclasses.replace(sim_cfg.workload, arrival="poisson", rate=rho / d, num_requests=n)
    res = simulate(dataclasses.replace(sim_cfg, workload=wl), make_policies(policies), seed=seed)
    req = res.requests
    assert (req.status == "finished").all(), "M/D/1 check lost or rejected requests"
    wait_sim = float(req.device_queue.mean())
    wait_theory = rho * d / (2 * (1 - rho))
    return wait_sim, wait_theory


@experiment
def run(exp: Experiment) -> dict:
    p = exp.p
    sim_cfg = exp.sim
    policies = policy_spec(exp.cfg)
    d = service_time(sim_cfg, policies)
    rows = []
    for rho in tqdm(list(p.rhos), desc="md1 loads"):
        ws, wt = wait_for(sim_cfg, policies, d, float(rho), int(p.num_requests), exp.seed)
        rows.append({"rho": float(rho), "wait_sim": ws, "wait_theory": wt, "rel_err": ws / wt - 1})
    table = pd.DataFrame(rows)
    exp.table(table)
    plots.lines(table.rho.tolist(), {"simulated": table.wait_sim.tolist(), "Pollaczek-Khinchine":
                table.wait_theory.tolist()}, "utilisation rho", "mean wait (s)", exp.figure("md1_wait.png"))
    main = table.iloc[int(np.argmin(np.abs(table.rho - float(p.rho))))]
    return {"rho": float(main.rho), "service_s": d, "num_requests": int(p.num_requests),
            "wait_sim": float(main.wait_sim), "wait_theory": float(main.wait_theory),
            "rel_err": float(main.rel_err), "sweep": rows}
