"""Running a leaderboard: its scenarios (declared in conf/leaderboard.yaml, checked key by key), the
candidates ranked on each, every (scenario, candidate, seed) run in worker processes, and the burst run that
measures a scenario's capacity (the `load` a scenario declares is relative to it)."""

from __future__ import annotations

import collections
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pdgym.agents.common import check_label
from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.metric_keys import CLASS_METRIC_FORM, METRIC_KEYS, POINTS, is_metric
from pdgym.agents.evaluation.runner import run_one
from pdgym.envs.sim.config import ConfigError


@dataclass
class BoardScenario:
    """One leaderboard scenario: a named scenario + overrides, the decision point under test, its ranking,
    its declared regime and headroom rows."""

    key: str
    scenario: str
    point: str
    primary: str
    overrides: list[str] = field(default_factory=list)
    policies: dict = field(default_factory=dict)  # fixed baselines at the other decision points
    baselines: list | None = None  # None: every registered baseline of `point`
    exclude: list[str] = field(default_factory=list)  # registered baselines left out (e.g. oracle-only)
    headroom: list = field(default_factory=list)  # oracle / hindsight rows: [{label, name, params...}]
    headroom_note: str = ""  # what the headroom rows are, or why there is none
    load: float | None = None  # arrival rate = load x capacity measured by a burst of the regime policy
    regime_policy: str | None = None  # the baseline whose runs measure the regime (default: the scenario's own policy); always run
    regime: dict = field(default_factory=dict)  # declared bounds: load, pool_mean_min, pool_empty_max, why
    effect: float = 0.05  # smallest relative difference on `primary` the board exists to show
    note: str = ""

    def raw(self, rate: float | None = None, extra: tuple[str, ...] = ()) -> dict:
        """The composed scenario (`extra`: a headroom row's own overrides, e.g. a hindsight eviction rule)."""
        from pdgym.envs.scenario import load_scenario

        raw = load_scenario(self.scenario, [*self.overrides, *extra]).raw
        pol = dict(raw.get("policy") or {})
        pol.update(self.policies)
        raw = dict(raw, policy=pol)
        if rate is not None:
            raw = dict(raw, workload=dict(raw["workload"], rate=float(rate)))
        return raw


REGIME_KEYS = ("load", "pool_mean_min", "pool_empty_max", "why")


def board_scenarios(spec: dict) -> list[BoardScenario]:
    out = []
    allowed = [f for f in BoardScenario.__dataclass_fields__ if f != "key"]
    if not isinstance(spec, dict):
        raise ConfigError(f"scenarios: got {spec!r}; must be a mapping KEY -> {{{', '.join(allowed)}}}")
    for key, s in spec.items():
        if s is None:  # a preset removes a scenario by setting it to null
            continue
        check_label(key, f"scenarios.{key}")
        if not isinstance(s, dict):
            raise ConfigError(f"scenarios.{key}: got {s!r}; must be a mapping with keys {', '.join(allowed)} "
                              "(scenario, point, primary required), or null to drop it")
        s = dict(s)
        for k in s:
            if k not in allowed:
                raise ConfigError(f"scenarios.{key}.{k}: unknown key; allowed: {', '.join(allowed)}")
        for k in ("scenario", "point", "primary"):
            if k not in s:
                raise ConfigError(f"scenarios.{key}.{k}: missing")
        if s["point"] not in POINTS:
            raise ConfigError(f"scenarios.{key}.point: got {s['point']!r}; allowed: {', '.join(POINTS)}")
        if not is_metric(s["primary"]):
            raise ConfigError(f"scenarios.{key}.primary: got {s['primary']!r}; allowed: {', '.join(METRIC_KEYS)}, "
                              f"or per SLO class {CLASS_METRIC_FORM}")
        for k in s.get("regime") or {}:
            if k not in REGIME_KEYS:
                raise ConfigError(f"scenarios.{key}.regime.{k}: unknown key; allowed: {', '.join(REGIME_KEYS)}")
        ld = s.get("load")
        if ld is not None and not (isinstance(ld, (int, float)) and not isinstance(ld, bool) and math.isfinite(ld)
                                   and ld > 0):
            raise ConfigError(f"scenarios.{key}.load: got {ld!r}; must be a finite positive number (the offered load "
                              "over the measured capacity; above 1: overload) or null")
        for h in s.get("headroom") or []:
            if not isinstance(h, dict) or "label" not in h or "name" not in h:
                raise ConfigError(f"scenarios.{key}.headroom: entry {h!r} needs label and name")
            check_label(h["label"], f"scenarios.{key}.headroom.label")
            ov = h.get("overrides", [])
            if not (isinstance(ov, (list, tuple)) and all(isinstance(o, str) and "=" in o for o in ov)):
                raise ConfigError(f"scenarios.{key}.headroom.overrides: got {ov!r}; must be a list of key=value "
                                  "scenario overrides (e.g. cluster.prefill.cache_eviction=belady)")
        s["regime"] = dict(s.get("regime") or {})
        s["headroom"] = list(s.get("headroom") or [])
        board = BoardScenario(key=key, **s)
        for h in board.headroom:
            if h["name"] == BOUND_ROW:
                check_bound_row(key, board, h)
        out.append(board)
    return out


