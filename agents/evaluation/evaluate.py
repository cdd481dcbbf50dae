"""`pdgym-eval`: run one policy (a baseline by name or a trained agent by path) on a scenario over seeds.

    pdgym-eval policy=NAME_OR_MODEL_PATH scenario=NAME seeds=[0,1,2] hydra.run.dir=DIR

writes DIR/metrics.json (per metric: mean, std, 95% Student-t interval, per-seed values) and
DIR/requests.csv (the per-request tables of every seed, with a `seed` column; `tables=parquet`: .parquet).

Baselines and agents go through the one code path of DESIGN section 4: `simulate(config, policies,
seed)`; an agent enters as the `AgentPolicy` adapter of its env module, which shares the env's
observation / action code and calls the trained network. The decision points that are not under
test run the configured `policy/*` baselines, so every candidate sees the same traffic.

Held-out splits (conf/splits): seed i of a split runs simulator seed `seed_base + i`; on a trace
workload it also replays its own segment of the trace rows reserved for that split, so agents are
trained, validated and tested on disjoint traffic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pdgym.agents.evaluation.candidates import Candidate, resolve
from pdgym.envs.sim import Simulator
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.config import ConfigError, check
from pdgym.envs.sim.events import PassKind
from pdgym.envs.sim.metrics import SUMMARY_KEYS, SimResult, check_table_format, write_json, write_table
from pdgym.envs.sim.observers import Observer
from pdgym.envs.sim.points import POINTS as DECISION_POINTS
from pdgym.envs.sim.validation import check_bool, check_seed_list

POINTS = tuple(DECISION_POINTS)  # prefill, decode, batching (envs/sim/points.py)
EXTRA_KEYS = ("tpot_p50", "tpot_p99", "slo_attainment", "batch_mean", "pool_mean", "pool_empty_frac")
LOADED_FROM = 0.5  # regime window: from the arrival of this quantile request to the last arrival
METRIC_KEYS = tuple(k for k in SUMMARY_KEYS if k != "wall_time_s") + EXTRA_KEYS + ("wall_time_s",)
# Direction of every metric: +1 higher is better, -1 lower is better (ranking and "best" checkpoints).
HIGHER_BETTER = {"throughput_tok_s", "total_tok_s", "rps", "goodput_rps", "chunk_util_mean", "finished",
                 "slo_attainment", "prefix_hit_ratio"}
# A learned scheduler may hold requests forever (a prefill agent that never releases, a router that never
# admits): its runs stop at HORIZON_FACTOR x the open-loop arrival span (at least 60 s; closed loop: 3600 s)
# of simulated time, and what is left counts as rejected("horizon").
HORIZON_FACTOR, CLOSED_HORIZON_S = 10.0, 3600.0


def agent_horizon(workload: dict) -> float:
    rate = workload.get("rate")
    if workload.get("arrival") == "closed" or not rate:
        return CLOSED_HORIZON_S
    return max(60.0, HORIZON_FACTOR * float(workload["num_requests"]) / float(rate))


def direction(metric: str) -> int:
    return 1 if metric in HIGHER_BETTER else -1


# --------------------------------------------------------------------------- metrics and statistics
def run_metrics(res: SimResult, pool: np.ndarray | None = None) -> dict:
    """summary() plus TPOT p50 / p99, SLO attainment (finished within both SLOs over all requests), the
    mean number of requests per decode (colocated: per) pass, and the decode pool over the loaded window
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
    good = (fin.ttft <= res.slo.ttft_s) & (fin.tpot.isna() | (fin.tpot <= res.slo.tpot_s))
    m["slo_attainment"] = float(good.sum()) / max(len(r), 1)
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


BOOT_REPS = 4000


