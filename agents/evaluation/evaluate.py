"""`pdgym-eval`: run one policy (a baseline by name or a trained agent by path) on a scenario over seeds.

    pdgym-eval policy=NAME_OR_MODEL_PATH scenario=NAME seeds=[0,1,2] hydra.run.dir=DIR

writes DIR/metrics.json (per metric: mean, std, 95% Student-t interval, per-seed values) and
DIR/requests.csv (the per-request tables of every seed, with a `seed` column).

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
import importlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pdgym.envs.sim import simulate
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import SUMMARY_KEYS, SimResult, write_json

POINTS = ("prefill", "decode", "batching")
EXTRA_KEYS = ("tpot_p50", "tpot_p99", "slo_attainment")
METRIC_KEYS = tuple(k for k in SUMMARY_KEYS if k != "wall_time_s") + EXTRA_KEYS + ("wall_time_s",)
# Direction of every metric: +1 higher is better, -1 lower is better (ranking and "best" checkpoints).
HIGHER_BETTER = {"throughput_tok_s", "total_tok_s", "rps", "goodput_rps", "chunk_util_mean", "finished",
                 "slo_attainment"}
AGENT_META = "agent.json"
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
def run_metrics(res: SimResult) -> dict:
    """summary() plus TPOT p50 / p99 and SLO attainment (finished within both SLOs over all requests)."""
    m = res.summary()
    r = res.requests
    fin = r[r.status == "finished"]
    tpot = fin.tpot.dropna().to_numpy()
    m["tpot_p50"] = float(np.percentile(tpot, 50)) if len(tpot) else math.nan
    m["tpot_p99"] = float(np.percentile(tpot, 99)) if len(tpot) else math.nan
    good = (fin.ttft <= res.slo.ttft_s) & (fin.tpot.isna() | (fin.tpot <= res.slo.tpot_s))
    m["slo_attainment"] = float(good.sum()) / max(len(r), 1)
    return m


def interval(values) -> dict:
    """Mean, sample std and the 95% Student-t interval of the finite values (NaN ones are skipped)."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": 0}
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half, "n": n}


# --------------------------------------------------------------------------- held-out splits
@functools.lru_cache(maxsize=8)
def _trace_rows(trace: str) -> int:
    from pdgym.envs.sim.workload import load_trace

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


# --------------------------------------------------------------------------- trained agents
ALGOS = {"ppo": ("stable_baselines3", "PPO"), "a2c": ("stable_baselines3", "A2C"),
         "dqn": ("stable_baselines3", "DQN"), "maskable_ppo": ("sb3_contrib", "MaskablePPO")}


def algo_class(name: str):
    if name not in ALGOS:
        raise ConfigError(f"agent.algo: unknown {name!r}; allowed: {', '.join(ALGOS)}")
    mod, cls = ALGOS[name]
    return getattr(importlib.import_module(mod), cls)


def env_module(env_id: str):
    """The module of a registered pdgym env (it holds ENV_ID, make_env and AgentPolicy)."""
    import gymnasium as gym
    import pdgym.envs  # noqa: F401  (registers the envs)

    if env_id not in gym.registry:
        raise ConfigError(f"env.id: unknown {env_id!r}; allowed: {', '.join(k for k in gym.registry if 'pdgym' in k)}")
    entry = gym.registry[env_id].entry_point
    return importlib.import_module(entry.split(":")[0] if isinstance(entry, str) else entry.__module__)


def model_file(path: Path) -> Path:
    """A model zip, or the best (else final, else last checkpoint) model of a training run directory."""
    if path.is_file():
        return path
    for name in ("best_model.zip", "final_model.zip"):
        if (path / name).is_file():
            return path / name
    ckpts = sorted((path / "checkpoints").glob("*.zip"), key=lambda p: p.stat().st_mtime)
    if ckpts:
        return ckpts[-1]
    raise FileNotFoundError(f"{path}: no best_model.zip, final_model.zip or checkpoints/*.zip")


def masked_predictor(model, obs_norm=None):
    """predict(obs, mask) -> action: the model's greedy action among the allowed ones.

    MaskablePPO masks its logits itself; for PPO / A2C the categorical logits and for DQN the Q-values
    are masked here, so an agent trained without masks never picks an infeasible action at evaluation.
    """
    import torch

    algo = type(model).__name__

    def predict(obs: np.ndarray, mask: np.ndarray) -> int:
        obs = np.asarray(obs, dtype=np.float32)
        if obs_norm is not None:
            obs = obs_norm.normalize_obs(obs).astype(np.float32)
        mask = np.asarray(mask, dtype=bool)
        if algo == "MaskablePPO":
            a, _ = model.predict(obs, action_masks=mask, deterministic=True)
            return int(a)
        with torch.no_grad():
            t, _ = model.policy.obs_to_tensor(obs)
            if algo == "DQN":
                score = model.q_net(t)[0].cpu().numpy()
            else:
                score = model.policy.get_distribution(t).distribution.logits[0].cpu().numpy()
        if not mask.any():
            return int(np.argmax(score))
        return int(np.argmax(np.where(mask, score, -np.inf)))

    return predict


