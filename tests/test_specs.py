"""One Gymnasium id per formulation (envs/specs.py): registered at its point's env, every formulation covered, the
point's own id with another formulation's options an alias that warns, contradicting options refused."""

from __future__ import annotations

import warnings
from types import MappingProxyType

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the envs)
import pytest
from gymnasium import spaces
from pdgym.envs import prefill_dispatch, specs
from pdgym.envs.base import PAUSE, AgentDecider, Decider, DecidingCore
from pdgym.envs.features import LayoutCore
from pdgym.envs.sim import ConfigError
from pdgym.envs.sim.notices import EnvWarning
from pdgym.envs.sim.points import POINTS
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.specs import SPECS, EnvSpec, core_class, formulation, option_values

SMALL = {"prefill": {"overrides": ["workload.num_requests=40", "workload.rate=150"]},
         "decode": {"scenario": "decode_tier_n8", "overrides": ["workload.num_requests=40", "workload.rate=400"]},
         "batching": {"overrides": ["workload.num_requests=20", "workload.concurrency=8"]}}


def test_every_id_is_registered_at_its_points_env():
    assert {p.env_id for p in POINTS.values()} <= set(SPECS)  # each point's own id is a formulation too
    for s in SPECS.values():
        spec, point = gym.spec(s.id), POINTS[s.point]
        assert (spec.entry_point, spec.max_episode_steps) == (point.entry_point, point.max_episode_steps)
        assert spec.kwargs == {**s.options, "registered_as": s.id}


def test_every_formulation_of_the_envs_has_its_own_id():
    choices = {("prefill", "mode", m) for m in ("timing", "allocation", "composition", "route", "admit")}
    choices |= {("decode", "action", a) for a in ("worker", "pick")}
    choices |= {("batching", "mode", m) for m in ("phase", "threshold")}
    assert option_values("prefill", "mode", "timing") == ("timing", "allocation", "composition", "route", "admit")
    assert option_values("decode", "action", "worker") == ("worker", "pick")
    assert option_values("batching", "mode", "phase") == ("phase", "threshold")
    for point, key, value in choices:
        s = formulation(point, {key: value})
        assert s is not None and s.point == point
        assert s.options.get(key, value) == value
        assert s.options or s.id == POINTS[point].env_id  # the default formulation is the point's own id
    assert formulation("batching", {"mode": "threshold", "continuous": True}).id == "pdgym/BatchingThresholdContinuous-v0"


@pytest.mark.parametrize("env_id", list(SPECS))
def test_each_id_runs_the_core_its_row_names_in_the_env_and_as_an_agent(env_id):
    """One contract (envs/base.py's PolicyCore): the env's core is the row's class answered by the env (PAUSE),
    AgentPolicy is the same class answered by predict."""
    s = SPECS[env_id]
    cls = core_class(s.point, s.options)
    assert s.core.split(":")[1] == cls.__name__ and isinstance(cls, type)
    env = gym.make(env_id, disable_env_checker=True, **SMALL[s.point]).unwrapped
    assert type(env.core) is cls and env.core.decider is PAUSE
    def predict(obs, mask):
        return 0

    agent = type(env).agent_policy(predict, **s.options)
    assert type(agent) is cls and isinstance(agent.decider, AgentDecider) and agent.invalid_actions == 0
    assert agent.predict is predict and env.core.predict is None  # the bounded runner finds an agent's budget here
    for name in ("observe", "mask", "apply", "default_action", "describe", "spaces", "action_meanings"):
        assert callable(getattr(agent, name)), name


class ToyCore(prefill_dispatch.DispatchCore):
    """A toy formulation: timing's core under its own mode value, counting its decisions."""

    def __init__(self, mode: str = "toy", tick_s: float = 0.02):
        super().__init__(mode, tick_s)
        self.mode, self.seen = "timing", 0

    def observe(self, sim, mask=None):
        self.seen += 1
        return super().observe(sim, mask)


def test_adding_a_formulation_is_one_spec_row(monkeypatch):
    """docs/architecture.md: a formulation is its SPECS row (id, point, core, options) and its core class; nothing
    else is edited: the env builds it, AgentPolicy runs it, the option's allowed values name it."""
    row = EnvSpec("pdgym/PrefillToy-v0", "prefill", f"{__name__}:ToyCore", {"mode": "toy"})
    monkeypatch.setattr(specs, "SPECS", MappingProxyType({**SPECS, row.id: row}))
    with pytest.raises(ConfigError, match="env.mode: .*allowed: .*, toy$"):
        prefill_dispatch.make_env(mode="nope", **SMALL["prefill"])
    env = prefill_dispatch.make_env(mode="toy", **SMALL["prefill"])
    assert type(env.core) is ToyCore and env.action_space.n == 1 + env.core.n  # timing: hold or an instance
    env.reset(seed=0)
    assert env.core.seen == 1
    agent = prefill_dispatch.AgentPolicy(lambda obs, mask: int(mask.nonzero()[0][-1]), mode="toy",
                                         **SMALL["prefill"])  # release to the last allowed instance, else hold
    from pdgym.envs.scenario import load_scenario
    from pdgym.envs.sim import simulate

    res = simulate(load_scenario("ds_v3_h800_3p1d", SMALL["prefill"]["overrides"]).sim, {"prefill": agent}, 0)
    assert type(agent) is ToyCore and agent.seen > 0 and agent.invalid_actions == 0
    assert res.summary()["finished"] + res.summary()["rejected"] == 40


