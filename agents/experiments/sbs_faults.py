"""SBS under faults (ALGORITHMS.md s1, the watchdog path): lost EndForward signals and a dead instance.

Cases on the SBS scenario at its configured rate: no fault; a fraction `drop` of EndForward
signals never reaches the scheduler; one prefill instance killed at `kill_at` of the run
(never back; health checks notice after faults.detect_s). SBS must keep serving: every
request finished or rejected with a reason, no deadlock (a run that stalls rejects what is
left as "stalled" and is counted as lost here). The same cases under immediate dispatch
give the context for the TTFT cost.

Summary: lost, deadlock, ttft_ratio_vs_nofault ({drop: ..., kill: ...}) (+ per-case details:
TTFT mean / p99, rejections by reason, watchdog resets, dropped signals; immediate's ratios).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from pdgym.agents import plots
from pdgym.baselines import make_policy
from pdgym.envs.sim import SimResult, Simulator
from pdgym.envs.sim import requests as R
from tqdm import tqdm

from .harness import Experiment, experiment


def run_case(sim_cfg, spec, faults: dict, seed: int) -> dict:
    cfg = dataclasses.replace(sim_cfg, faults=dataclasses.replace(sim_cfg.faults, **faults))
    pol = make_policy("prefill", spec)
    sim = Simulator(cfg, {"prefill": pol}, seed)
    sim.run()
    res = SimResult(sim)
    m = res.summary()
    req = res.requests
    unresolved = int(((sim.req.state != R.FINISHED) & (sim.req.state != R.REJECTED)).sum())
    stalled = int((req.reason == "stalled").sum())
    reasons = req.loc[req.status == "rejected", "reason"].value_counts().to_dict()
    stats = getattr(pol, "stats", {})
    return {"ttft_mean": m["ttft_mean"], "ttft_p99": m["ttft_p99"], "finished": m["finished"],
            "rejected": m["rejected"], "lost": unresolved + stalled, "deadlock": bool(sim.stalled),
            "dropped_signals": sim.dropped_signals, "watchdog_resets": int(stats.get("watchdog_resets", 0)),
            "reasons": reasons}


@experiment(within={"drop": "[0, 1)", "kill_at": "[0, 1]"})
def run(exp: Experiment) -> dict:
    p = exp.p
    sim_cfg = exp.sim
    wl = sim_cfg.workload
    horizon = wl.num_requests / wl.rate
    cases = {"nofault": {},
             "drop": {"drop_end_forward": float(p.drop)},
             "kill": {"down": [{"instance": int(p.kill_instance), "at": float(p.kill_at) * horizon}]}}
    policies = {"sbs": exp.spec(p.sbs), "immediate": exp.spec(p.immediate)}
    rows = []
    jobs = [(pol, case, seed) for pol in policies for case in cases for seed in exp.seeds]
    for pol, case, seed in tqdm(jobs, desc="sbs_faults"):
        r = run_case(sim_cfg, policies[pol], cases[case], int(seed))
        rows.append({"policy": pol, "case": case, "seed": int(seed), **r})
    table = pd.DataFrame(rows)
    agg = table.groupby(["policy", "case"], sort=False).agg(
        ttft_mean=("ttft_mean", "mean"), ttft_p99=("ttft_p99", "mean"), finished=("finished", "sum"),
        rejected=("rejected", "sum"), lost=("lost", "sum"), deadlock=("deadlock", "any"),
        dropped_signals=("dropped_signals", "sum"), watchdog_resets=("watchdog_resets", "sum")).reset_index()
    exp.table(table.assign(reasons=table.reasons.astype(str)),
        f"{len(p.seeds)} seeds x {wl.num_requests} requests at {wl.rate} req/s; drop = {p.drop} of EndForward "
        f"signals; kill = instance {p.kill_instance} down at {p.kill_at:.0%} of the arrivals (never back, "
        f"detected after {sim_cfg.faults.detect_s} s).\n\n" + agg.round(4).to_markdown(index=False))

    def ttft(pol, case, key="ttft_mean"):
        return float(agg[(agg.policy == pol) & (agg.case == case)][key].iloc[0])

    plots.bars({f"{pol} {case}": ttft(pol, case) for pol in policies for case in cases}, "mean TTFT (s)",
               exp.figure("ttft_faults.png"))
    sbs = table[table.policy == "sbs"]
    reasons: dict[str, int] = {}
    for d in sbs.reasons:
        for k, v in d.items():
            reasons[k] = reasons.get(k, 0) + int(v)
    return {
        "lost": int(sbs.lost.sum()),
        "deadlock": bool(sbs.deadlock.any()),
        "ttft_ratio_vs_nofault": {c: ttft("sbs", c) / ttft("sbs", "nofault") for c in ("drop", "kill")},
        "drop": float(p.drop),
        "ttft_mean": {c: ttft("sbs", c) for c in cases},
        "ttft_p99": {c: ttft("sbs", c, "ttft_p99") for c in cases},
        "rejected_by_reason": reasons,
        "watchdog_resets": {c: int(sbs[sbs.case == c].watchdog_resets.sum()) for c in cases},
        "immediate_ttft_ratio_vs_nofault": {c: ttft("immediate", c) / ttft("immediate", "nofault")
                                            for c in ("drop", "kill")},
        "immediate_lost": int(table[table.policy == "immediate"].lost.sum()),
        "seeds": len(p.seeds),
        "mean_requests_finished": float(np.mean(sbs.finished)),
    }
