"""Headroom of a time-varying batching mix: the best fixed choice per phase, chosen with hindsight.

On a workload of phases (coloc_rtx_pro_6000_qwen3_8b_shift_mix: conversation and code alternate), EB runs
one threshold throughout, EB* re-estimates it from completions, EB+ also picks MB. For every arm of the
grid (EB at each fixed theta, and MB) and every seed, the run's SLO attainment (finished within both SLOs /
all, the leaderboard's `slo_attainment`) is split by the phase that generated each request. The hindsight
choice of a phase is the arm with the best mean attainment over the seeds on that phase's requests;
`PhaseHindsight` (baselines/phase_hindsight.py) then runs those choices, switching at each phase's first
arrival, on the same seeds, and is compared paired with EB, EB*, EB+ and MB. The summary also gives the
best EB threshold of each phase (MB left out): the mechanism says it is lower where outputs are long.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from pdgym.baselines import make_policy
from pdgym.baselines.phase_hindsight import PhaseHindsight
from pdgym.envs.sim import SimResult, Simulator
from pdgym.envs.sim.config import ConfigError
from tqdm import tqdm

from .harness import Experiment, experiment

COMPARED = ("eb", "eb_star", "eb_plus", "mb")


def attainment(sim: Simulator, bounds: np.ndarray) -> tuple[float, list[float]]:
    """SLO attainment of the run and of each phase's requests (request ids bounds[i]..bounds[i+1]-1)."""
    r = SimResult(sim).requests  # one row per request id, in id order
    slo = sim.cfg.slo
    good = ((r.status == "finished") & (r.ttft <= slo.ttft_s) & (r.tpot.isna() | (r.tpot <= slo.tpot_s))).to_numpy()
    return float(good.mean()), [float(good[a:b].mean()) for a, b in zip(bounds[:-1], bounds[1:])]


def run_arm(cfg, policy, seed: int, bounds) -> tuple[float, list[float]]:
    sim = Simulator(cfg, {"batching": policy}, seed)
    sim.run()
    return attainment(sim, bounds)


def arm_policy(arm):
    return make_policy("batching", "mb") if arm == "mb" else make_policy("batching", {"name": "eb", "theta": arm})


def paired_interval(diff: np.ndarray, reps: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean of paired differences."""
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (reps, len(diff)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


@experiment
def run(exp: Experiment) -> dict:
    p, seeds = exp.p, exp.seeds
    cfg = exp.sim
    phases = cfg.workload.phases or []
    if len(phases) < 2:
        raise ConfigError("scenario: eb_phase_headroom needs a workload of phases (workload.phases)")
    bounds = np.cumsum([0] + [int(ph.num_requests) for ph in phases])
    labels = [f"{i}:{ph.output.source or ph.output.dist}" for i, ph in enumerate(phases)]
    arms = [float(t) for t in p.thetas] + ["mb"]
    rows = []
    for seed in tqdm(seeds, desc="per-phase sweep (seeds)"):
        for arm in arms:
            tot, per = run_arm(cfg, arm_policy(arm), seed, bounds)
            rows.append({"seed": seed, "arm": str(arm), "total": tot, **dict(zip(labels, per))})
    sweep = pd.DataFrame(rows)
    exp.csv(sweep, "sweep.csv")
    mean = sweep.groupby("arm")[labels + ["total"]].mean()
    choices = [mean[lab].idxmax() for lab in labels]
    eb_only = mean.drop(index="mb")
    best_theta = {lab: float(eb_only[lab].idxmax()) for lab in labels}
    hind = [c if c == "mb" else float(c) for c in choices]

    oracle_cfg = dataclasses.replace(cfg, oracle=True)
    runs = {"hindsight": [], **{name: [] for name in COMPARED}}
    per_phase = {"hindsight": [], **{name: [] for name in COMPARED}}
    for seed in tqdm(seeds, desc="hindsight vs EB family"):
        tot, per = run_arm(oracle_cfg, PhaseHindsight(hind), seed, bounds)
        runs["hindsight"].append(tot)
        per_phase["hindsight"].append(per)
        for name in COMPARED:
            tot, per = run_arm(cfg, make_policy("batching", name), seed, bounds)
            runs[name].append(tot)
            per_phase[name].append(per)
    h = np.asarray(runs["hindsight"])
    table = []
    for name in ("hindsight", *COMPARED):
        v = np.asarray(runs[name])
        row = {"policy": name, "slo_attainment": float(v.mean()),
               **{lab: float(np.mean([x[i] for x in per_phase[name]])) for i, lab in enumerate(labels)}}
        if name != "hindsight":
            lo, hi = paired_interval(h - v)
            row.update({"hindsight_minus": float((h - v).mean()), "ci_low": lo, "ci_high": hi})
        table.append(row)
    table = pd.DataFrame(table)
    md = [f"Hindsight choices per phase: {dict(zip(labels, choices))}; best EB theta per phase: {best_theta}",
          "", table.to_markdown(index=False), "", "### Per-phase sweep (mean over seeds)", "",
          mean.to_markdown()]
    exp.table(table, "\n".join(md))
    gap = table.set_index("policy")
    return {"seeds": list(seeds), "phases": labels, "choices": [str(c) for c in choices],
            "best_eb_theta": best_theta, "slo_attainment": {k: float(np.mean(v)) for k, v in runs.items()},
            "headroom_vs": {n: {"diff": float(gap.loc[n, "hindsight_minus"]), "ci": [float(gap.loc[n, "ci_low"]),
                                                                                   float(gap.loc[n, "ci_high"])]}
                            for n in COMPARED}}