@pytest.mark.parametrize("env_id", ["pdgym/PrefillAllocation-v0", "pdgym/DecodePick-v0", "pdgym/BatchingThreshold-v0"])
def test_an_id_makes_its_formulation_and_the_old_form_warns(env_id):
    s = SPECS[env_id]
    base = POINTS[s.point].env_id
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvWarning)
        new = gym.make(env_id, disable_env_checker=True, **SMALL[s.point]).unwrapped
        same = gym.make(env_id, disable_env_checker=True, **SMALL[s.point], **s.options).unwrapped  # redundant: fine
    with pytest.warns(EnvWarning, match=f"{base} with .* is an alias of {env_id}: make that id"):
        old = gym.make(base, disable_env_checker=True, **SMALL[s.point], **s.options).unwrapped
    for env in (new, same, old):
        assert env.action_space == new.action_space and env.observation_space == new.observation_space
    assert (new.reset(seed=1)[0] == old.reset(seed=1)[0]).all()
    key, value = next(iter(s.options.items()))
    other = next(v for p, k, v in [("prefill", "mode", "timing"), ("decode", "action", "worker"),
                                   ("batching", "mode", "phase")] if p == s.point)
    with pytest.raises(ConfigError, match=f"env.{key}: {env_id} is {key}={value!r}; got {other!r}"):
        gym.make(env_id, disable_env_checker=True, **SMALL[s.point], **{key: other})


@pytest.mark.parametrize("env_id", [i for i, s in SPECS.items() if s.options])
def test_training_and_stored_agents_build_the_formulation_an_id_names(env_id):
    """candidates.make_env (training's vector envs, pdgym-enjoy) builds what gym.make builds for the id: its
    registered options under the given ones; a stored agent of the id needs no formulation options in env_kwargs,
    and the old form (the point's id with them) stays a valid stored agent."""
    from pdgym.agents.evaluation import candidates

    s = SPECS[env_id]
    kw = SMALL[s.point]
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvWarning)  # the new id raises no alias warning
        env = candidates.make_env(env_id, **kw)
    ref = gym.make(env_id, disable_env_checker=True, **kw).unwrapped
    assert type(env.core) is type(ref.core) and env.action_space == ref.action_space and env.registered_as == env_id
    assert candidates.env_options(env_id, {"x": 1}) == {**s.options, "x": 1}
    key = next(iter(s.options))
    with pytest.raises(ConfigError, match=f"env.{key}: {env_id} is"):
        candidates.make_env(env_id, **kw, **{key: "other"})
    meta = {"point": s.point, "env_id": env_id, "env_kwargs": {}}
    assert candidates.check_stored_agent(meta, "policy", "agent.json") is meta
    old = {"point": s.point, "env_id": POINTS[s.point].env_id, "env_kwargs": dict(s.options)}
    assert candidates.check_stored_agent(old, "policy", "agent.json") is old
    other = next(p for p in POINTS if p != s.point)
    with pytest.raises(ConfigError, match=f"names env_id '{env_id}'; an agent of the {other} point"):
        candidates.check_stored_agent(dict(meta, point=other), "policy", "agent.json")


def test_our_configs_name_each_formulation_by_its_id():
    """No conf/env or conf/experiment composition gives a point's own id another formulation's options (the alias
    form that warns): each names the formulation's id."""
    import os
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parent.parent / "conf"
    runs = [[]] + [[f"experiment={p.stem}"] for p in sorted((conf / "experiment").glob("*.yaml"))] \
        + [[f"env={p.stem}"] for p in sorted((conf / "env").glob("*.yaml"))]
    with initialize_config_dir(config_dir=os.fspath(conf), version_base=None):
        for ov in runs:
            env = OmegaConf.to_container(compose("train", overrides=ov)["env"], resolve=False)
            assert env["id"] in SPECS, ov
            chosen = formulation(SPECS[env["id"]].point, {**SPECS[env["id"]].options, **env["kwargs"]})
            assert chosen.id == env["id"], f"{ov}: {env['id']} with {env['kwargs']} is {chosen.id}"