@dataclass
class LoadedAgent:
    """A trained model plus what is needed to rebuild its observation: env id, env kwargs, decision point."""

    path: Path
    meta: dict
    predict: Any

    @property
    def point(self) -> str:
        return self.meta["point"]

    def policy(self):
        mod = env_module(self.meta["env_id"])
        return mod.AgentPolicy(self.predict, **self.meta["env_kwargs"])


def load_agent(path: str | Path) -> LoadedAgent:
    """Load a model written by pdgym-train (its run directory, or a .zip inside it) with its
    VecNormalize statistics (`<model>_vecnormalize.pkl`) when it was trained on normalised observations."""
    import pickle

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(str(p))
    zip_path = model_file(p)
    root = next((d for d in (zip_path.parent, zip_path.parent.parent) if (d / AGENT_META).is_file()), None)
    if root is None:
        raise ConfigError(f"policy: {p} has no {AGENT_META} beside it (not written by pdgym-train?)")
    meta = json.loads((root / AGENT_META).read_text())
    model = algo_class(meta["algo"]).load(zip_path, device="cpu")
    norm_path = zip_path.with_name(zip_path.stem + "_vecnormalize.pkl")
    obs_norm = None
    if norm_path.is_file():
        with open(norm_path, "rb") as fh:
            obs_norm = pickle.load(fh)
    return LoadedAgent(zip_path, meta, masked_predictor(model, obs_norm))


# --------------------------------------------------------------------------- candidates
@dataclass
class Candidate:
    """A policy under test: a registered baseline of one decision point, or a trained agent."""

    label: str
    kind: str  # baseline | agent
    point: str
    spec: dict = field(default_factory=dict)  # baseline: {name, params}
    agent: LoadedAgent | None = None

    def build(self):
        """A fresh policy object (policies keep per-run state)."""
        from pdgym.baselines import make_policy

        return self.agent.policy() if self.agent is not None else make_policy(self.point, self.spec)


def is_model_path(spec: str) -> bool:
    return spec.endswith(".zip") or "/" in spec or Path(spec).exists()


def resolve(spec: str | dict, point: str | None = None, label: str | None = None) -> Candidate:
    """A baseline name (or {name, params}) or a model path -> Candidate; the decision point is inferred
    from the registry (or the agent's metadata) unless given."""
    from pdgym.baselines import registered

    if point is not None and point not in POINTS:
        raise ConfigError(f"point: got {point!r}; allowed: {', '.join(POINTS)}")
    if isinstance(spec, str) and is_model_path(spec):
        agent = load_agent(spec)
        if point is not None and point != agent.point:
            raise ConfigError(f"point: {spec} is a {agent.point} agent, not {point}")
        return Candidate(label or agent.meta.get("name", Path(spec).stem), "agent", agent.point, agent=agent)
    base = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = base.get("name")
    kinds = [k for k in POINTS if name in registered(k)]
    if point is None:
        if len(kinds) != 1:
            allowed = "; ".join(f"{k}: {', '.join(registered(k))}" for k in POINTS)
            why = "is registered at several decision points, set point=" if kinds else "is neither a model path " \
                  "nor a registered baseline"
            raise ConfigError(f"policy: {name!r} {why} ({allowed})")
        point = kinds[0]
    elif point not in kinds:
        raise ConfigError(f"policy: {name!r} is not a {point} baseline; allowed: {', '.join(registered(point))}")
    return Candidate(label or name, "baseline", point, spec=base)


# --------------------------------------------------------------------------- evaluation
@dataclass
class Evaluation:
    """Per-seed metrics and request tables of one candidate on one scenario."""

    candidate: Candidate
    seeds: list[int]
    per_seed: list[dict]
    requests: pd.DataFrame

    def stats(self) -> dict:
        return {k: dict(interval([m[k] for m in self.per_seed]), per_seed=[m[k] for m in self.per_seed])
                for k in METRIC_KEYS}


