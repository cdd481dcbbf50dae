"""M/D/1 check: a colocated instance with one slot, fixed lengths, Poisson arrivals and FCFS
is an M/D/1 queue, so its mean wait must match Pollaczek-Khinchine: W = rho D / (2 (1 - rho)).

Successive waits are strongly correlated near saturation, so the simulated mean carries a sampling error
far above the i.i.d. formula's: `rel_se` is its standard error by batch means (BATCHES consecutive
batches, whose means are close to independent), relative to the theory, and `z` = rel_err / rel_se. A
deviation of a few percent with |z| < 2 is sampling noise of a run that is too short, not a bias of the
event core; |z| > 3 would be one. A point whose rel_se exceeds `max_rel_se` (half the report's +-3% band)
cannot resolve the band and is flagged out of regime.

Each load gets the length its precision needs: the error of the mean wait falls as 1/sqrt(n) while the waits'
correlation time grows as (1 - rho)^-2, so one `num_requests` for every rho was either wasteful at low load or too
short near saturation (200,000 requests gave rel_se 1.64% at rho 0.8, out of regime at the defaults). A point
whose first run misses `max_rel_se` is run again, from scratch, at the length that first estimate says reaches
it with a margin (n (rel_se / max_rel_se)^2 x GROWTH_MARGIN, at most `max_requests`), and judged on that run
alone; a point still above it is flagged as before."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from pdgym.agents import plots
from pdgym.agents.common import policy_spec
from pdgym.baselines import make_policies
from pdgym.envs.sim import ConfigError, simulate
from tqdm import tqdm

from .harness import Experiment, experiment


def service_time(sim_cfg, policies) -> float:
    """The deterministic service time D: one request alone, arrival to finish."""
    one = dataclasses.replace(sim_cfg, workload=dataclasses.replace(sim_cfg.workload, num_requests=1))
    res = simulate(one, make_policies(policies), seed=0)
    r = res.requests.iloc[0]
    return float(r.finish - r.arrival)


BATCHES = 20
GROWTH_MARGIN = 1.3  # the first run's rel_se is itself an estimate (20 batches: about 16% relative error)


def batch_means_se(x: np.ndarray, batches: int = BATCHES) -> float:
    """Standard error of the mean of a correlated series by the method of batch means."""
    m = np.array([b.mean() for b in np.array_split(np.asarray(x, dtype=float), batches)])
    return float(m.std(ddof=1) / np.sqrt(len(m)))


def wait_for(sim_cfg, policies, d: float, rho: float, n: int, seed: int) -> tuple[float, float, float]:
    wl = dataclasses.replace(sim_cfg.workload, arrival="poisson", rate=rho / d, num_requests=n)
    res = simulate(dataclasses.replace(sim_cfg, workload=wl), make_policies(policies), seed=seed)
    req = res.requests
    assert (req.status == "finished").all(), "M/D/1 check lost or rejected requests"
    waits = req.sort_values("arrival").device_queue.to_numpy()
    wait_theory = rho * d / (2 * (1 - rho))
    return float(waits.mean()), wait_theory, batch_means_se(waits)


def needed_requests(n: int, rel_se: float, target: float, cap: int) -> int:
    """The run length that reaches relative standard error `target`, from a run of `n` requests that reached
    `rel_se` (SE ~ 1/sqrt(n)), with GROWTH_MARGIN, capped at `cap`; `n` itself when it is precise enough."""
    if not rel_se > target or n >= cap:
        return n
    return min(cap, int(np.ceil(n * (rel_se / target) ** 2 * GROWTH_MARGIN)))


def headline_is_measured(p) -> None:
    """The headline load `rho` is one of the swept `rhos` (it was silently replaced by the nearest one), and the
    cap on a point's length is not below its first length."""
    if float(p.rho) not in [float(r) for r in p.rhos]:
        raise ConfigError(f"repro.rho: got {p.rho!r}; must be one of repro.rhos {list(p.rhos)} (the headline point)")
    if int(p.max_requests) < int(p.num_requests):
        raise ConfigError(f"repro.max_requests: got {p.max_requests!r}; must be >= repro.num_requests "
                          f"({p.num_requests}): a point's first run is num_requests long")


@experiment(within={"rho": "(0, 1)", "rhos": "(0, 1)", "max_rel_se": "(0, inf)"}, check=headline_is_measured)
def run(exp: Experiment) -> dict:
    p = exp.p
    sim_cfg = exp.sim
    policies = policy_spec(exp.cfg)
    d = service_time(sim_cfg, policies)
    rows = []
    for rho in tqdm(list(p.rhos), desc="md1 loads"):
        n = int(p.num_requests)
        ws, wt, se = wait_for(sim_cfg, policies, d, float(rho), n, exp.seed)
        grown = needed_requests(n, se / wt, float(p.max_rel_se), int(p.max_requests))
        if grown > n:  # too short to resolve the band at this load: one run of the length it needs (docstring)
            n = grown
            ws, wt, se = wait_for(sim_cfg, policies, d, float(rho), n, exp.seed)
        rows.append({"rho": float(rho), "num_requests": n, "wait_sim": ws, "wait_theory": wt, "rel_err": ws / wt - 1,
                     "rel_se": se / wt, "z": (ws / wt - 1) / (se / wt) if se > 0 else float("nan")})
    table = pd.DataFrame(rows)
    main_rho = float(p.rho)  # one of the rhos (headline_is_measured)
    for r in rows:  # a run too short to resolve the band is not a test of the event core: flag it
        exp.regime(f"{'headline' if r['rho'] == main_rho else 'sweep'} rho {r['rho']}",
                   "relative standard error of the mean wait", r["rel_se"], hi=float(p.max_rel_se),
                   note="(raise repro.max_requests)")
    exp.table(table)
    plots.lines(table.rho.tolist(), {"simulated": table.wait_sim.tolist(), "Pollaczek-Khinchine":
                table.wait_theory.tolist()}, "utilisation rho", "mean wait (s)", exp.figure("md1_wait.png"))
    main = table[table.rho == main_rho].iloc[0]
    return {"rho": float(main.rho), "service_s": d, "num_requests": int(main.num_requests),
            "wait_sim": float(main.wait_sim), "wait_theory": float(main.wait_theory),
            "rel_err": float(main.rel_err), "rel_se": float(main.rel_se), "z": float(main.z), "sweep": rows}
