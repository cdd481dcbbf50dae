"""SLO-tier boards (issue 33; ALGORITHMS.md section 9): the queue disciplines, Conductor's early rejection and the
hindsight rows on scenarios where an interactive and a batch tier conflict, ranked by weighted SLO attainment.

For each board scenario (`repro.boards`): its regime first (load = the scenario's offered rate over the requests per
second the cluster serves a burst of `capacity_requests` under FCFS; declared bounds `load`), then every row on the
same seeded traffic (`repro.seeds`): fcfs, priority, edf, least_slack, sjf, ltr, vllm_priority (queue.order), and
conductor (early rejection in front of the scenario's dispatcher, queue in EDF order). The hindsight rows: the best
prediction-reading rule (sjf, ltr, priority_sjf) with an oracle predictor (`<rule>_oracle_pred`: the same rule
reading the true output lengths), `sjf_oracle`, a clairvoyant order by the true output length
(`oracle: true`), and `slo_hindsight`: the best heuristic behind hindsight admission (baselines/slo_hindsight.py:
a reject set found by replaying the seeded run, clairvoyant). Differences are paired by seed (same traffic) with 95%
bootstrap intervals: each row against fcfs, and the room = the best hindsight row minus the best non-clairvoyant heuristic."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pdgym.agents.evaluation.stats import interval
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim import simulate
from tqdm import tqdm

from .harness import Experiment, experiment

ORDERS = ("fcfs", "priority", "edf", "least_slack", "sjf", "ltr", "priority_sjf", "vllm_priority")
PREDICTED = ("sjf", "ltr", "priority_sjf")  # the rows that read the length prediction
METRIC = "slo_attainment"


def _policies(sc, prefill=None) -> dict:
    spec = dict(sc.policy)
    if prefill is not None:
        spec["prefill"] = prefill
    return {k: make_policy(k, v) for k, v in spec.items() if v is not None}


def _run(sc, over: dict, seed: int, prefill=None) -> dict:
    return simulate(merge_sim_config(sc.sim, over), _policies(sc, prefill), seed=seed).metrics()


def capacity(sc, n: int) -> float:
    """Requests per second the cluster completes while a burst of `n` arrivals keeps it saturated, FCFS with
    immediate dispatch (the regime's denominator): completions between the 10% and 90% finish quantiles over
    that time (the fill and the drain left out)."""
    cfg = merge_sim_config(sc.sim, {"workload": {"num_requests": n, "arrival": "poisson", "rate": 1e5}})
    pre = "least_tokens" if sc.sim.cluster.topology == "disaggregated" else None
    f = np.sort(simulate(cfg, _policies(sc, pre), seed=0).requests.finish.to_numpy())
    lo, hi = f[int(0.1 * (n - 1))], f[int(0.9 * (n - 1))]
    return 0.8 * n / (hi - lo)


def hindsight_base(best: str, base_prefill) -> tuple[dict, object]:
    """(simulator overrides, prefill spec) of the row `best` (a queue order, or conductor_edf)."""
    if best == "conductor_edf":
        return {"queue": {"order": "edf"}}, {"name": "conductor", "base": base_prefill}
    return {"queue": {"order": best}}, base_prefill


def board(exp: Experiment, name: str, spec) -> pd.DataFrame:
    sc = load_scenario(spec.scenario, list(spec.get("overrides", [])))
    cap = capacity(sc, int(exp.p.capacity_requests))
    load = float(sc.sim.workload.rate) / cap
    exp.regime(name, "load (offered rate / burst capacity)", load, *[float(x) for x in spec.load])
    rows = {o: {"queue": {"order": o}} for o in ORDERS}
    seeds = exp.seeds
    runs: dict[str, list[float]] = {}
    extra: dict[str, list[dict]] = {}
    for label, over in tqdm(list(rows.items()), desc=name):
        ms = [_run(sc, over, s) for s in seeds]
        runs[label] = [m[METRIC] for m in ms]
        extra[label] = ms
    base_prefill = sc.policy["prefill"]
    ms = [_run(sc, {"queue": {"order": "edf"}}, s, prefill={"name": "conductor", "base": base_prefill}) for s in seeds]
    runs["conductor_edf"], extra["conductor_edf"] = [m[METRIC] for m in ms], ms
    best = max(runs, key=lambda k: np.mean(runs[k]))
    reader = max(PREDICTED, key=lambda k: np.mean(runs[k]))  # the best rule that reads a prediction
    oracle_pred = {"queue": {"order": reader}, "workload": {"predictor": {"kind": "oracle"}}}
    ms = [_run(sc, oracle_pred, s) for s in seeds]
    runs[f"{reader}_oracle_pred"], extra[f"{reader}_oracle_pred"] = [m[METRIC] for m in ms], ms
    ms = [_run(sc, {"queue": {"order": "sjf_oracle"}, "oracle": True}, s) for s in seeds]
    runs["sjf_oracle"], extra["sjf_oracle"] = [m[METRIC] for m in ms], ms
    over, pre = hindsight_base(best, base_prefill)
    others = {k: v for k, v in sc.policy.items() if k != "prefill" and v is not None}
    row = {"name": "slo_hindsight", "base": pre, "others": others}
    ms = [_run(sc, {**over, "oracle": True}, s, prefill=row) for s in seeds]
    runs["slo_hindsight"], extra["slo_hindsight"] = [m[METRIC] for m in ms], ms
    hind = {f"{reader}_oracle_pred", "sjf_oracle", "slo_hindsight"}
    top_hind = max(hind, key=lambda k: np.mean(runs[k]))
    out = []
    for label, v in runs.items():
        d_fcfs = interval(np.subtract(v, runs["fcfs"]))
        room = interval(np.subtract(v, runs[best])) if label in hind else None
        ms = extra[label]
        out.append({"board": name, "row": label, "hindsight": label in hind, METRIC: float(np.mean(v)),
                    "chat_or_first": float(np.mean([m.get(f"slo_attainment_{sc.sim.workload.classes[0].name}")
                                                    for m in ms])),
                    "early_rejections": float(np.mean([m["early_rejections"] for m in ms])),
                    "preemptions": float(np.mean([m["preemptions"] for m in ms])),
                    "ttft_mean": float(np.mean([m["ttft_mean"] for m in ms])),
                    "vs_fcfs": d_fcfs["mean"], "vs_fcfs_lo": d_fcfs["ci_low"], "vs_fcfs_hi": d_fcfs["ci_high"],
                    "room_vs_best": None if room is None else room["mean"],
                    "room_lo": None if room is None else room["ci_low"],
                    "room_hi": None if room is None else room["ci_high"],
                    "best_heuristic": best, "best_hindsight": top_hind, "load": load})
    return pd.DataFrame(out)


@experiment
def run(exp: Experiment) -> dict:
    tables = [board(exp, name, spec) for name, spec in exp.p.boards.items() if spec is not None]  # null: left out
    table = pd.concat(tables, ignore_index=True)
    exp.table(table)
    summary = {}
    for name, t in table.groupby("board"):
        best = t.best_heuristic.iloc[0]
        hind = t[t.hindsight].sort_values(METRIC).iloc[-1]
        summary[name] = {"load": float(t.load.iloc[0]), "fcfs": float(t[t.row == "fcfs"][METRIC].iloc[0]),
                         "best_heuristic": best, "best": float(t[t.row == best][METRIC].iloc[0]),
                         "hindsight": hind.row, "hindsight_value": float(hind[METRIC]),
                         "room": [float(hind.room_vs_best), float(hind.room_lo), float(hind.room_hi)]}
    return summary
