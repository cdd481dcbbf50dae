"""`pdgym-train`: train a learned scheduler at one decision point with Stable-Baselines3 / sb3-contrib.

    pdgym-train                                      # MaskablePPO on DecodeRouting-v0 (conf/train.yaml)
    pdgym-train env=prefill_dispatch agent=ppo total_timesteps=50000 n_envs=4
    pdgym-train experiment=decode_bc_maskable_ppo    # a recipe of conf/experiment/
    pdgym-train -m hydra/launcher=joblib agent=ppo,maskable_ppo seed=0,1,2

Everything lands in runs/train/<date>/<name>/: config.yaml (resolved), agent.json (what evaluation
needs to rebuild the observation), checkpoints/, best_model.zip (best on the validation split),
final_model.zip, eval_history.csv, metrics.json, plots, TensorBoard logs (tb/) and the offline
wandb run (wandb/). Running the same name again resumes from its last checkpoint (`resume: auto`).

Traffic: training episodes use the `train` split (conf/splits: seeds from 1000, the first 45% of a
trace's rows, each vector env cycling through its own segments), best-model selection the `val`
split; pdgym-eval and the leaderboard use `test`. Evaluation runs the agent through its env's
`AgentPolicy` inside `simulate()`, the same code path as every baseline.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from pdgym.agents.evaluation import evaluate as E
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import write_json

from . import callbacks as C


# --------------------------------------------------------------------------- structured config
@dataclass
class EnvSchema:
    id: str = "pdgym/DecodeRouting-v0"
    point: str = "decode"
    scenario: str = "decode_tier_n16"
    overrides: list[str] = field(default_factory=list)  # Hydra-style overrides of the scenario
    kwargs: dict[str, Any] = field(default_factory=dict)  # env options, also given to AgentPolicy
    policies: dict[str, Any] = field(default_factory=dict)  # baselines at the other points (evaluation)
    primary: str = "imbalance_mean"  # what the best checkpoint is chosen on


@dataclass
class BCSchema:
    teacher: str | None = None  # baseline name at the env's decision point; null: no warm start
    episodes: int = 4  # teacher episodes collected through the env (train split)
    max_steps: int = 20000  # cap on collected decisions
    epochs: int = 20
    batch_size: int = 256
    lr: float = 1e-3
    value_coef: float = 0.5  # also fit the value head to the teacher's discounted returns
    balance: bool = False  # weight decisions by inverse action frequency (rare releases among holds)


@dataclass
class AgentSchema:
    algo: str = "maskable_ppo"  # maskable_ppo | ppo | a2c | dqn
    policy: str = "MlpPolicy"
    net_arch: Any = None  # SB3 net_arch (list or dict); null: SB3's default
    features: dict[str, Any] = field(default_factory=lambda: {"kind": "flat"})
    kwargs: dict[str, Any] = field(default_factory=dict)  # the algorithm's constructor arguments
    bc: BCSchema = field(default_factory=BCSchema)


@dataclass
class NormSchema:
    obs: bool = False
    reward: bool = False
    clip_obs: float = 10.0
    gamma: float = 0.99


@dataclass
class EvalSchema:
    freq: int = 5000  # environment steps between held-out evaluations (0: only at the end)
    seeds: list[int] = field(default_factory=lambda: [0, 1])  # run indices of the split
    split: str = "val"


@dataclass
class WandbSchema:
    mode: str = "offline"  # offline | online | disabled (WANDB_MODE in the environment wins)
    project: str = "pdgym"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class TrainSchema:
    name: str = "run"
    seed: int = 0
    total_timesteps: int = 20000
    n_envs: int = 2
    vec_env: str = "dummy"  # dummy | subproc
    max_segments: int = 8  # trace workloads: training segments each vector env cycles through
    normalize: NormSchema = field(default_factory=NormSchema)
    eval: EvalSchema = field(default_factory=EvalSchema)
    checkpoint_freq: int = 5000
    resume: str = "auto"  # auto (continue the run directory's last checkpoint) | never | PATH to a model zip
    torch_threads: int = 1
    progress: bool = True
    wandb: WandbSchema = field(default_factory=WandbSchema)


APP_KEYS = tuple(TrainSchema.__dataclass_fields__)


def validate(data: dict) -> tuple[TrainSchema, EnvSchema, AgentSchema]:
    """Check the app, env and agent nodes against their schemas: a wrong key or type is one line."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def build(cls, node, prefix):
        try:
            return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), node))
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None) or ""
            msg = str(exc).splitlines()[0]
            raise ConfigError(f"{'.'.join(k for k in (prefix, key) if k) or 'config'}: {msg}") from None

    app = build(TrainSchema, {k: data[k] for k in APP_KEYS if k in data}, "")
    env = build(EnvSchema, data.get("env") or {}, "env")
    agent = build(AgentSchema, data.get("agent") or {}, "agent")
    if app.vec_env not in ("dummy", "subproc"):
        raise ConfigError(f"vec_env: got {app.vec_env!r}; allowed: dummy, subproc")
    for k in ("total_timesteps", "n_envs", "torch_threads", "max_segments"):
        if getattr(app, k) < 1:
            raise ConfigError(f"{k}: got {getattr(app, k)}; must be >= 1")
    if app.eval.split not in data["splits"]:
        raise ConfigError(f"eval.split: got {app.eval.split!r}; allowed: {', '.join(data['splits'])}")
    if env.point not in E.POINTS:
        raise ConfigError(f"env.point: got {env.point!r}; allowed: {', '.join(E.POINTS)}")
    if env.primary not in E.METRIC_KEYS:
        raise ConfigError(f"env.primary: got {env.primary!r}; allowed: {', '.join(E.METRIC_KEYS)}")
    E.algo_class(agent.algo)
    if agent.bc.teacher is not None and agent.algo == "dqn":
        raise ConfigError("agent.bc.teacher: behaviour cloning warm-starts policy-gradient agents "
                          "(maskable_ppo, ppo, a2c), not dqn")
    return app, env, agent


