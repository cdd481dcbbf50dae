"""What a policy spec names, as a Candidate for evaluation: a registered baseline, a configured preset
(conf/policy/POINT/NAME.yaml), `module:Class` (named on the command line or in Python only), a pdgym-train
run folder or model zip, or a shipped agent (`zoo:NAME`). Trained agents are loaded through the model store:
weights and arrays only, never pickle; a run folder's agent.json is read bounded and type-checked."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.points import POINTS
from pdgym.envs.specs import SPECS

AGENT_META = "agent.json"


def env_ids() -> list[str]:
    """The ids of pdgym's own envs (each decision point's, each formulation's: envs/specs.py); gymnasium's
    registry holds others (CartPole-v1)."""
    return list(dict.fromkeys([*(p.env_id for p in POINTS.values()), *SPECS]))


def env_point(env_id: str) -> str | None:
    """The decision point whose env runs `env_id` (None: not one of pdgym's ids)."""
    if env_id in SPECS:
        return SPECS[env_id].point
    return next((name for name, p in POINTS.items() if p.env_id == env_id), None)


def env_options(env_id: str, kwargs: Mapping) -> dict:
    """`kwargs` with the options `env_id` is registered with (its formulation's, envs/specs.py) under them, as
    gym.make(env_id, **kwargs) would pass them: what make_env and AgentPolicy need to build that formulation."""
    return {**(SPECS[env_id].options if env_id in SPECS else {}), **kwargs}


def make_env(env_id: str, **kwargs):
    """The raw env (no TimeLimit) of pdgym id `env_id` with `kwargs`, in the formulation the id names:
    gym.make's options without its wrappers (a contradicting option is the env's ConfigError)."""
    extra = {"registered_as": env_id} if env_id in SPECS else {}
    return env_module(env_id).make_env(**env_options(env_id, kwargs), **extra)


def env_module(env_id: str, key: str = "env.id"):
    """The module of a registered pdgym env (it holds ENV_ID, make_env and AgentPolicy); any other id, one of
    gymnasium's own included, is one line naming `key`."""
    import gymnasium as gym
    import pdgym.envs  # noqa: F401  (registers the envs)

    if env_id not in env_ids() or env_id not in gym.registry:
        raise ConfigError(f"{key}: unknown {str(env_id)[:80]!r}; allowed: {', '.join(env_ids())}")
    entry = gym.registry[env_id].entry_point
    return importlib.import_module(entry.split(":")[0] if isinstance(entry, str) else entry.__module__)


def model_file(path: Path) -> Path:
    """A model zip, or the best (else final, else last checkpoint) model of a training run directory; a model
    the run directory names must be a regular file inside it (no symlink out of it, no device); a folder at a
    model's name is no model: the next is taken."""
    from pdgym.agents.learned.model_store import MAX_MODEL_BYTES, latest_complete

    if not path.is_dir():
        return safe_files.check_regular_file(path, MAX_MODEL_BYTES, "policy")
    for name in ("best_model.zip", "final_model.zip"):
        if os.path.lexists(path / name) and not ((path / name).is_dir() and not (path / name).is_symlink()):
            return safe_files.check_regular_file(path / name, MAX_MODEL_BYTES, "policy", within=path)
    ckpt = latest_complete(path / "checkpoints")
    if ckpt is not None:
        return safe_files.check_regular_file(ckpt, MAX_MODEL_BYTES, "policy", within=path)
    raise FileNotFoundError(f"{path}: no best_model.zip, final_model.zip or checkpoints/model_<steps>.zip")


MAX_AGENT_META_BYTES = 16 * safe_files.MiB  # agent.json: JSON of a few kB (docs/architecture.md, bounds)
AGENT_META_KEYS = {"point": str, "env_id": str, "env_kwargs": dict}  # what rebuilding an agent's observation reads
SET_BY_THE_APP = ("config", "render_mode", "trace_split")  # env options an app gives the env itself, never stored


def check_stored_agent(meta: dict, key: str, path) -> dict:
    """A stored agent's point, env id and env_kwargs (agent.json, a zoo index entry), refused by name when they
    could not have been written by pdgym-train: a point or env id outside pdgym's registry (gymnasium's CartPole-v1
    would be imported and have no AgentPolicy), an env id of another point, env_kwargs keys the app sets itself."""
    if meta["point"] not in POINTS:
        raise ConfigError(f"{key}: {path} names decision point {str(meta['point'])[:40]!r}; allowed: "
                          f"{', '.join(POINTS)}")
    if env_point(meta["env_id"]) != meta["point"]:
        want = [i for i in env_ids() if env_point(i) == meta["point"]]
        raise ConfigError(f"{key}: {path} names env_id {str(meta['env_id'])[:80]!r}; an agent of the "
                          f"{meta['point']} point runs in {', '.join(want)} (pdgym's envs: {', '.join(env_ids())})")
    bad = sorted(k for k in meta["env_kwargs"] if k in SET_BY_THE_APP or not isinstance(k, str))
    if bad:
        raise ConfigError(f"{key}: {path} has env_kwargs {bad}; those are set by the app running the agent, never "
                          "stored (pdgym-train writes scenario, overrides, the other points' policies, env options)")
    return meta


def read_agent_meta(root: Path, key: str = "policy") -> dict:
    """A run directory's agent.json, checked: a regular file inside the run (bounded), UTF-8 JSON, an object with
    the keys evaluation reads, of their types; anything else is one ConfigError line naming the file."""
    path = Path(root) / AGENT_META
    meta = safe_files.read_json(path, MAX_AGENT_META_BYTES, key, within=root)
    if not isinstance(meta, dict):
        raise ConfigError(f"{key}: {path} holds a JSON {type(meta).__name__}, not an object written by pdgym-train")
    for name, kind in AGENT_META_KEYS.items():
        if not isinstance(meta.get(name), kind):
            raise ConfigError(f"{key}: {path} has no valid {name!r} (got {meta.get(name)!r}); not written by "
                              "pdgym-train?")
    return check_stored_agent(meta, key, path)


@dataclass
class LoadedAgent:
    """A trained model plus what is needed to rebuild its observation: env id, env kwargs, decision point."""

    path: Path
    meta: dict
    predict: Any
    source: str | None = None  # the stored file `meta` was read from (its policies are never imported code);
    # None: built in this process from the command line (pdgym-train's own held-out evaluation)

    @property
    def point(self) -> str:
        return self.meta["point"]

    def policy(self):
        """The env's AgentPolicy around the network, its decisions bounded per request (DecisionBudget)."""
        from pdgym.baselines.registry import named_by_stored_file
        from pdgym.envs.base import DECISIONS_PER_REQUEST, DecisionBudget

        mod = env_module(self.meta["env_id"])
        budget = DecisionBudget(self.predict, DECISIONS_PER_REQUEST.get(self.point))
        with named_by_stored_file(self.source):
            return mod.AgentPolicy(budget, **env_options(self.meta["env_id"], self.meta["env_kwargs"]))


def load_agent(path: str | Path) -> LoadedAgent:
    """Load a model written by pdgym-train (its run directory, or a .zip inside it), or a shipped one
    (`zoo:NAME`), through the model store: the network is rebuilt from its saved spec and only weights and
    arrays are read (no pickle)."""
    from pdgym.agents.learned import zoo_store
    from pdgym.agents.learned.model_store import load_predictor

    if zoo_store.is_zoo(path):
        return zoo_agent(str(path).removeprefix(zoo_store.PREFIX))
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"policy: {p} does not exist; give a pdgym-train run directory, a model .zip in one, "
                          "or a baseline name")
    zip_path = model_file(p)
    root = next((d for d in (zip_path.parent, zip_path.parent.parent) if os.path.lexists(d / AGENT_META)), None)
    if root is None:
        raise ConfigError(f"policy: {p} has no {AGENT_META} beside it (not written by pdgym-train?)")
    meta = read_agent_meta(root)
    return LoadedAgent(zip_path, meta, load_predictor(zip_path, trained_on=meta["env_kwargs"].get("scenario")),
                       str(root / AGENT_META))