# --------------------------------------------------------------------------- running
def board_candidates(sc: BoardScenario, agents: list[dict]) -> list[tuple[str, str, Any]]:
    """(label, kind, spec) of everything ranked on a scenario; kind: baseline | headroom | agent;
    spec: baseline spec or model path."""
    from pdgym.baselines import registered

    names = sc.baselines if sc.baselines is not None else registered(sc.point)
    out = []
    for kind, entries in (("baseline", names), ("headroom", sc.headroom)):
        for b in entries:
            spec = {"name": b} if isinstance(b, str) else dict(b)
            if spec["name"] in sc.exclude and kind == "baseline":
                continue
            label = spec.pop("label", None) or spec["name"]
            out.append((label, kind, spec))
    pol = regime_policy(sc)
    if (sc.regime or sc.load) and pol and pol not in {label for label, _, _ in out}:
        out.append((pol, "baseline", {"name": pol}))  # the regime (and `load`'s capacity) is measured on its runs
    for a in agents:
        wanted = a.get("scenarios")
        if (wanted is None and agent_point(a["path"]) == sc.point) or (wanted is not None and sc.key in wanted):
            out.append((a["label"], "agent", str(a["path"])))
    return out


def agent_point(path: str) -> str:
    """Decision point of a trained agent, from its agent.json or zoo entry (no model loading)."""
    from pdgym.agents.learned import zoo_store

    if zoo_store.is_zoo(path):
        return zoo_store.entry(path.removeprefix(zoo_store.PREFIX), key="agents")["agent"]["point"]
    p = candidates.model_file(Path(path))
    for d in (p.parent, p.parent.parent):
        if os.path.lexists(d / candidates.AGENT_META):
            return candidates.read_agent_meta(d, "agents")["point"]
    raise ConfigError(f"agents: {path} has no {candidates.AGENT_META} (not a pdgym-train run?)")


def _task(sc: BoardScenario, label: str, kind: str, spec: Any, split: dict | None, index: int,
          rate: float | None, budget_s: float | None) -> dict:
    """One (scenario, policy, seed) run, in a worker process; failures come back as a message."""
    try:
        if kind == "headroom" and isinstance(spec, dict) and spec.get("name") == BOUND_ROW:
            return {"ok": True, "metrics": bound_metrics(sc.raw(rate), split, index, spec.get("bound", "windows")),
                    "stopped": ""}
        extra: tuple[str, ...] = ()
        if isinstance(spec, dict) and "overrides" in spec:  # a headroom row that changes the cluster (hindsight eviction)
            spec = dict(spec)
            extra = tuple(spec.pop("overrides"))
        cand = resolve_cached(label, kind, spec, sc.point)
        raw = sc.raw(rate, extra)
        out = run_one(raw, raw["policy"], cand, split, index, budget_s, oracle=kind == "headroom")
        return {"ok": True, "metrics": out.metrics, "stopped": out.stopped}
    except (ConfigError, ValueError, RuntimeError, FileNotFoundError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


BOUND_ROW = "slo_bound"  # a headroom row that is no run: the upper bound on weighted attainment (envs/sim/slo_bound.py)


def bound_metrics(raw: dict, split: dict | None, index: int, kind: str) -> dict:
    """The upper-bound row of one seed: the bound `kind` over that seed's requests (the arrivals and prompts
    every row of the seed sees; the engine's default policies only bring them in), as its `slo_attainment`."""
    from pdgym.agents.common import sim_config_from
    from pdgym.envs.sim import Simulator
    from pdgym.envs.sim.slo_bound import attainment_bound
    from pdgym.envs.splits import apply_split

    raw, seed = apply_split(raw, split, index)
    sim = Simulator(sim_config_from(raw), {}, seed=seed)
    sim.run()
    return {"slo_attainment": attainment_bound(sim, kind)}


def check_bound_row(key: str, sc: BoardScenario, row: dict) -> None:
    """An upper-bound row needs SLO classes on its board and a known bound: one ConfigError line otherwise."""
    from pdgym.envs.sim.slo_bound import BOUNDS

    kind = row.get("bound", "windows")
    if kind not in BOUNDS:
        raise ConfigError(f"scenarios.{key}.headroom.bound: got {kind!r}; allowed: {', '.join(BOUNDS)}")
    if sc.point != "prefill" or not sc.raw()["workload"].get("classes"):
        raise ConfigError(f"scenarios.{key}.headroom: the {BOUND_ROW} row bounds weighted SLO attainment and this "
                          "board has no SLO classes; allowed: a prefill board whose scenario sets workload.classes")


_CACHE: dict = {}


def resolve_cached(label: str, kind: str, spec, point: str) -> candidates.Candidate:
    key = (label, kind, spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True), point)  # lists too
    if key not in _CACHE:
        _CACHE[key] = candidates.resolve(spec if isinstance(spec, str) else dict(spec), point, label=label)
    return _CACHE[key]


