"""EB+ against the better of EB* and MB (ALGORITHMS.md s5): closed-loop concurrency levels, a
length-distribution shift and a concurrency shift; EB+ should stay within about 1% of the better
and pick MB at low load.

Each entry of repro.scenarios names a scenario plus overrides. With workload.trace=PATH every
scenario takes its lengths from the trace (phase scenarios: each phase's empirical source).
Colocated EB+ against disaggregated P:D ratios is its own reproduction (pd_ratio).
"""

from __future__ import annotations

import pandas as pd
from pdgym.agents import plots
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import SimResult, Simulator
from tqdm import tqdm

from .harness import Experiment, experiment

POLICIES = ("mb", "eb_star", "eb_plus")


def with_trace(scn, trace: str | None) -> list[str]:
    """Overrides that make scenario `scn` replay the lengths of `trace`."""
    if not trace:
        return []
    phases = load_scenario(scn).sim.workload.phases
    if not phases:
        return [f"workload.trace={trace}"]
    return [f"workload.phases.{i}.{part}.source={trace}" for i, ph in enumerate(phases)
            for part in ("prompt", "output") if getattr(ph, part).dist == "empirical"]


@experiment
def run(exp: Experiment) -> dict:
    p = exp.p
    seed = exp.seed
    trace = exp.trace
    rows = []
    for sc in tqdm(list(p.scenarios), desc="EB+ scenarios"):
        ov = list(sc.get("overrides") or []) + with_trace(sc.scenario, trace)
        sim_cfg = load_scenario(sc.scenario, ov).sim
        row = {"scenario": sc.label}
        for pol in POLICIES:
            policy = make_policy("batching", pol)
            sim = Simulator(sim_cfg, {"batching": policy}, seed)
            sim.run()
            s = SimResult(sim).summary()
            row[f"rps_{pol}"] = s["rps"]
            row[f"ttft_{pol}"] = s["ttft_mean"]
            row[f"tpot_{pol}"] = s["tpot_mean"]
            if pol == "eb_plus":
                row["eb_plus_switches"] = len(policy.switches)
                row["eb_plus_final_mode"] = policy.mode
                row["eb_plus_modes"] = "->".join(["mb"] + [m for _, m in policy.switches])
        row["frac_of_better"] = row["rps_eb_plus"] / max(row["rps_mb"], row["rps_eb_star"])
        rows.append(row)
    table = pd.DataFrame(rows)
    md = [table.to_markdown(index=False)]
    plots.bars(dict(zip(table.scenario, table.frac_of_better)), "EB+ / max(EB*, MB)", exp.figure("frac_of_better.png"))
    summary = {"scenarios": table.scenario.tolist(), "frac_of_better": table.frac_of_better.tolist(),
               "min_frac_of_better": float(table.frac_of_better.min()), "rows": rows}
    exp.table(table, "\n".join(md))
    return summary

