"""Bounded evaluation runs: one policy at its decision point, the configured baselines at the others, over the
seeds of a held-out split (envs/splits.py), each run stopped after a wall-time budget or a spent decision
budget; the per-seed metrics (run_metrics) and the files pdgym-eval writes.

Baselines and agents go through the one code path of DESIGN section 4: `simulate(config, policies, seed)`; an
agent enters as the `AgentPolicy` adapter of its env module, which shares the env's observation / action code and
calls the trained network. The decision points that are not under test run the configured `policy/*` baselines,
so every candidate sees the same traffic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pdgym.agents.evaluation.candidates import Candidate
from pdgym.agents.evaluation.metric_keys import METRIC_KEYS, metric_columns
from pdgym.agents.evaluation.stats import interval
from pdgym.envs.sim import Simulator
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.config import ConfigError, check
from pdgym.envs.sim.events import PassKind
from pdgym.envs.sim.metrics import SimResult, write_json, write_table
from pdgym.envs.sim.observers import Observer
from pdgym.envs.splits import apply_split

LOADED_FROM = 0.5  # regime window: from the arrival of this quantile request to the last arrival
# A learned scheduler may hold requests forever (a prefill agent that never releases, a router that never
# admits): its runs stop at HORIZON_FACTOR x the open-loop arrival span (at least 60 s; closed loop: 3600 s)
# of simulated time, and what is left counts as rejected("horizon").
HORIZON_FACTOR, CLOSED_HORIZON_S = 10.0, 3600.0


def agent_horizon(workload: dict) -> float:
    rate = workload.get("rate")
    if workload.get("arrival") == "closed" or not rate:
        return CLOSED_HORIZON_S
    return max(60.0, HORIZON_FACTOR * float(workload["num_requests"]) / float(rate))


def run_metrics(res: SimResult, pool: np.ndarray | None = None) -> dict:
    """summary() (with the SLO attainment of every class: envs/sim/slo.py) plus TPOT p50 / p99, the mean number
    of requests per decode (colocated: per) pass, and the decode pool over the loaded window
    (`pool`: rows of (time, requests waiting in the pool) at each decode step start, after the router's
    admissions): its mean size and the fraction of steps where it was empty (nothing left to choose from).
    The loaded window runs from the arrival of the LOADED_FROM-quantile request to the last arrival:
    no ramp-up, no drain, the same interval for every policy of the same traffic."""
    m = res.summary()
    r = res.requests
    fin = r[r.status == "finished"]
    tpot = fin.tpot.dropna().to_numpy()
    m["tpot_p50"] = float(np.percentile(tpot, 50)) if len(tpot) else math.nan
    m["tpot_p99"] = float(np.percentile(tpot, 99)) if len(tpot) else math.nan
    st = res.steps
    dec = st[st.kind == PassKind.DECODE] if (st.kind == PassKind.DECODE).any() else st[st.kind == PassKind.COLOCATED]
    m["batch_mean"] = float((dec.reqs * dec.dur).sum() / dec.dur.sum()) if len(dec) and dec.dur.sum() > 0 \
        else math.nan
    m["pool_mean"] = m["pool_empty_frac"] = math.nan
    arr = np.sort(r.arrival.dropna().to_numpy())
    if pool is not None and len(pool) and len(arr):
        lo, hi = arr[int(LOADED_FROM * (len(arr) - 1))], arr[-1]
        w = pool[(pool[:, 0] >= lo) & (pool[:, 0] <= hi), 1]
        if len(w):
            m["pool_mean"] = float(w.mean())
            m["pool_empty_frac"] = float(np.mean(w == 0))
    return m


# --------------------------------------------------------------------------- bounded runs
class PoolMeter(Observer):
    """Records the decode pool size at each decode step (the regime check of a decode board: pool
    occupancy, fraction of steps with an empty pool)."""

    def __init__(self, sink: list):
        self.sink = sink

    def on_pass_start(self, sim, p):
        if p.kind == PassKind.DECODE:
            self.sink.append((sim.now, len(sim.pool)))


def run_bounded(sim, wall_s: float | None, on_progress=None, heartbeat_s: float = 0.5, decisions=None) -> str:
    """Run `sim` to its end, or stop it once `wall_s` wall seconds have passed (whatever its policies do:
    an agent that skips forever included). A heartbeat thread pauses the event loop every `heartbeat_s`
    (between two events, so the history is the one an uninterrupted run makes); each pause reports the
    requests resolved so far to `on_progress(n_resolved, n_requests)` and checks the budget. On a stop, the requests
    left are rejected("horizon") as at the simulated-time horizon. `decisions`: an agent's DecisionBudget
    (envs/base.py); once spent, the run stops as stalled and what is left is rejected("stalled").
    Returns '' or why the run stopped early."""
    import threading
    import time

    t0 = time.perf_counter()
    done = threading.Event()

    def beat():
        while not done.wait(heartbeat_s):
            sim.pause()

    thread = threading.Thread(target=beat, name="pdgym-eval-heartbeat", daemon=True)
    thread.start()
    try:
        while not sim.run():
            if decisions is not None and decisions.spent:
                n_left = sim.req.n - sim.n_resolved
                sim.finish_run(reason="stalled")
                return (f"stalled: {decisions.why()}; stopped at simulated t = {sim.now:.1f} s, {n_left} of "
                        f"{sim.req.n} requests unresolved, counted rejected(stalled)")
            if on_progress is not None:
                on_progress(sim.n_resolved, sim.req.n)
            if wall_s is not None and time.perf_counter() - t0 >= wall_s:
                n_left = sim.req.n - sim.n_resolved
                sim.finish_run(reason="horizon")  # the engine's own end-of-run path (rejects what is left)
                return (f"wall budget {wall_s:g} s reached at simulated t = {sim.now:.1f} s; "
                        f"{n_left} of {sim.req.n} requests unresolved, counted rejected(horizon)")
    finally:
        done.set()
        thread.join()
    if on_progress is not None:
        on_progress(sim.n_resolved, sim.req.n)
    n_h = int((sim.req.reason == R.reason_code("horizon")).sum())
    if n_h:
        return (f"simulated-time horizon {sim.cfg.max_sim_time_s:g} s reached; {n_h} of {sim.req.n} requests "
                "unresolved, counted rejected(horizon)")
    if sim.stalled:
        return f"stalled: {int((sim.req.reason == R.reason_code('stalled')).sum())} requests never resolved"
    return ""


@dataclass
class RunOutcome:
    """One seeded run: its result, its metrics (run_metrics) and why it stopped early ('' if it did not)."""

    result: SimResult
    metrics: dict
    stopped: str


# --------------------------------------------------------------------------- evaluation
@dataclass
class Evaluation:
    """Per-seed metrics and request tables of one candidate on one scenario."""

    candidate: Candidate
    seeds: list[int]
    per_seed: list[dict]
    requests: pd.DataFrame

    def stats(self) -> dict:
        """Per metric: interval over seeds, `stalled` (seeds stopped early: then no mean, stalls.honest), per_seed."""
        from pdgym.agents.evaluation import stalls

        n_stop = stalls.n_stopped(m.get("stopped") for m in self.per_seed)
        keys = dict.fromkeys([*METRIC_KEYS, *metric_columns(self.per_seed[0] if self.per_seed else {})])
        return {k: dict(stalls.honest(k, interval([m.get(k, math.nan) for m in self.per_seed]), n_stop),
                        per_seed=[m.get(k, math.nan) for m in self.per_seed]) for k in keys}


def run_one(raw: dict, others: dict, cand: Candidate, split: dict | None, index: int,
            budget_s: float | None = None, on_progress=None, oracle: bool = False) -> RunOutcome:
    """One seeded run of `cand` at its decision point, the configured baselines at the others, stopped
    after `budget_s` wall seconds (None: no limit; see run_bounded). The workload comes from the seed
    alone, so every candidate of the same (raw, split, index) sees the same traffic. `oracle`: the run
    exposes true output lengths (headroom rows only)."""
    from pdgym.agents.common import sim_config_from
    from pdgym.baselines import make_policies

    raw, seed = apply_split(raw, split, index)
    if cand.kind == "agent" and not math.isfinite(float(raw.get("max_sim_time_s", math.inf))):
        raw = dict(raw, max_sim_time_s=agent_horizon(raw["workload"]))
    if oracle:
        raw = dict(raw, oracle=True)
    pols = make_policies({k: v for k, v in others.items() if k != cand.point})
    pols[cand.point] = cand.build()
    sim = Simulator(sim_config_from(raw), pols, seed=seed)
    pool: list[int] = []
    sim.observe(PoolMeter(pool))
    decisions = getattr(pols[cand.point], "predict", None) if cand.kind == "agent" else None
    if decisions is not None:
        decisions.start(sim)
    stopped = run_bounded(sim, budget_s, on_progress, decisions=decisions)
    res = SimResult(sim)
    return RunOutcome(res, run_metrics(res, np.asarray(pool, dtype=float).reshape(-1, 2) if sim.decode else None),
                      stopped)


def evaluate(raw: dict, cand: Candidate, seeds: list[int], split: dict | None = None,
             others: dict | None = None, progress: bool = False, desc: str = "",
             budget_s: float | None = None, on_seed: Callable[[int, int], None] | None = None) -> Evaluation:
    """Run `cand` on the composed scenario `raw` for every seed index (of `split`, if given); the progress
    bar counts requests resolved over all seeds; `budget_s` bounds each seed's wall time; `on_seed(done,
    total)` after each seed (a log line where a bar cannot be drawn, e.g. under training's own bar)."""
    from tqdm import tqdm

    if not isinstance(raw, dict) or not isinstance(raw.get("workload"), dict):
        raise ConfigError(f"raw: got {type(raw).__name__}{' without workload' if isinstance(raw, dict) else ''}; must be "
                          "a composed scenario, e.g. load_scenario('decode_tier_n16').raw (pdgym.envs.scenario)")
    ok = isinstance(seeds, (list, tuple, range)) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    check(ok and len(seeds) > 0, "seeds", f"got {seeds!r}; must be a non-empty list of run indices, e.g. [0, 1, 2]")
    others = dict(raw.get("policy") or {}) if others is None else others
    per_seed, tables = [], []
    with tqdm(total=0, desc=desc or cand.label, unit="req", disable=not progress or None, leave=False) as bar:
        for k, i in enumerate(seeds):
            bar.set_postfix_str(f"seed {k + 1}/{len(seeds)}")
            base = bar.n

            def tick(n_resolved: int, n_total: int, base: int = base) -> None:
                if bar.total < base + n_total:
                    bar.total = base + n_total
                bar.update(base + n_resolved - bar.n)

            out = run_one(raw, others, cand, split, int(i), budget_s, on_progress=tick)
            per_seed.append(dict(out.metrics, stopped=out.stopped))
            tables.append(out.result.requests.assign(seed=int(i)))
            if on_seed is not None:
                on_seed(k + 1, len(seeds))
    return Evaluation(cand, [int(s) for s in seeds], per_seed, pd.concat(tables, ignore_index=True))


def write_evaluation(ev: Evaluation, out: Path, scenario: str, extra: dict | None = None,
                     tables: str = "csv") -> Path:
    """DIR/requests.csv (or .parquet), then DIR/metrics.json (last, so a metrics.json always has its table
    beside it); each written to a temporary name and renamed."""
    out.mkdir(parents=True, exist_ok=True)
    c = ev.candidate
    write_table(ev.requests, out / "requests", tables)
    stopped = {str(s): m["stopped"] for s, m in zip(ev.seeds, ev.per_seed) if m.get("stopped")}
    doc = {"scenario": scenario, "policy": c.label, "kind": c.kind, "point": c.point,
           "source": str(c.agent.path) if c.agent else c.spec, "seeds": ev.seeds, **(extra or {}),
           "interval": "95% percentile bootstrap of the mean over seeds", "stopped_early": stopped,
           "metrics": ev.stats(), "per_seed": {str(s): m for s, m in zip(ev.seeds, ev.per_seed)}}
    write_json(out / "metrics.json", doc)
    return out / "metrics.json"


def check_budget(key: str, value) -> float | None:
    """Wall seconds per run: a positive number, or null for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ConfigError(f"{key}: got {value!r}; must be a positive number of wall seconds per run, or null")
    return float(value)


def check_policies(others: dict) -> None:
    """Build the configured baselines once so a bad parameter (policy.decode.window=0) fails up front."""
    from pdgym.baselines import make_policy

    for point, spec in others.items():
        try:
            make_policy(point, spec)
        except (ValueError, TypeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"policy.{point}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
                from None
