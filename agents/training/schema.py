"""What a `pdgym-train` config may contain (structured schemas), its checks, and the run's identity.

A run is identified by the part of its config that changes what is learned (env, agent, normalisation,
seed, vector-env count, segments, splits): `identity()` extracts it, `config_hash()` digests it into the
default run name (`conf/train.yaml`: `..._${pdgym_run_hash:}`), and `identity_diff()` names the keys a
resume would change, so a run directory never silently continues a different experiment. Budget and
bookkeeping keys (total_timesteps, eval, checkpoint_freq, threads, progress, wandb, vec_env) may change
on resume: they do not change what one training step does.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any

from pdgym.agents.evaluation.metric_keys import METRIC_KEYS, POINTS
from pdgym.agents.learned import model_store as M
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.validation import check_bool, check_seed_list


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
    teacher: Any = None  # baseline at the env's decision point: a name or {name, params...}; null: no warm start
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
    mode: str = "offline"  # offline | online | disabled (WANDB_MODE in the environment is a ceiling: the more private wins)
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
    log_freq: int = 0  # environment steps between progress lines (0: about 20 lines per run)
    resume: str = "auto"  # auto (continue the run directory's last checkpoint) | never | PATH to a checkpoint
    torch_threads: int = 1
    progress: bool = True
    wandb: WandbSchema = field(default_factory=WandbSchema)


APP_KEYS = tuple(TrainSchema.__dataclass_fields__)
# The config keys that define what a run learns (see the module docstring).
IDENTITY_KEYS = ("env", "agent", "normalize", "seed", "n_envs", "max_segments", "splits")
# Algorithm arguments that must be positive / in (0, 1]: checked here so a bad value is one line, not a
# traceback from deep inside torch or SB3.
POSITIVE = ("learning_rate", "n_steps", "batch_size", "n_epochs", "buffer_size", "train_freq", "gradient_steps",
            "target_update_interval", "max_grad_norm", "clip_range")
UNIT = ("gamma", "gae_lambda", "tau", "exploration_fraction")
NON_NEGATIVE = ("ent_coef", "vf_coef", "learning_starts", "exploration_initial_eps", "exploration_final_eps")


def strict_bools(cls, node, prefix: str) -> None:
    """Every boolean key of the schema `cls` that `node` sets is true or false: OmegaConf's merge would take 3 (or
    0) as true (false), so `progress=3` ran a training; the raw value is checked first (check_bool's line)."""
    import dataclasses
    import typing

    if not isinstance(node, dict):
        return
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in node:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        kind = hints.get(f.name)
        if kind is bool:
            check_bool(node[f.name], key)
        elif dataclasses.is_dataclass(kind):
            strict_bools(kind, node[f.name], key)


def validate(data: dict) -> tuple[TrainSchema, EnvSchema, AgentSchema]:
    """Check the app, env and agent nodes against their schemas: a wrong key or value is one line."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def build(cls, node, prefix):
        strict_bools(cls, node, prefix)
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
    for k in ("n_envs", "torch_threads", "max_segments"):
        if getattr(app, k) < 1:
            raise ConfigError(f"{k}: got {getattr(app, k)}; must be >= 1")
    for k in ("total_timesteps", "checkpoint_freq", "log_freq", "seed"):  # total_timesteps=0: the BC clone only
        if getattr(app, k) < 0:
            raise ConfigError(f"{k}: got {getattr(app, k)}; must be >= 0")
    if not isinstance(app.name, str) or not app.name.strip():
        raise ConfigError(f"name: {'empty' if not str(app.name).strip() else repr(app.name)}; it names the run "
                          "(letters, digits, '_', '-', '.')")
    if app.total_timesteps == 0 and agent.bc.teacher is None:
        raise ConfigError("total_timesteps: 0 trains nothing without agent.bc.teacher (0 with a teacher: the "
                          "behaviour-cloned policy only); give a number of environment steps >= 1")
    check_bc(agent.bc)
    if app.eval.freq < 0:
        raise ConfigError(f"eval.freq: got {app.eval.freq}; must be >= 0 (0: only at the end)")
    check_seed_list(app.eval.seeds, "eval.seeds")
    if not (math.isfinite(app.normalize.gamma) and 0 < app.normalize.gamma <= 1):
        raise ConfigError(f"normalize.gamma: got {app.normalize.gamma}; allowed (0, 1]")
    if not (math.isfinite(app.normalize.clip_obs) and app.normalize.clip_obs > 0):
        raise ConfigError(f"normalize.clip_obs: got {app.normalize.clip_obs}; must be a finite number > 0")
    M.check_net_arch(agent.net_arch)
    if app.eval.split not in data["splits"]:
        raise ConfigError(f"eval.split: got {app.eval.split!r}; allowed: {', '.join(data['splits'])}")
    if env.point not in POINTS:
        raise ConfigError(f"env.point: got {env.point!r}; allowed: {', '.join(POINTS)}")
    if env.primary not in METRIC_KEYS:
        raise ConfigError(f"env.primary: got {env.primary!r}; allowed: {', '.join(METRIC_KEYS)}")
    check_algo_kwargs(agent.algo, agent.kwargs)
    if env.kwargs.get("mask_in_obs"):  # SB3's policies take the flat observation and read action_masks() themselves
        raise ConfigError("env.kwargs.mask_in_obs: pdgym-train (SB3) reads the mask from action_masks(); the Dict "
                          "observation is for other clients (docs/clients.md); drop it")
    if agent.bc.teacher is not None and agent.algo == "dqn":
        raise ConfigError("agent.bc.teacher: behaviour cloning warm-starts policy-gradient agents "
                          "(maskable_ppo, ppo, a2c), not dqn")
    if agent.bc.teacher is not None:
        check_teacher(agent.bc.teacher, env.point)
    return app, env, agent


def check_bc(bc: BCSchema) -> None:
    """agent.bc's numbers (read even without a teacher: a bad one is a typo now, a crash in a later run)."""
    for k in ("episodes", "max_steps", "epochs", "batch_size"):
        if getattr(bc, k) < 1:
            raise ConfigError(f"agent.bc.{k}: got {getattr(bc, k)}; must be an integer >= 1")
    if not (math.isfinite(bc.lr) and bc.lr > 0):
        raise ConfigError(f"agent.bc.lr: got {bc.lr}; must be a finite number > 0")
    if not (math.isfinite(bc.value_coef) and bc.value_coef >= 0):
        raise ConfigError(f"agent.bc.value_coef: got {bc.value_coef}; must be a finite number >= 0")


def check_teacher(teacher, point: str) -> None:
    """A baseline of the env's decision point, by name or {name, params...}: built now, so a bad teacher fails
    before the run folder exists (its parameters' own one-line errors)."""
    from pdgym.baselines import make_policy

    if not (isinstance(teacher, str) or (isinstance(teacher, dict) and "name" in teacher)):
        raise ConfigError(f"agent.bc.teacher: got {teacher!r}; give a {point} baseline name or {{name: ..., params}}")
    try:
        make_policy(point, teacher)
    except ConfigError as exc:
        raise ConfigError(f"agent.bc.teacher: {exc}") from None


def check_algo_kwargs(algo: str, kwargs: dict) -> None:
    """Names against the algorithm's constructor, values against their ranges (one line each)."""
    cls = M.algo_class(algo)
    allowed = {k for k in inspect.signature(cls.__init__).parameters if not k.startswith("_")} - {
        "self", "policy", "env", "seed", "device", "verbose", "policy_kwargs", "kwargs", "tensorboard_log"}
    for k, v in kwargs.items():
        if k not in allowed:
            raise ConfigError(f"agent.kwargs.{k}: not an argument of {cls.__name__}; allowed: "
                              f"{', '.join(sorted(allowed))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue  # schedules given as strings, tuples (train_freq) and the like: SB3 checks them
        if not math.isfinite(v) or (k in POSITIVE and v <= 0) or (k in NON_NEGATIVE and v < 0) \
                or (k in UNIT and not 0 < v <= 1):
            want = "> 0" if k in POSITIVE else ">= 0" if k in NON_NEGATIVE else "in (0, 1]" if k in UNIT else "finite"
            raise ConfigError(f"agent.kwargs.{k}: got {v}; must be {want}")


# --------------------------------------------------------------------------- run identity
def identity(data: dict) -> dict:
    """The part of a composed train config that defines what the run learns."""
    return {k: data[k] for k in IDENTITY_KEYS if k in data}


def config_hash(data: dict, n: int = 8) -> str:
    text = json.dumps(identity(data), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _flat(d: Any, prefix: str = "") -> dict:
    if isinstance(d, dict) and d:
        out: dict = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def identity_diff(old: dict, new: dict) -> list[str]:
    """Dotted keys whose value differs between two identities (missing on one side counts)."""
    a, b = _flat(old), _flat(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k, "<unset>") != b.get(k, "<unset>"))


def register_resolvers() -> None:
    """`${pdgym_run_hash:}`: the config hash of the config being composed (for the default run name)."""
    from omegaconf import OmegaConf

    def run_hash(*, _root_) -> str:
        return config_hash({k: OmegaConf.to_container(_root_[k], resolve=True) if OmegaConf.is_config(_root_[k])
                            else _root_[k] for k in IDENTITY_KEYS if k in _root_})

    if not OmegaConf.has_resolver("pdgym_run_hash"):
        OmegaConf.register_new_resolver("pdgym_run_hash", run_hash)