def run_one(raw: dict, others: dict, cand: Candidate, split: dict | None, index: int) -> SimResult:
    """One seeded run of `cand` at its decision point, the configured baselines at the others."""
    from pdgym.agents.common import sim_config_from
    from pdgym.baselines import make_policies

    raw, seed = apply_split(raw, split, index)
    if cand.kind == "agent" and not math.isfinite(float(raw.get("max_sim_time_s", math.inf))):
        raw = dict(raw, max_sim_time_s=agent_horizon(raw["workload"]))
    pols = make_policies({k: v for k, v in others.items() if k != cand.point})
    pols[cand.point] = cand.build()
    return simulate(sim_config_from(raw), pols, seed=seed)


def evaluate(raw: dict, cand: Candidate, seeds: list[int], split: dict | None = None,
             others: dict | None = None, progress: bool = False, desc: str = "") -> Evaluation:
    """Run `cand` on the composed scenario `raw` for every seed index (of `split`, if given)."""
    from tqdm import tqdm

    others = dict(raw.get("policy") or {}) if others is None else others
    per_seed, tables = [], []
    for i in tqdm(seeds, desc=desc or cand.label, disable=not progress, leave=False):
        res = run_one(raw, others, cand, split, int(i))
        per_seed.append(run_metrics(res))
        tables.append(res.requests.assign(seed=int(i)))
    return Evaluation(cand, [int(s) for s in seeds], per_seed, pd.concat(tables, ignore_index=True))


def write_evaluation(ev: Evaluation, out: Path, scenario: str, extra: dict | None = None) -> Path:
    """DIR/metrics.json and DIR/requests.csv of one evaluation."""
    out.mkdir(parents=True, exist_ok=True)
    c = ev.candidate
    doc = {"scenario": scenario, "policy": c.label, "kind": c.kind, "point": c.point,
           "source": str(c.agent.path) if c.agent else c.spec, "seeds": ev.seeds, **(extra or {}),
           "metrics": ev.stats(), "per_seed": {str(s): m for s, m in zip(ev.seeds, ev.per_seed)}}
    write_json(out / "metrics.json", doc)
    ev.requests.to_csv(out / "requests.csv", index=False)
    return out / "metrics.json"


# --------------------------------------------------------------------------- the app
def _app(cfg) -> dict:
    from pdgym.agents.common import run_dir, to_container
    from rich.console import Console
    from rich.table import Table

    data = to_container(cfg)  # unknown keys already failed in Hydra (struct mode)
    if data.get("eval_policy") in (None, "???"):
        raise ConfigError("policy: missing; give policy=BASELINE_NAME or policy=PATH/TO/RUN_OR_MODEL.zip")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError(f"seeds: got {seeds!r}; must be a non-empty list of integers >= 0")
    split_name = data["split"]
    splits = data["splits"]
    if split_name is not None and split_name not in splits:
        raise ConfigError(f"split: got {split_name!r}; allowed: {', '.join(splits)}, null")
    split = splits[split_name] if split_name else None
    cand = resolve(data["eval_policy"], data.get("point"))
    scenario = data.get("scenario_name", "scenario")
    ev = evaluate(data, cand, seeds, split, progress=bool(data["progress"]), desc=f"{cand.label} on {scenario}")
    out = run_dir()
    path = write_evaluation(ev, out, scenario, {"split": split_name})
    stats = ev.stats()
    t = Table(title=f"{cand.label} ({cand.kind}, {cand.point}) on {scenario}, seeds {seeds}")
    for col in ("metric", "mean", "95% CI", "std"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for k in data["show"]:
        s = stats[k]
        t.add_row(k, f"{s['mean']:.4g}", f"[{s['ci_low']:.4g}, {s['ci_high']:.4g}]", f"{s['std']:.3g}")
    Console().print(t)
    print(f"metrics in {path}")
    return stats


def alias_policy_argv(argv: list[str]) -> list[str]:
    """`policy=X` names the policy under test; `policy` is also a config group (policy/prefill, ...), so
    Hydra would read it as a group choice: the command line is rewritten to the `eval_policy` key."""
    return [("eval_policy=" + a.split("=", 1)[1]) if a.split("=", 1)[0] in ("policy", "+policy") else a
            for a in argv]


def main() -> None:
    import hydra
    from pdgym.agents.common import check_group_choices, one_line_errors

    sys.argv = [sys.argv[0], *alias_policy_argv(sys.argv[1:])]
    check_group_choices(sys.argv[1:], "pdgym-eval")

    @hydra.main(version_base=None, config_path="pkg://pdgym.conf", config_name="eval")
    def _main(cfg) -> None:
        from pdgym.agents.evaluation.evaluate import _app as app  # by import: launchers may run this in another process

        one_line_errors("pdgym-eval")(app)(cfg)

    _main()


if __name__ == "__main__":
    main()
