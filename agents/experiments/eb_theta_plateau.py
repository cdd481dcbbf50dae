"""EB theta plateau: the closed-form theta0 against a sweep of fixed thetas (ALGORITHMS.md s5).

For geometric outputs of each mean mu_O and each batch size N (closed loop, 2N clients, so the
queue never empties), EB(theta, N) runs for every theta of the grid and for theta0 from the
cost model's linear coefficients; throughput is the steady-state completion rate (middle 60% of
completions). Also: the best fixed theta against the mean prompt length (theta0 ignores it), an
IFR case (gamma outputs, shape > 1) where the best theta moves up and EB* follows, and the
fluid-model throughput of the formula beside the simulated one.

With workload.trace=PATH the lengths come from the trace; the cases then cover the batch sizes
only, with mu_O the trace's mean output.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from pdgym.agents import plots
from pdgym.baselines import eb_theory as T
from pdgym.baselines.exclusive_batching import EB, EBStar
from pdgym.envs.sim import Simulator
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.config import LengthConfig
from pdgym.envs.sim.cost import linear_coefficients
from tqdm import tqdm

from .harness import Experiment, experiment
from .measure import workload_lengths


def steady_rps(sim: Simulator, lo: float = 0.2, hi: float = 0.8) -> float:
    """Completions per second between the lo and hi quantiles of completion times (no warm-up, no drain)."""
    f = np.sort(sim.req.finish[sim.req.state == R.FINISHED])
    a, b = int(lo * len(f)), int(hi * len(f)) - 1
    return (b - a) / (f[b] - f[a]) if b > a and f[b] > f[a] else float("nan")


def run_policy(sim_cfg, policy, seed: int) -> Simulator:
    sim = Simulator(sim_cfg, {"batching": policy}, seed)
    sim.run()
    return sim


def case_config(sim_cfg, n_slots: int, num_requests: int, output: LengthConfig | None,
                prompt: LengthConfig | None = None):
    """Closed loop with 2N clients on N slots; the prefill budget never splits a refill."""
    cl = sim_cfg.cluster
    co = dataclasses.replace(cl.colocated, batch_limit=n_slots, chunk_tokens=1 << 24)
    wl = sim_cfg.workload
    wl = dataclasses.replace(wl, arrival="closed", concurrency=2 * n_slots, num_requests=num_requests,
                             output=output or wl.output, prompt=prompt or wl.prompt, phases=None)
    return dataclasses.replace(sim_cfg, cluster=dataclasses.replace(cl, colocated=co), workload=wl)


def sweep(sim_cfg, thetas, extra: float, seed: int) -> tuple[dict, float]:
    """Steady rps for every theta of the grid, and for `extra` (theta0)."""
    res = {th: steady_rps(run_policy(sim_cfg, EB(theta=th), seed)) for th in thetas}
    return res, steady_rps(run_policy(sim_cfg, EB(theta=extra), seed))


@experiment
def run(exp: Experiment) -> dict:
    p, seed, base = exp.p, exp.seed, exp.sim
    trace = base.workload.trace
    probe = Simulator(case_config(base, 64, 64, None), None, seed)
    prompts, outputs = workload_lengths(base, seed)
    mu_l, mu_o_trace = float(prompts.mean()), float(outputs.mean())
    coef = linear_coefficients(probe.colocated[0].cost, mu_l, mu_l + 64)
    thetas = [float(t) for t in p.thetas]
    mus = [mu_o_trace] if trace else [float(m) for m in p.mu_o]
    cases, curves = [], {}
    jobs = [(mu, n) for mu in mus for n in p.batch]
    for mu, n in tqdm(jobs, desc="theta plateau (mu_O, N)"):
        n = int(n)
        out_len = None if trace else LengthConfig(dist="geometric", mean=mu, max=int(20 * mu))
        c = case_config(base, n, max(int(p.requests_per_slot) * n, int(p.min_requests)), out_len)
        th0 = T.theta0(coef["a_p"], coef["a_d"], mu)
        res, tp0 = sweep(c, thetas, th0, seed)
        best = max(thetas, key=lambda t: res[t])
        cases.append({"mu_o": mu, "batch": n, "theta0": th0, "best_fixed_theta": best,
                      "frac_of_best": tp0 / res[best], "rps_theta0": tp0, "rps_best": res[best],
                      "rps_fluid_theta0": T.eb_throughput(th0, n, coef, mu_l, mu)})
        curves[(mu, n)] = (res, th0, tp0)
    table = pd.DataFrame(cases)
    sweep_rows = [{"mu_o": mu, "batch": n, "theta": th, "rps": r} for (mu, n), (res, _, _) in curves.items()
                  for th, r in res.items()]
    exp.csv(pd.DataFrame(sweep_rows), "sweep.csv")
    for mu in mus:
        series = {f"N={n}": [curves[(mu, n)][0][t] / max(curves[(mu, n)][0].values()) for t in thetas]
                  for (m, n) in curves if m == mu}
        th0 = T.theta0(coef["a_p"], coef["a_d"], mu)
        plots.lines(thetas, series, "theta (fixed)", "throughput / best fixed", exp.figure(f"theta_mu{int(mu)}.png"),
                    marks={f"theta0={th0:.3f}": th0})

    extra = {}
    if not trace:
        extra["input_sensitivity"] = input_sensitivity(base, coef, p, thetas, seed)
        extra["ifr"] = ifr_case(base, coef, p, thetas, seed)
    md = [table.to_markdown(index=False)]
    for k, v in extra.items():
        md.append(f"\n### {k}\n\n" + pd.DataFrame(v).to_markdown(index=False))
    exp.table(table, "\n".join(md))
    return {"cases": cases, "min_frac_of_best": float(table.frac_of_best.min()), "coef": coef,
            "mean_prompt": mu_l, **extra}


def input_sensitivity(base, coef, p, thetas, seed) -> list[dict]:
    """Best fixed theta against the mean prompt length, at one (mu_O, N): theta0 has no mu_L in it."""
    rows = []
    n, mu = int(p.sensitivity_batch), float(p.sensitivity_mu_o)
    th0 = T.theta0(coef["a_p"], coef["a_d"], mu)
    for ml in tqdm(p.sensitivity_prompt, desc="theta vs mean prompt"):
        c = case_config(base, n, max(int(p.requests_per_slot) * n, int(p.min_requests)),
                        LengthConfig(dist="geometric", mean=mu, max=int(20 * mu)),
                        LengthConfig(dist="gamma", mean=float(ml), cv=0.5, max=int(8 * ml)))
        res, tp0 = sweep(c, thetas, th0, seed)
        best = max(thetas, key=lambda t: res[t])
        rows.append({"mean_prompt": float(ml), "theta0": th0, "best_fixed_theta": best,
                     "frac_of_best": tp0 / res[best]})
    return rows


def ifr_case(base, coef, p, thetas, seed) -> list[dict]:
    """Geometric vs gamma outputs (same mean, shape > 1 = increasing hazard): best fixed theta, theta0,
    and EB*'s learned theta with its throughput relative to the best fixed theta."""
    rows = []
    n, mu = int(p.sensitivity_batch), float(p.ifr_mu_o)
    for label, length in (("geometric", LengthConfig(dist="geometric", mean=mu, max=int(20 * mu))),
                          *((f"gamma_k{k}", LengthConfig(dist="gamma", mean=mu, cv=float(k) ** -0.5,
                                                         max=int(20 * mu))) for k in p.ifr_shapes)):
        c = case_config(base, n, max(int(p.requests_per_slot) * n, int(p.min_requests)), length)
        th0 = T.theta0(coef["a_p"], coef["a_d"], mu)
        res, tp0 = sweep(c, thetas, th0, seed)
        best = max(thetas, key=lambda t: res[t])
        star = EBStar(coef=coef)
        tp_star = steady_rps(run_policy(c, star, seed))
        rows.append({"outputs": label, "theta0": th0, "best_fixed_theta": best, "eb_star_theta": star.theta,
                     "eb_star_eta": star.stats.eta, "frac_theta0": tp0 / res[best],
                     "frac_eb_star": tp_star / res[best]})
    return rows