def zoo_agent(name: str, root: Path | None = None) -> LoadedAgent:
    """A shipped agent (agents/learned/zoo_store.py): its archive checked against the index's sha256, then read by
    the model store; an unknown name is one line listing the available ones."""
    from pdgym.agents.learned import zoo_store
    from pdgym.agents.learned.model_store import load_predictor

    ent = zoo_store.entry(name, root)
    path = zoo_store.archive(name, root)
    meta = check_stored_agent(zoo_store.agent_meta(name, ent), "policy", f"the zoo index entry {name!r}")
    return LoadedAgent(path, meta, load_predictor(path, ent["sha256"], meta["env_kwargs"].get("scenario")),
                       zoo_source(name))


def zoo_source(name: str) -> str:
    """How a zoo entry's stored settings are named in a refusal."""
    return f"the zoo index's entry {name!r}"


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
    """A trained agent: a model zip, a run folder, or a shipped one (zoo:NAME). A bare policy name is a policy even
    where a folder of that name exists (`pdgym-eval policy=br0 hydra.run.dir=br0` created one); ./br0 is the folder."""
    from pdgym.baselines.registry import names

    if spec.startswith("zoo:") or spec.endswith(".zip") or "/" in spec:
        return True
    return Path(spec).exists() and not any(spec in names(k) for k in POINTS)


