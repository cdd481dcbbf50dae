"""DistServe's goodput (Zhong et al., OSDI 2024; ALGORITHMS.md section 9): the highest request rate at which at
least `target` (0.9) of the requests attain both SLOs of their class, found by a search over the rate.

The scenario's own arrival process and lengths are kept, only `workload.rate` moves. Starting at the scenario's
rate, the rate is doubled (or halved) until the attainment `metric` (default `slo_attainment`, the weighted
attainment; with one class or equal weights, the fraction of requests) brackets the target, then bisected until
the bracket is narrower than `rel_tol` of its lower end. Every probe runs the same `repro.seeds` (the traffic of
one seed differs between rates only by its time scale, so the curve is monotone up to the policy's own
decisions). Reported: `goodput_rps` (the bracket's lower end, where the target held), `goodput_per_gpu` (that
rate over the cluster's GPUs as configured, `gpus`: ClusterConfig.gpus), the bracket, the probes and the search's
wall time. The simpler goodput (attaining requests per second at the scenario's rate) is metrics.json's
`goodput_rps` and `goodput_per_gpu`."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from pdgym.agents.common import policy_spec
from pdgym.baselines import make_policies
from pdgym.envs.sim import ConfigError, simulate
from pdgym.envs.sim.config import MAX_RATE

from .harness import Experiment, experiment


def probe(sim_cfg, policies, rate: float, seeds: list[int], metric: str) -> float:
    import dataclasses

    cfg = dataclasses.replace(sim_cfg, workload=dataclasses.replace(sim_cfg.workload, rate=float(rate)))
    return float(np.mean([simulate(cfg, make_policies(policies), seed=s).metrics()[metric] for s in seeds]))


def search(sim_cfg, policies, seeds: list[int], target: float, rel_tol: float, metric: str,
           max_probes: int = 40) -> tuple[float, float, list[dict]]:
    """(lo, hi, probes): the target holds at rate lo and fails at hi, hi / lo - 1 <= rel_tol."""
    probes: list[dict] = []

    def ok(rate: float) -> bool:
        v = probe(sim_cfg, policies, rate, seeds, metric)
        probes.append({"rate": rate, metric: v, "meets": v >= target})
        return v >= target

    r = float(sim_cfg.workload.rate)
    if ok(r):
        lo, hi = r, r * 2
        while ok(hi):
            lo, hi = hi, hi * 2
            if hi > MAX_RATE or len(probes) >= max_probes:
                raise ConfigError(f"repro.target: {metric} stays >= {target} up to {lo:g} req/s; no goodput bound")
    else:
        hi, lo = r, r / 2
        while not ok(lo):
            hi, lo = lo, lo / 2
            if len(probes) >= max_probes:
                raise ConfigError(f"repro.target: {metric} stays below {target} down to {lo:g} req/s")
    while hi / lo - 1 > rel_tol and len(probes) < max_probes:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, hi, probes


@experiment(within={"target": "(0, 1)", "rel_tol": "(0, 1)"})
def run(exp: Experiment) -> dict:
    p = exp.p
    sim_cfg = exp.sim
    if sim_cfg.workload.arrival in ("closed", "trace") or sim_cfg.workload.rate is None:
        raise ConfigError(f"workload.arrival: the goodput search moves workload.rate of an open-loop process; got "
                          f"{sim_cfg.workload.arrival} (rate {sim_cfg.workload.rate})")
    t0 = time.perf_counter()
    lo, hi, probes = search(sim_cfg, policy_spec(exp.cfg), exp.seeds, float(p.target), float(p.rel_tol),
                            str(p.metric))
    wall = time.perf_counter() - t0
    exp.table(pd.DataFrame(probes).sort_values("rate"))
    gpus = sim_cfg.cluster.gpus
    return {"goodput_rps": lo, "goodput_per_gpu": lo / gpus, "gpus": gpus, "bracket": [lo, hi],
            "target": float(p.target), "metric": str(p.metric),
            "num_requests": int(sim_cfg.workload.num_requests), "probes": len(probes), "search_wall_s": wall}
