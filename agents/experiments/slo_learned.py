"""A learned SLO scheduler against the board's best heuristic and its hindsight row, paired on held-out seeds (issue
33 item 8; docs/agents.md, "SLO tiers").

On one board scenario (`repro.scenario` with `repro.overrides`, e.g. the queue in EDF order) every seed of
`repro.seeds` (the test split's: seed = index; a trained agent saw the train split's seeds, 1000 + i, and chose
its checkpoint on the validation split's, 500 + i) runs three rows on the same traffic: the trained agent
(`repro.agent`: a pdgym-train run folder, a model zip or zoo:NAME, through its env's AgentPolicy), the reference
heuristic (`repro.reference`, a prefill policy spec) and the hindsight row (`repro.hindsight`, run with oracle:
true). The other points run the scenario's policies. Differences of weighted SLO attainment are paired by seed
with 95% bootstrap intervals (agents/evaluation/stats.interval), absolute and relative to the reference.

    pdgym-repro slo_learned repro.agent=runs/train/<date>/slo_admit_s0
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pdgym.agents.evaluation.candidates import load_agent
from pdgym.agents.evaluation.stats import interval
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim import simulate

from .harness import Experiment, experiment

METRIC = "slo_attainment"


@experiment
def run(exp: Experiment) -> dict:
    p = exp.p
    sc = load_scenario(str(p.scenario), [str(o) for o in p.overrides])
    others = {k: v for k, v in sc.policy.items() if k != "prefill" and v is not None}
    agent = load_agent(str(p.agent))

    def one(prefill, seed: int, oracle: bool = False) -> dict:
        pol = {k: make_policy(k, v) for k, v in others.items()}
        pol["prefill"] = prefill
        return simulate(merge_sim_config(sc.sim, {"oracle": oracle}), pol, seed=seed).metrics()

    rows = {"agent": [], "reference": [], "hindsight": []}
    for s in exp.seeds:
        rows["agent"].append(one(agent.policy(), s))
        rows["reference"].append(one(make_policy("prefill", exp.spec(p.reference)), s))
        rows["hindsight"].append(one(make_policy("prefill", exp.spec(p.hindsight)), s, oracle=True))
    v = {k: np.array([m[METRIC] for m in ms]) for k, ms in rows.items()}
    ref = float(v["reference"].mean())
    out, summary = [], {"scenario": str(p.scenario), "seeds": list(exp.seeds), "reference": ref}
    for k, ms in rows.items():
        d = interval(v[k] - v["reference"])
        out.append({"row": k, METRIC: float(v[k].mean()), "vs_reference": d["mean"], "lo": d["ci_low"],
                    "hi": d["ci_high"], "relative": d["mean"] / ref, "rel_lo": d["ci_low"] / ref,
                    "rel_hi": d["ci_high"] / ref,
                    "early_rejections": float(np.mean([m["early_rejections"] for m in ms])),
                    "ttft_mean": float(np.mean([m["ttft_mean"] for m in ms]))})
        summary[k] = [float(v[k].mean()), d["mean"], d["ci_low"], d["ci_high"]]
    exp.table(pd.DataFrame(out))
    exp.csv(pd.DataFrame({k: x for k, x in v.items()} | {"seed": list(exp.seeds)}), "per_seed.csv")
    return summary