# --------------------------------------------------------------------------- environments
class SegmentCycle(gym.Env):
    """One env per training segment of a trace; each reset moves to the next, so a vector env's worker
    sees several disjoint stretches of traffic instead of replaying one (action masks pass through)."""

    def __init__(self, factories: list, start: int = 0):
        self._factories = factories
        self._envs: dict[int, gym.Env] = {}
        self._i = start % len(factories)
        self._first = True
        env = self._env()
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.metadata = getattr(env, "metadata", {})
        self.obs_layout = getattr(env.unwrapped, "obs_layout", None)

    def _env(self) -> gym.Env:
        if self._i not in self._envs:
            self._envs[self._i] = self._factories[self._i]()
        return self._envs[self._i]

    def reset(self, *, seed=None, options=None):
        if not self._first:
            self._i = (self._i + 1) % len(self._factories)
        self._first = False
        super().reset(seed=seed)
        if seed is None:  # each segment env keeps its own stream after the first seeded reset
            seed = int(self.np_random.integers(2**31)) if len(self._envs) < len(self._factories) else None
        return self._env().reset(seed=seed, options=options)

    def step(self, action):
        return self._env().step(action)

    @property
    def unwrapped(self) -> gym.Env:
        """The current segment's env (its teacher_action, obs_layout, ...)."""
        return self._env().unwrapped

    def action_masks(self) -> np.ndarray:
        return self._env().unwrapped.action_masks()

    def close(self):
        for e in self._envs.values():
            e.close()


def _make(env_id: str, kwargs: dict) -> gym.Env:
    return E.env_module(env_id).make_env(**kwargs)


def env_kwargs(env: EnvSchema, overrides: list[str]) -> dict:
    """What make_env (and AgentPolicy, which ignores the scenario-level keys) gets: scenario, Hydra-style
    overrides, the baselines at the other decision points (kwargs named after the point), the env options."""
    return {"scenario": env.scenario, "overrides": list(overrides), **env.policies, **env.kwargs}


def scenario_raw(env: EnvSchema) -> dict:
    """The composed scenario the env trains on (the same composition the env does itself)."""
    from pdgym.envs.scenario import load_scenario

    raw = load_scenario(env.scenario, list(env.overrides)).raw
    pol = dict(raw.get("policy") or {})
    pol.update(env.policies)
    return dict(raw, policy=pol)


