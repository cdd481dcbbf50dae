"""Tuning the overload admission rules on training seeds (issue 42 item 2; ALGORITHMS.md section 10): each rule
gets the same budget of trials a learned agent would get, on the board's own traffic at its declared load, and
only the training split's runs; the board (conf/leaderboard.yaml) then scores the winners on its test seeds.

For every board of `repro.boards` (a leaderboard scenario key: its scenario, overrides, load, regime policy and
fixed policies are read from conf/leaderboard.yaml) the capacity is measured as the board measures it, but on the
training split's traffic (run 0; `repro.overrides` are added to the board's, e.g. a smaller run for CI), and the
rate set to the board's `load` x that capacity. Every rule of
`repro.rules` (conductor, conductor_predictive, value_density: their parameters and the queue order SBS or the
colocated queue serves in) is searched with `repro.budget` trials of Optuna's TPE sampler (seeded: the same
trials on every run), each trial the mean weighted SLO attainment over `repro.seeds` (run indices of the
`repro.split` split, never the test split). Results: trials.csv (every trial), results.csv / .md (each rule's
best parameters and training attainment), summary `best` (board -> rule -> parameters) to copy into the board.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from pdgym.envs.sim.config import ConfigError

from .harness import Experiment, experiment

SPACES = {  # rule -> parameter -> (kind, choices or [lo, hi])
    "conductor": {"slack": ("float", [0.3, 1.5])},
    "conductor_predictive": {"slack": ("float", [0.3, 1.5]), "tpot_slack": ("float", [0.5, 2.0]),
                             "drop_late": ("bool", [False, True])},
    "value_density": {"slack": ("float", [0.3, 1.5]), "backlog_s": ("float", [0.0, 1.0]),
                      "quantile": ("float", [0.0, 0.9]), "beta": ("float", [0.0, 4.0]),
                      "drop_late": ("bool", [False, True])},
}
ORDERS = ("edf", "priority", "vllm_priority", "priority_sjf")


def check_block(p) -> None:
    if not (isinstance(p.budget, int) and not isinstance(p.budget, bool) and p.budget > 0):
        raise ConfigError(f"repro.budget: got {p.budget!r}; must be an integer > 0 (trials per rule and board)")
    for r in p.rules:
        if r not in SPACES:
            raise ConfigError(f"repro.rules: got {r!r}; allowed: {', '.join(SPACES)}")
    if p.split not in ("train", "val"):
        raise ConfigError(f"repro.split: got {p.split!r}; allowed: train, val (the boards' test seeds are never tuned on)")


def conf_yaml(path: str) -> dict:
    """A shipped config file (conf/PATH) as plain data."""
    import importlib.resources

    return OmegaConf.to_container(OmegaConf.create(importlib.resources.files("pdgym.conf").joinpath(path).read_text()))


def board_of(key: str):
    """The leaderboard's scenario `key` (conf/leaderboard.yaml), checked as the board checks it."""
    from pdgym.agents.evaluation.leaderboard_run import board_scenarios

    spec = conf_yaml("leaderboard.yaml")["scenarios"]
    if key not in spec:
        raise ConfigError(f"repro.boards: got {key!r}; allowed: the scenario keys of conf/leaderboard.yaml")
    return board_scenarios({key: spec[key]})[0], spec


def suggest(trial, rule: str, base) -> dict:
    params = {"name": rule, "base": base}
    for name, (kind, dom) in SPACES[rule].items():
        if kind == "float":
            params[name] = trial.suggest_float(name, *dom)
        else:
            params[name] = trial.suggest_categorical(name, dom)
    params["overrides"] = [f"queue.order={trial.suggest_categorical('order', ORDERS)}"]
    return params


def score(sc, spec: dict, split: dict, seeds: list[int], rate: float) -> float:
    """Mean weighted SLO attainment of the rule `spec` over the runs `seeds` of `split`, as the board runs a row."""
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.evaluation.runner import run_one

    spec = dict(spec)
    raw = sc.raw(rate, tuple(spec.pop("overrides", ())))
    cand = candidates.resolve(spec, sc.point, label=spec["name"])
    return float(np.mean([run_one(raw, raw["policy"], cand, split, i).metrics["slo_attainment"] for i in seeds]))


@experiment(check=check_block, may_be_empty=("overrides",))
def run(exp: Experiment) -> dict:
    import optuna
    from pdgym.agents.evaluation.leaderboard_run import measure_capacity

    p = exp.p
    split_name = str(p.split)
    split = conf_yaml("splits/default.yaml")[split_name]
    seeds = [int(s) for s in p.seeds]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials, best_rows, best = [], [], {}
    for key in p.boards:
        sc, _ = board_of(str(key))
        sc.overrides = [*sc.overrides, *[str(o) for o in p.overrides]]
        cap = measure_capacity(sc, split, 5000)
        rate = float(sc.load) * cap
        exp.regime(key, "load (train traffic)", rate / cap, *(sc.regime.get("load") or (None, None)))
        base = sc.raw()["policy"]["prefill"]["name"]
        best[key] = {"capacity_rps": cap, "rate": rate}
        for rule in p.rules:
            study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=int(p.sampler_seed)))

            def objective(trial, rule=rule, sc=sc, base=base, rate=rate):
                return score(sc, suggest(trial, rule, base), split, seeds, rate)

            study.optimize(objective, n_trials=int(p.budget))
            for t in study.trials:
                trials.append({"board": key, "rule": rule, "trial": t.number, "attainment": t.value, **t.params})
            bp = dict(study.best_params)
            best[key][rule] = {**{k: (round(v, 3) if isinstance(v, float) else v) for k, v in bp.items()},
                               "train_attainment": round(float(study.best_value), 4)}
            best_rows.append({"board": key, "rule": rule, "train_attainment": study.best_value,
                              "params": ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in bp.items())})
    exp.csv(pd.DataFrame(trials), "trials.csv")
    exp.table(pd.DataFrame(best_rows))
    return {"split": split_name, "seeds": seeds, "budget": int(p.budget),
            "best": {k: {r: v for r, v in b.items()} for k, b in best.items()},
            "finite": all(math.isfinite(r["train_attainment"]) for r in best_rows)}