def regime_policy(sc: BoardScenario) -> str:
    """The baseline whose runs measure the regime (and the capacity): the declared one, else the
    scenario's configured policy at its decision point."""
    if sc.regime_policy:
        return sc.regime_policy
    pol = sc.raw()["policy"].get(sc.point)
    return pol if isinstance(pol, str) else (pol or {}).get("name", "")


def measure_capacity(sc: BoardScenario, split: dict | None, max_requests: int | None = None) -> float:
    """Requests per second the regime policy sustains on this scenario's traffic (split run 0): every
    request arrives at once, completions per second between the 20% and 80% completion quantiles (of the
    first tokens for a prefill scenario: the stage under test; of the finishes otherwise).
    NaN for a closed loop (its load is concurrency over the running batch; see measure_regime).
    `max_requests` caps the burst (the tier is full well before; a 20K-request pool only slows the run)."""
    raw = sc.raw()
    wl = raw["workload"]
    if wl.get("arrival") == "closed":
        return math.nan
    n = min(int(wl["num_requests"]), int(max_requests)) if max_requests else int(wl["num_requests"])
    burst_wl = dict(wl, arrival="poisson", rate=1e6, time_scale=None, num_requests=n)
    if wl.get("phases"):  # a phase's own rate would override the burst's: every phase arrives at once too
        burst_wl["phases"] = [dict(ph, rate=None) for ph in wl["phases"]]
    burst = dict(raw, workload=burst_wl)
    cand = candidates.resolve(regime_policy(sc), sc.point)
    out = run_one(burst, raw["policy"], cand, split, 0)
    fin = out.result.requests.query("status == 'finished'")
    f = np.sort((fin.first_token if sc.point == "prefill" else fin.finish).to_numpy())
    if len(f) < 10:
        return math.nan
    lo, hi = f[int(0.2 * len(f))], f[int(0.8 * len(f)) - 1]
    return float((int(0.8 * len(f)) - int(0.2 * len(f))) / max(hi - lo, 1e-12))


def workers(n_jobs: int | None) -> int:
    """Worker processes of a board: `n_jobs`, or one per core this process may use (None or -1, the default)."""
    if n_jobs is not None and n_jobs != -1:
        return int(n_jobs)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_board(scenarios: list[BoardScenario], agents: list[dict], seeds: list[int], split: dict | None,
              n_jobs: int = 1, progress: bool = True, budget_s: float | None = None,
              rates: dict | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """Every (scenario, candidate, seed): returns the per-seed table and the failures."""
    from joblib import Parallel, delayed
    from tqdm import tqdm

    rates = rates or {}
    jobs = [(sc, label, kind, spec, i) for sc in scenarios for label, kind, spec in board_candidates(sc, agents)
            for i in seeds]
    par = Parallel(n_jobs=n_jobs, return_as="generator", batch_size=1)
    results = par(delayed(_task)(sc, label, kind, spec, split, i, rates.get(sc.key), budget_s)
                  for sc, label, kind, spec, i in jobs)
    rows, failures = [], []
    # off a terminal the bar is off (no carriage returns in logs): a line per finished scenario instead
    lines = progress and not sys.stderr.isatty()
    left = collections.Counter(sc.key for sc, *_ in jobs)
    t0 = time.perf_counter()
    bar = tqdm(zip(jobs, results), total=len(jobs), desc="leaderboard runs", disable=not progress or None)
    for done, ((sc, label, kind, _, i), r) in enumerate(bar, 1):  # disable=None: no bar when not a terminal
        left[sc.key] -= 1
        if lines and not left[sc.key]:
            print(f"leaderboard: {sc.key} done ({done}/{len(jobs)} runs, {time.perf_counter() - t0:.0f} s)", flush=True)
        if r["ok"]:
            rows.append({"scenario": sc.key, "policy": label, "kind": kind, "seed": i, **r["metrics"],
                         "stopped": r["stopped"]})
        else:
            failures.append({"scenario": sc.key, "policy": label, "seed": i, "error": r["error"]})
    return pd.DataFrame(rows), failures