class ScratchCore(PrefillScheduler):
    """A formulation written against envs/base.py's PolicyCore alone (no shipped core subclassed; the point's
    protocol PrefillScheduler is what makes it the simulator's policy): at each arrival, hold (0) or release the
    whole buffer to instance i (i + 1); a hold re-asks after `tick_s`. Observation: the buffer's size and each
    instance's queued tokens, scaled."""

    name = "scratch"

    def __init__(self, mode: str = "scratch", tick_s: float = 0.05):
        self.mode, self.tick_s = mode, tick_s
        self.decider: Decider = PAUSE
        self.n_actions = 0

    # PolicyCore
    @property
    def invalid_actions(self) -> int:
        return self.decider.invalid_actions

    @property
    def predict(self):
        return getattr(self.decider, "predict", None)

    def bind(self, sim) -> None:
        self.n = len(sim.prefill)
        self.n_actions = 1 + self.n

    def spaces(self):
        return (spaces.Box(0.0, np.inf, (1 + self.n,), np.float32), spaces.Discrete(self.n_actions))

    def action_meanings(self) -> list[str]:
        return ["hold", *(f"release to prefill {i}" for i in range(self.n))]

    def observe(self, sim, mask=None) -> np.ndarray:
        queued = [float(p.queued_tokens.sum()) / 1e4 for p in sim.prefill]
        return np.array([len(sim.buffer) / 100.0, *queued], dtype=np.float32)

    def mask(self, sim) -> np.ndarray:
        m = np.zeros(self.n_actions, dtype=bool)
        m[0] = True
        m[1:][list(sim.healthy_prefill())] = bool(sim.buffer)
        return m

    def apply(self, sim, action) -> bool:
        if action == 0:
            sim.set_timer(sim.now + self.tick_s, "prefill")
        else:
            for rid in list(sim.buffer):
                sim.dispatch(rid, int(action) - 1)
        return False

    def default_action(self, sim, mask=None) -> int:
        return 0

    def describe(self, sim, action) -> str:
        return self.action_meanings()[int(action)]

    # PrefillScheduler: bound to each run (an AgentPolicy has no env to bind it); a decision at each arrival and
    # each expired hold
    def reset(self, sim):
        self.bind(sim)

    def on_arrival(self, sim, rid):
        self.decider.decide(self, sim)

    def on_timer(self, sim, tag):
        if sim.buffer:
            self.decider.decide(self, sim)


def test_a_formulation_written_from_scratch_runs_through_gym_sb3_and_an_agent_policy(monkeypatch):
    """docs/architecture.md's "Adding a formulation", proved on a core that subclasses no shipped core: its SPECS
    row, gym.make, Gymnasium's and SB3's env checkers, and the same class as an AgentPolicy through simulate()."""
    from gymnasium.utils.env_checker import check_env
    from pdgym.envs.scenario import load_scenario
    from pdgym.envs.sim import simulate
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    assert not issubclass(ScratchCore, (prefill_dispatch.DispatchCore, DecidingCore, LayoutCore))
    row = EnvSpec("pdgym/PrefillScratch-v0", "prefill", f"{__name__}:ScratchCore", {"mode": "scratch"})
    monkeypatch.setattr(specs, "SPECS", MappingProxyType({**SPECS, row.id: row}))
    gym.register(row.id, POINTS["prefill"].entry_point, max_episode_steps=POINTS["prefill"].max_episode_steps,
                 kwargs={**row.options, "registered_as": row.id})
    try:
        env = gym.make(row.id, **SMALL["prefill"])
        core = env.unwrapped.core
        assert type(core) is ScratchCore and env.action_space.n == 1 + core.n
        check_env(env.unwrapped, skip_render_check=True)
        sb3_check_env(env.unwrapped, warn=False)
        obs, _ = env.reset(seed=0)
        steps = ret = 0
        done = False
        while not done:  # release to the first allowed instance: every request is served
            mask = env.unwrapped.action_masks()
            obs, r, term, trunc, _ = env.step(int(mask.nonzero()[0][-1]))
            ret, steps, done = ret + r, steps + 1, term or trunc
        assert term and env.unwrapped.summary()["finished"] == 40 and ret < 0  # waiting costs; nothing stalled
    finally:
        gym.registry.pop(row.id, None)
    agent = prefill_dispatch.AgentPolicy(lambda obs, mask: int(mask.nonzero()[0][-1]), mode="scratch",
                                         **SMALL["prefill"])
    res = simulate(load_scenario("ds_v3_h800_3p1d", SMALL["prefill"]["overrides"]).sim, {"prefill": agent}, 0)
    assert type(agent) is ScratchCore and agent.invalid_actions == 0 and res.summary()["finished"] == 40