def resolve(spec: str | dict, point: str | None = None, label: str | None = None) -> Candidate:
    """A baseline name (or {name, params}) or a model path -> Candidate; the decision point is inferred
    from the registry (or the agent's metadata) unless given."""
    from pdgym.baselines import registered
    from pdgym.baselines.registry import KINDS, did_you_mean, external_class, is_external, names, point_of, policy_class

    if point is not None and point not in POINTS:
        raise ConfigError(f"point: got {point!r}; allowed: {', '.join(POINTS)}")
    if not isinstance(spec, (str, Mapping)) or (isinstance(spec, Mapping) and not isinstance(spec.get("name"), str)):
        raise ConfigError(f"policy: got {spec!r}; must be a baseline name (e.g. 'least_kv'), {{'name': ..., params}}, "
                          "a pdgym-train run folder or model zip, zoo:NAME, or module:Class")
    if isinstance(spec, str) and is_model_path(spec):
        agent = load_agent(spec)
        if point is not None and point != agent.point:
            raise ConfigError(f"point: {spec} is a {agent.point} agent, not {point}")
        return Candidate(label or agent.meta.get("name", Path(spec).stem), "agent", agent.point, agent=agent)
    base = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = base.get("name")
    kinds = [k for k in POINTS if name in registered(k)]
    if is_external(name):  # module:Class, named by the command line or Python (baselines/registry.py)
        kinds = point_of(external_class(name))
        if not kinds:
            raise ConfigError(f"policy: {name} subclasses no decision point's protocol; allowed bases: "
                              + ", ".join(f"{p.__module__}.{p.__name__}" for p in KINDS.values()))
    if not kinds:  # a configured preset (conf/policy/POINT/NAME.yaml, e.g. sbs_cache): its class and params
        from pdgym.baselines.registry import preset

        found = {k: preset(k, name) for k in POINTS if point in (None, k)}
        found = {k: v for k, v in found.items() if v is not None}
        if len(found) == 1:
            (point, pre), = found.items()
            label = label or name
            base = {**pre, **{k: v for k, v in base.items() if k != "name"}}
            name = base["name"]
            kinds = [point]
        else:
            kinds = list(found)
    if point is None:
        if len(kinds) > 1:  # jsq, random, round_robin: one name at two decision points
            both = " and ".join(f"{k} ({policy_class(k, name).__module__}.{policy_class(k, name).__name__})"
                                if name in registered(k) else k for k in kinds)
            raise ConfigError(f"policy: {name!r} names a policy at {both}; set point={'|'.join(kinds)}")
        if not kinds:
            every = sorted({n for k in POINTS for n in names(k)})
            allowed = "; ".join(f"{k}: {', '.join(names(k))}" for k in POINTS)
            raise ConfigError(f"policy: {name!r} is neither a model path, a policy name nor module:Class; "
                              f"{did_you_mean(name, every)}allowed: {allowed}")
        point = kinds[0]
    elif point not in kinds:
        raise ConfigError(f"policy: {name!r} is not a {point} policy; {did_you_mean(name, names(point))}allowed: "
                          f"{', '.join(names(point))}")
    return Candidate(label or name, "baseline", point, spec=base)