def env_factories(env: EnvSchema, raw: dict, split: dict, n_envs: int, max_segments: int) -> list:
    """n_envs callables building the training envs (trace workloads: a SegmentCycle each)."""
    seg0 = E.segment(raw["workload"], split, 0)
    if not seg0:
        return [partial(_make, env.id, env_kwargs(env, env.overrides)) for _ in range(n_envs)]
    n = seg0["num_requests"]
    rows = int((split["trace_to"] - split["trace_from"]) * E._trace_rows(str(raw["workload"]["trace"])))
    k = int(max(1, min(max_segments * n_envs, rows // n)))
    segs = [partial(_make, env.id, env_kwargs(env, [*env.overrides, *E.segment_overrides(raw, split, j)]))
            for j in range(k)]
    return [partial(SegmentCycle, segs, start=i * max(1, k // n_envs)) for i in range(n_envs)]


def make_vec_env(app: TrainSchema, env: EnvSchema, raw: dict, split: dict):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor

    fns = env_factories(env, raw, split, app.n_envs, app.max_segments)
    venv = SubprocVecEnv(fns) if app.vec_env == "subproc" else DummyVecEnv(fns)
    venv = VecMonitor(venv)
    venv.seed(int(split["seed_base"]) + 1000 * app.seed)
    return venv


# --------------------------------------------------------------------------- training
def _eval_fn(env: EnvSchema, raw: dict, split: dict, seeds: list[int], vec_norm):
    """Held-out evaluation of the model being trained, through simulate() and the env's AgentPolicy."""
    meta = {"env_id": env.id, "point": env.point, "env_kwargs": env_kwargs(env, env.overrides)}

    def run(model) -> dict:
        agent = E.LoadedAgent(Path("."), meta, E.masked_predictor(model, vec_norm))
        cand = E.Candidate("current", "agent", env.point, agent=agent)
        return E.evaluate(raw, cand, seeds, split, others=raw["policy"]).stats()

    return run


def _logger(out: Path, wandb_run):
    from stable_baselines3.common.logger import CSVOutputFormat, Logger, TensorBoardOutputFormat

    (out / "tb").mkdir(parents=True, exist_ok=True)
    formats = [CSVOutputFormat(str(out / "progress.csv")), TensorBoardOutputFormat(str(out / "tb"))]
    if wandb_run is not None:
        from .wandb_utils import WandbWriter

        formats.append(WandbWriter(wandb_run))
    return Logger(str(out), formats)


def _resume_from(app: TrainSchema, out: Path) -> Path | None:
    if app.resume == "never":
        return None
    if app.resume == "auto":
        return C.latest_checkpoint(out / "checkpoints")
    p = Path(app.resume)
    if not p.is_file():
        raise ConfigError(f"resume: {app.resume!r} is not a model zip (or use auto / never)")
    return p


def build_model(app: TrainSchema, env: EnvSchema, agent: AgentSchema, venv, out: Path):
    """A fresh model, or the resumed one (with its replay buffer / VecNormalize statistics)."""
    import pickle

    from .features import pointer_policy, policy_kwargs

    cls = E.algo_class(agent.algo)
    ckpt = _resume_from(app, out)
    if ckpt is not None:
        norm = C.model_paths(ckpt)[1]
        if norm.is_file():
            with open(norm, "rb") as fh:
                vn = pickle.load(fh)
            vn.set_venv(venv)
            venv = vn
        model = cls.load(ckpt, env=venv, device="cpu")
        replay = ckpt.with_name(ckpt.stem + "_replay.pkl")
        if replay.is_file():
            model.load_replay_buffer(replay)
        return model, venv, ckpt
    if app.normalize.obs or app.normalize.reward:
        from stable_baselines3.common.vec_env import VecNormalize

        venv = VecNormalize(venv, norm_obs=app.normalize.obs, norm_reward=app.normalize.reward,
                            clip_obs=app.normalize.clip_obs, gamma=app.normalize.gamma)
    probe = venv.envs[0] if hasattr(venv, "envs") else None
    pk = policy_kwargs(agent.features, agent.net_arch, probe)
    policy = pointer_policy(agent.algo) if agent.features.get("kind") == "pointer" else agent.policy
    try:
        model = cls(policy, venv, seed=app.seed, device="cpu", verbose=0, policy_kwargs=pk, **agent.kwargs)
    except TypeError as exc:
        raise ConfigError(f"agent.kwargs: {exc}") from None
    return model, venv, None


def train(data: dict, out: Path) -> dict:
    """Train from a composed config (plain dict); returns the run summary written to metrics.json."""
    import torch

    from . import imitation, wandb_utils

    t0 = time.perf_counter()
    app, env, agent = validate(data)
    torch.set_num_threads(app.torch_threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from omegaconf import OmegaConf

    (out / "config.yaml").write_text(OmegaConf.to_yaml(data))
    raw = scenario_raw(env)
    train_split = data["splits"]["train"]
    venv = make_vec_env(app, env, raw, train_split)
    model, venv, resumed = build_model(app, env, agent, venv, out)
    from stable_baselines3.common.vec_env import VecNormalize

    vec_norm = venv if isinstance(venv, VecNormalize) else None
    meta = {"name": app.name, "algo": agent.algo, "env_id": env.id, "point": env.point, "scenario": env.scenario,
            "overrides": env.overrides, "env_kwargs": env_kwargs(env, env.overrides),
            "policies": env.policies, "primary": env.primary,
            "seed": app.seed, "splits": data["splits"]}
    write_json(out / E.AGENT_META, meta)

    run_id_file = out / "wandb_id.txt"
    wrun = wandb_utils.init(data.get("wandb") or {}, out, data, app.name,
                            run_id_file.read_text().strip() if resumed and run_id_file.is_file() else None)
    if wrun is not None:
        run_id_file.write_text(wrun.id)
    model.set_logger(_logger(out, wrun))

    bc_stats = None
    if agent.bc.teacher and resumed is None:
        factory = env_factories(env, raw, train_split, 1, 8)[0]
        bc_stats = imitation.warm_start(model, env, factory, train_split, agent.bc, vec_norm, app.seed,
                                        progress=app.progress)
        write_json(out / "bc.json", bc_stats)

    val_split = data["splits"][app.eval.split]
    evaluator = C.HeldOutEval(_eval_fn(env, raw, val_split, app.eval.seeds, vec_norm), app.eval.freq, env.primary,
                              out, vec_norm)
    ckpt = C.CheckpointEvery(app.checkpoint_freq, out / "checkpoints", vec_norm)
    done = int(model.num_timesteps)
    remaining = max(0, app.total_timesteps - done)
    if bc_stats is not None:  # the warm-started policy is the first candidate for the best model
        evaluator.init_callback(model)
        evaluator.run()
    if remaining:
        model.learn(remaining, callback=[C.EpisodeMetricsCallback(), evaluator, ckpt],
                    progress_bar=app.progress, reset_num_timesteps=resumed is None)
    ckpt.init_callback(model)
    ckpt.save()
    C.save_model(model, out / "final_model.zip", vec_norm)
    if evaluator.last != model.num_timesteps or evaluator.last_stats is None:
        evaluator.init_callback(model)
        evaluator.run()
    final = evaluator.last_stats
    best = json.loads((out / "best_metrics.json").read_text()) if (out / "best_metrics.json").is_file() else None
    best_val = best["metrics"][env.primary]["mean"] if best else final[env.primary]["mean"]
    summary = {"name": app.name, "algo": agent.algo, "env_id": env.id, "timesteps": int(model.num_timesteps),
               "resumed_from": str(resumed) if resumed else None, "bc": bc_stats, "primary": env.primary,
               "objective": best_val, "best_timesteps": best["timesteps"] if best else None,
               "val_final": {k: final[k]["mean"] for k in E.METRIC_KEYS},
               "wall_time_s": time.perf_counter() - t0}
    write_json(out / "metrics.json", summary)
    _plot_history(out, env.primary)
    venv.close()
    if wrun is not None:
        wrun.summary.update({f"val_final/{k}": v for k, v in summary["val_final"].items()
                             if v is not None and math.isfinite(v)})
        wrun.finish()
    return summary


def _plot_history(out: Path, primary: str) -> None:
    import pandas as pd
    from pdgym.agents import plots

    h = out / "eval_history.csv"
    if not h.is_file():
        return
    df = pd.read_csv(h)
    if len(df):
        plots.lines(df.timesteps.tolist(), {primary: df[primary].tolist()}, "environment steps",
                    f"validation {primary}", out / f"eval_{primary}.png")


def train_from_overrides(overrides: list[str], out: Path, name: str | None = None) -> dict:
    """Compose conf/train.yaml with overrides (outside the command line) and train into `out`."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from pdgym.agents.common import to_container

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module("pdgym.conf", version_base=None):
        try:
            cfg = compose(config_name="train", overrides=[*overrides, f"name={name or Path(out).name}"])
        except HydraException as exc:
            raise ConfigError(f"train overrides: {str(exc).splitlines()[0]}") from None
    return train(to_container(cfg), out)


def _task(cfg) -> float | None:
    """One training run in Hydra's run directory (looked up by name: launchers may run it elsewhere)."""
    from pdgym.agents.common import run_dir, to_container

    s = train(to_container(cfg), run_dir())
    print(f"{s['name']}: {s['timesteps']} steps in {s['wall_time_s']:.0f} s; run in {run_dir()}")
    return s["objective"]  # for sweepers (Optuna): the best validation value of env.primary


def main(argv: list[str] | None = None) -> float | None:
    """pdgym-train: one-line errors, no run folder before the config composes (agents/common.hydra_cli)."""
    from pdgym.agents.common import hydra_cli

    return hydra_cli("pdgym-train", "train")(_task)(argv)


if __name__ == "__main__":
    sys.exit(main())
