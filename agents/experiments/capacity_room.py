"""The room on a capacity board (issue 43): every capacity rule tuned on training days, then the best tuned rule,
the DP hindsight row and MPC with the true future, paired on held-out days (docs/results.md, "Elastic P/D capacity").

Tuning: each rule of baselines/capacity_rules.py tries every point of its GRID on `repro.tune_seeds` (days 0-4 of
the training days 0-9; the budget is the grid, the same for every rule) and keeps the one with the highest mean
reward there. Evaluation: the tuned rules, `dp_hindsight` and `mpc_true` play `repro.seeds` (the held-out days
10-14, never used to tune); differences of reward against the best tuned rule are paired by day (same arrivals)
with 95% bootstrap intervals.

    pdgym-repro capacity_room repro.board=mix_shift
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from pdgym.agents.evaluation.stats import interval, paired_ratio
from pdgym.baselines.capacity_hindsight import HINDSIGHT_ROWS
from pdgym.baselines.capacity_rules import CAPACITY_RULES
from pdgym.envs.capacity_control import capacity_model
from pdgym.envs.sim.capacity import CapacityRun

from .harness import Experiment, experiment

KEYS = ("reward", "good_requests", "gpu_seconds", "goodput_per_gpu", "slo_attainment", "slo_attainment_conv",
        "slo_attainment_code")


def play(model, policy, seed: int) -> dict:
    """One day under one policy: its summary (CapacityRun.summary)."""
    run = CapacityRun(model, seed)
    policy.reset(run)
    while not run.done:
        run.apply(policy.act(run))
        run.advance()
    return run.summary()


def tune(model, cls, seeds: list[int]) -> tuple[dict, float]:
    """The GRID point with the best mean reward over `seeds` (ties: the first), and that reward."""
    best, best_r = {}, -np.inf
    names = list(cls.GRID)
    for values in itertools.product(*(cls.GRID[k] for k in names)):
        params = dict(zip(names, values))
        r = float(np.mean([play(model, cls(**params), s)["reward"] for s in seeds]))
        if r > best_r:
            best, best_r = params, r
    return best, best_r


@experiment
def run(exp: Experiment) -> dict:
    p = exp.p
    model = capacity_model(str(p.board), tuple(str(o) for o in p.overrides))
    tune_seeds = [int(s) for s in p.tune_seeds]
    seeds = [int(s) for s in p.seeds]
    assert not set(tune_seeds) & set(seeds), "tuning days and held-out days overlap"
    tuned = {}
    for name in p.rules:
        params, r = tune(model, CAPACITY_RULES[str(name)], tune_seeds)
        tuned[str(name)] = {"params": params, "train_reward": r}
        print(f"capacity_room: {name} tuned {params} (train reward {r:.0f})", flush=True)
    best = max(tuned, key=lambda k: tuned[k]["train_reward"])
    rows = {k: [play(model, CAPACITY_RULES[k](**v["params"]), s) for s in seeds] for k, v in tuned.items()}
    rows["dp_hindsight"] = [play(model, HINDSIGHT_ROWS["dp_hindsight"](), s) for s in seeds]
    rows["mpc_true"] = [play(model, HINDSIGHT_ROWS["mpc_true"](horizon=int(p.mpc_horizon)), s) for s in seeds]
    ref = np.array([m["reward"] for m in rows[best]])
    out = []
    for k in ["dp_hindsight", "mpc_true", *tuned]:
        v = np.array([m["reward"] for m in rows[k]])
        pr = paired_ratio(v, ref)
        d = interval(v - ref)
        row = {"row": k, "params": str(tuned.get(k, {}).get("params", "true future")),
               **{m: float(np.mean([x[m] for x in rows[k]])) for m in KEYS},
               "vs_best_rule": pr["rel"], "rel_lo": pr["ci_low"], "rel_hi": pr["ci_high"],
               "diff_lo": d["ci_low"], "diff_hi": d["ci_high"]}
        out.append(row)
    df = pd.DataFrame(out)
    exp.table(df)
    exp.csv(pd.DataFrame({k: [m["reward"] for m in ms] for k, ms in rows.items()} | {"seed": seeds}),
            "per_seed.csv")
    cfg = model.cfg
    peak = cfg.traffic.base_rps * (1 + cfg.traffic.diurnal_amp)
    exp.regime("board", "peak offered rps / 16-GPU capacity (conv, 8P8D)", peak / (8 * 35.0), hi=1.0,
               note="the budget can serve the peak: the room is in timing, not in capacity")
    dp = df.set_index("row").loc["dp_hindsight"]
    return {"board": str(p.board), "seeds": seeds, "tune_seeds": tune_seeds, "best_rule": best,
            "best_params": tuned[best]["params"],
            "room": [float(dp["vs_best_rule"]), float(dp["rel_lo"]), float(dp["rel_hi"])],
            "rows": {r["row"]: r["reward"] for r in out}}