def interval(values, reps: int = BOOT_REPS) -> dict:
    """Mean, sample std and a 95% percentile-bootstrap interval of the mean over the finite values (NaN
    ones skipped). A bootstrap mean lies between the smallest and the largest value, so the interval of a
    non-negative metric never goes below zero (a Student-t interval over 2-3 seeds did). With fewer than
    about 5 values it is too narrow (any interval is): boards publish >= 5 seeds. Fixed resampling seed."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": 0}
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    if n == 1 or std == 0.0:
        return {"mean": mean, "std": std, "ci_low": mean, "ci_high": mean, "n": n}
    boot = x[np.random.default_rng(0).integers(0, n, size=(reps, n))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"mean": mean, "std": std, "ci_low": float(lo), "ci_high": float(hi), "n": n}


def paired_ratio(x, y, reps: int = BOOT_REPS) -> dict:
    """Paired comparison of a policy (`x`) with a reference (`y`), values aligned by seed (same traffic):
    the ratio of means minus one, mean(x) / mean(y) - 1, with a 95% paired bootstrap interval (the same
    resampled seeds for both). Seeds where either is NaN are dropped. Keys: rel, ci_low, ci_high, n."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    if n == 0 or y.mean() == 0:
        return {"rel": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": n}
    rel = float(x.mean() / y.mean() - 1.0)
    if n == 1:
        return {"rel": rel, "ci_low": math.nan, "ci_high": math.nan, "n": 1}
    idx = np.random.default_rng(0).integers(0, n, size=(reps, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = x[idx].mean(axis=1) / y[idx].mean(axis=1) - 1.0
    lo, hi = np.nanpercentile(boot, [2.5, 97.5])
    return {"rel": rel, "ci_low": float(lo), "ci_high": float(hi), "n": n}


def verdict(metric: str, rel: float, lo: float = math.nan, hi: float = math.nan) -> str:
    """Words for a relative difference on `metric`: 'better' / 'worse' by its direction, and 'no clear
    difference' when the interval [lo, hi] (if given) contains zero."""
    if not math.isfinite(rel):
        return "not comparable"
    if math.isfinite(lo) and math.isfinite(hi) and lo <= 0.0 <= hi:
        return "no clear difference"
    if rel == 0.0:
        return "equal"
    return "better" if direction(metric) * rel > 0 else "worse"


def describe(metric: str, label: str, ref: str, p: dict) -> str:
    """One sentence: 'X is 12.3% worse than Y on m (lower is better; paired 95% CI [+8.0%, +16.1%], 5 seeds)'."""
    arrow = "higher is better" if direction(metric) > 0 else "lower is better"
    v = verdict(metric, p["rel"], p.get("ci_low", math.nan), p.get("ci_high", math.nan))
    if not math.isfinite(p["rel"]):
        return f"{label} vs {ref} on {metric}: not comparable"
    ci = (f"; paired 95% CI [{p['ci_low']:+.1%}, {p['ci_high']:+.1%}]"
          if math.isfinite(p.get("ci_low", math.nan)) else "")
    size = f"{abs(p['rel']):.1%} " if v in ("better", "worse") else ""
    head = f"{label} is {size}{v} than {ref}" if v in ("better", "worse") else f"{label} vs {ref}: {v}"
    return f"{head} on {metric} ({metric} {p['rel']:+.1%}, {arrow}{ci}, {p['n']} seeds)"


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
                sim._finish_run(reason="stalled")
                return (f"stalled: {decisions.why()}; stopped at simulated t = {sim.now:.1f} s, {n_left} of "
                        f"{sim.req.n} requests unresolved, counted rejected(stalled)")
            if on_progress is not None:
                on_progress(sim.n_resolved, sim.req.n)
            if wall_s is not None and time.perf_counter() - t0 >= wall_s:
                n_left = sim.req.n - sim.n_resolved
                sim._finish_run(reason="horizon")  # the engine's own end-of-run path (rejects what is left)
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


# --------------------------------------------------------------------------- held-out splits
@functools.lru_cache(maxsize=8)
def _trace_rows(trace: str) -> int:
    from pdgym.envs.sim.traces import load_trace

    return len(load_trace(trace))


def segment(workload: dict, split: dict | None, index: int) -> dict:
    """Workload keys that put run `index` of a split on its own rows of the trace (empty if no trace).

    The split owns rows [lo, hi) = [frac_lo, frac_hi) of the trace; run i replays `num_requests` rows
    starting at lo + (i * num_requests) mod (hi - lo - num_requests + 1).
    """
    if not split or not workload.get("trace"):
        return {}
    n_all = _trace_rows(str(workload["trace"]))
    lo, hi = int(split["trace_from"] * n_all), int(split["trace_to"] * n_all)
    if hi - lo < 1:
        raise ConfigError(f"splits: trace_from/trace_to leave no rows of {workload['trace']!r} ({n_all} rows)")
    n = min(int(workload["num_requests"]), hi - lo)
    return {"trace_offset": lo + (index * n) % (hi - lo - n + 1), "num_requests": n}


def default_splits() -> dict:
    """conf/splits/default.yaml (train / val / test), for code outside the Hydra apps."""
    import importlib.resources

    from omegaconf import OmegaConf

    text = (importlib.resources.files("pdgym.conf") / "splits" / "default.yaml").read_text()
    return OmegaConf.to_container(OmegaConf.create(text))


def split_seed(split: dict | None, index: int) -> int:
    return int(split["seed_base"]) + int(index) if split else int(index)


def apply_split(raw: dict, split: dict | None, index: int) -> tuple[dict, int]:
    """(composed config with the split's trace segment for run `index`, simulator seed)."""
    seg = segment(raw["workload"], split, index)
    if seg:
        raw = dict(raw, workload=dict(raw["workload"], **seg))
    return raw, split_seed(split, index)


def segment_overrides(raw: dict, split: dict | None, index: int) -> list[str]:
    """The same segment as Hydra override strings (what the Gymnasium envs take)."""
    return [f"workload.{k}={v}" for k, v in segment(raw["workload"], split, index).items()]


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
        return {k: dict(stalls.honest(k, interval([m[k] for m in self.per_seed]), n_stop),
                        per_seed=[m[k] for m in self.per_seed]) for k in METRIC_KEYS}


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


def check_metric_names(key: str, names) -> list[str]:
    """A list of metric names, each one of METRIC_KEYS (one-line error naming `key` otherwise)."""
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{key}: got {names!r}; must be a non-empty list of metric names")
    for m in names:
        if m not in METRIC_KEYS:
            raise ConfigError(f"{key}: unknown metric {m!r}; allowed: {', '.join(METRIC_KEYS)}")
    return list(names)


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


# --------------------------------------------------------------------------- the app
def _app(cfg) -> dict:
    from pdgym.agents.common import run_dir, to_container
    from pdgym.agents.evaluation import stalls
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    data = to_container(cfg)  # unknown keys already failed in Hydra (struct mode)
    cand, seeds, split_name, show, budget, others = checked(data)
    split = data["splits"][split_name] if split_name else None
    scenario = data.get("scenario_name", "scenario")
    data = agent_traffic(data, cand, scenario)
    ev = evaluate(data, cand, seeds, split, others, progress=bool(data["progress"]),
                  desc=f"{cand.label} on {scenario}", budget_s=budget)
    out = run_dir()
    path = write_evaluation(ev, out, scenario, {"split": split_name, "budget_s": budget}, data.get("tables", "csv"))
    stats = ev.stats()
    ci = escape("[min, max]") if len(seeds) <= 2 else "95% CI"  # a bootstrap over 2 seeds is their range
    t = Table(title=f"{cand.label} ({cand.kind}, {cand.point}) on {scenario}, seeds {seeds}",
              caption=("one seed: no interval" if len(seeds) == 1 else escape("[min, max] of the 2 seeds (a 95% "
                       "interval needs more seeds)") if len(seeds) == 2 else "95% CI: percentile bootstrap of the mean "
                       "over seeds"))
    for col in ("metric", "direction", "mean", ci, "std"):
        t.add_column(col, justify="left" if col in ("metric", "direction") else "right")
    for k in show:
        st = stats[k]
        if st["stalled"] and k not in stalls.KEPT:
            cells = (stalls.cell(st["stalled"], len(seeds)), "-", "-")
        else:
            cells = (f"{st['mean']:.4g}", escape(f"[{st['ci_low']:.4g}, {st['ci_high']:.4g}]"), f"{st['std']:.3g}")
        t.add_row(k, "higher is better" if direction(k) > 0 else "lower is better", *cells)
    Console(width=max(Console().width, 110)).print(t)
    for s, m in zip(ev.seeds, ev.per_seed):
        if m["stopped"]:
            print(f"seed {s} stopped early ({m['rejected']:.0f} requests rejected): {m['stopped']}")
    print(f"metrics in {path}")
    stalls.refuse("pdgym-eval", [f"{cand.label} seed {s}" for s, m in zip(ev.seeds, ev.per_seed) if m["stopped"]],
                  bool(data.get("allow_stalled")))
    return stats


def agent_traffic(data: dict, cand: Candidate, scenario: str) -> dict:
    """An agent on another scenario than its training one: one warning line; a zoo agent on its own: its training
    overrides where the command line left the scenario's values (agents/evaluation/transfer.py)."""
    from pdgym.agents.evaluation import transfer
    from pdgym.envs.scenario import load_scenario

    if cand.kind != "agent":
        return data
    transfer.warn_transfer("pdgym-eval", cand.label, cand, scenario)
    data, applied = transfer.with_training_traffic(data, cand, load_scenario(scenario).raw)
    if applied:
        print(f"{cand.label}: its training traffic applied: {' '.join(applied)} (give a key on the command line to "
              "change it)", flush=True)
    return data


def alias_policy_argv(argv: list[str]) -> list[str]:
    """`policy=X` names the policy under test; `policy` is also a config group (policy/prefill, ...), so
    Hydra would read it as a group choice: the command line is rewritten to the `eval_policy` key."""
    return [("eval_policy=" + a.split("=", 1)[1]) if a.split("=", 1)[0] in ("policy", "+policy") else a
            for a in argv]


def check_policy_given(value) -> None:
    """`policy=` names the policy under test (pdgym-eval, pdgym-enjoy): it must be given."""
    if value in (None, "???", ""):
        raise ConfigError("policy: missing; give policy=BASELINE_NAME, policy=PATH/TO/RUN_OR_MODEL.zip or "
                          "policy=zoo:NAME (a shipped agent)")
    if not (isinstance(value, str) or (isinstance(value, dict) and isinstance(value.get("name"), str))):
        raise ConfigError(f"policy: got {value!r}; give a baseline name, {{name: NAME, KEY: VALUE}} or a run folder "
                          "/ model zip")


def check_no_seed(data: dict, instead: str) -> None:
    """The root config's single `seed` means nothing to an app that takes run indices (eval.yaml and
    enjoy.yaml null it): a given one would be ignored without a word, so it is refused with `instead`."""
    if data.get("seed") is not None:
        raise ConfigError(f"seed: got {data['seed']!r}; {instead}, not seed=")


def check_split(data: dict) -> str | None:
    """The `split` key: a name of `splits` (conf/splits) or null."""
    split_name, splits = data.get("split"), data.get("splits") or {}
    if split_name is not None and split_name not in splits:
        raise ConfigError(f"split: got {split_name!r}; allowed: {', '.join(splits)}, null")
    return split_name


def checked(data: dict) -> tuple:
    """The config's checks that need no run, one place for `validate` (before Hydra creates the run folder,
    agents/front_door.hydra_cli) and `_app`: (policy under test, seeds, split name, metrics to show, budget,
    the policies at the other points)."""
    check_policy_given(data.get("eval_policy"))
    check_no_seed(data, "pdgym-eval runs every run index of seeds=[...] (e.g. seeds=[5])")
    check_bool(data.get("progress"), "progress")
    check_bool(data.get("allow_stalled", False), "allow_stalled")
    seeds = check_seed_list(data.get("seeds"), "seeds")
    split_name = check_split(data)
    show = check_metric_names("show", data.get("show"))
    budget = check_budget("budget_s", data.get("budget_s"))
    check_table_format(data.get("tables", "csv"))
    cand = resolve(data["eval_policy"], data.get("point"))
    others = dict(data.get("policy") or {})
    check_policies({k: v for k, v in others.items() if k != cand.point})
    check_not_shadowed(data, cand)
    return cand, seeds, split_name, show, budget, others


def check_not_shadowed(data: dict, cand: Candidate) -> None:
    """The policy under test replaces `policy.<its point>`: a change made there (`policy/prefill=...`,
    `policy.prefill.KEY=...`) would be dropped without a word, so it is refused with the way to say it."""
    from pdgym.envs.scenario import load_scenario

    name = data.get("scenario_name")
    given = (data.get("policy") or {}).get(cand.point)
    if not name or given is None:
        return
    if given != load_scenario(str(name)).policy.get(cand.point):
        how = (f"policy={{name: {cand.spec['name']}, KEY: VALUE}}" if cand.kind == "baseline"
               else "the agent's own configuration")
        raise ConfigError(f"policy.{cand.point}: changed to {given!r}, but the policy under test ({cand.label}) "
                          f"takes the {cand.point} decision point and replaces it; give its parameters as {how}")


def validate(cfg) -> None:
    """pdgym-eval's validate hook: `checked`, then the first run's simulator is built (its config, trace
    segment and capacity checks), a baseline under test in its place (its parameters, and whether the cluster
    can run it: SBS on a colocated cluster), so a bad value fails before Hydra creates the run folder."""
    from pdgym.agents.common import sim_config_from, to_container
    from pdgym.baselines import make_policies

    data = to_container(cfg)
    cand, seeds, split_name, _, _, others = checked(data)
    raw, seed = apply_split(data, data["splits"][split_name] if split_name else None, seeds[0])
    pols = dict(make_policies(others), **{cand.point: cand.build()})  # an agent too: can it run on this cluster?
    Simulator(sim_config_from(raw), pols, seed=seed).run(until=0.0)  # policies bound to the cluster


# Root-config keys pdgym-eval composes but never reads: refused, not dropped (agents/front_door.refuse_unused).
UNUSED = {"compare": "pdgym-eval runs one policy: compare several with pdgym-leaderboard (or pdgym-sim compare=)",
          "trace": "pdgym-eval writes no trace: pdgym-sim trace=true does", "plots": "pdgym-eval draws no plots"}


def main(argv: list[str] | None = None) -> None:
    """pdgym-eval: one-line errors, no run folder before the config is checked (agents/front_door.hydra_cli)."""
    from pdgym.agents.front_door import hydra_cli

    hydra_cli("pdgym-eval", "eval", validate=validate, rewrite_argv=alias_policy_argv, unused=UNUSED)(_app)(argv)


if __name__ == "__main__":
    main()
