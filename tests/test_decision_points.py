"""A toy decision point added by docs/architecture.md's "Adding a decision point" steps, touching nothing but the
table (envs/sim/points.py) and its own code: the engine, the baseline registry and the env registration follow."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from pdgym.baselines import registry
from pdgym.envs import register_envs
from pdgym.envs.base import DECISIONS_PER_REQUEST
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, Simulator
from pdgym.envs.sim.points import POINTS, DecisionPoint
from pdgym.envs.sim.requests import reason_code
from pdgym.envs.sim.view import SimView

ROOT = Path(__file__).resolve().parent.parent
TOY_ENV = "pdgym/ToyShedding-v0"


# Step 1 (policy.py): the protocol and the engine's default.
class LoadShedder:
    """Toy point: on its own timers, may reject pooled requests (load shedding)."""

    name = "base"

    def reset(self, sim: SimView) -> None:
        """Called once before the run starts."""

    def on_timer(self, sim: SimView, tag: object) -> None:
        """A timer this policy set with `sim.set_timer(t, "shed", tag)` fired."""


class NoShedding(LoadShedder):
    """The engine's own behaviour: nothing is shed."""


# Step 4 (baselines/): a policy of the point.
class ShedOldest(LoadShedder):
    """Every `period` s (`times` ticks), reject the oldest pooled request."""

    def __init__(self, period: float = 0.05, times: int = 8):
        self.period, self.times = period, times

    def reset(self, sim):
        self.resets = getattr(self, "resets", 0) + 1
        self.fired, self.shed = [], []
        sim.set_timer(self.period, "shed", 1)

    def on_timer(self, sim, tag):
        self.fired.append((sim.now, tag))
        if sim.pool:
            rid = next(iter(sim.pool))
            sim.reject(rid, "policy")
            self.shed.append(rid)
        if tag < self.times:
            sim.set_timer(sim.now + self.period, "shed", tag + 1)


WOKEN = []


def wake(sim) -> None:
    """The toy's wake-up: a shed request frees pool space, so idle decode instances look again."""
    WOKEN.append(sim.now)
    for d in sim.decode:
        d.wake()


# Step 5 (envs/<module>.py): the env at the entry point (here a stub: the registration is what is tested).
class ToyEnv(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}


@pytest.fixture
def toy_point(monkeypatch):
    # Step 2 (points.py): the one table entry.
    point = DecisionPoint("shed", LoadShedder, NoShedding, "none", TOY_ENV, f"{__name__}:ToyEnv", 7, wake,
                          "toy load shedder: which pooled requests are rejected", decisions_per_request=3.0)
    monkeypatch.setitem(POINTS, "shed", point)
    registry.registered("prefill")  # every baseline registered before the copy (a load into it would be lost after)
    monkeypatch.setattr(registry, "_REGISTRY", {k: dict(v) for k, v in registry._REGISTRY.items()})
    registry.register("shed", "none")(NoShedding)
    registry.register("shed", "oldest")(ShedOldest)
    WOKEN.clear()
    yield point
    gym.registry.pop(TOY_ENV, None)


def small():
    return load_scenario("decode_tier_n8", ["workload.num_requests=200", "workload.rate=800"]).sim


def test_the_engine_takes_a_new_point_from_the_table(toy_point):
    base = Simulator(small(), None, seed=0)
    assert isinstance(base.policies["shed"], NoShedding)  # the default, built when no policy is given
    base.run()
    assert not WOKEN  # no timer of the point's policy, no wake-up

    pol = registry.make_policy("shed", {"name": "oldest", "period": 0.05, "times": 8})
    sim = Simulator(small(), {"shed": pol}, seed=0)
    assert sim.run()
    assert pol.resets == 1
    assert [tag for _, tag in pol.fired] == list(range(1, 9))
    assert np.allclose([t for t, _ in pol.fired], 0.05 * np.arange(1, 9))
    assert [t for t, _ in pol.fired] == WOKEN  # the point's wake-up after each of its timers
    req = sim.req
    shed = sorted(pol.shed)
    assert shed and np.flatnonzero(req.reason == reason_code("policy")).tolist() == shed  # its actions, nothing else
    # every other request ends as without the shedder (the pool of this cluster fits: nothing else is rejected)
    others = np.setdiff1d(np.arange(req.n), shed)
    assert (req.state[others] == base.req.state[others]).all() and not base.req.reason.any()

    with pytest.raises(ConfigError, match="policies.shed: object is not a LoadShedder"):
        Simulator(small(), {"shed": object()}, seed=0)
    with pytest.raises(ConfigError, match=r"policies\.decode: ShedOldest is not a DecodeRouter"):
        Simulator(small(), {"decode": ShedOldest()}, seed=0)


def test_the_registry_and_the_envs_take_a_new_point_from_the_table(toy_point):
    assert registry.registered("shed") == ["none", "oldest"]
    with pytest.raises(TypeError, match="must subclass LoadShedder"):
        registry.register("shed", "bad")(object)
    with pytest.raises(ConfigError, match=r"policy\.shed\.name: unknown 'x'; allowed: none, oldest"):
        registry.make_policy("shed", "x")
    register_envs()
    spec = gym.spec(TOY_ENV)
    assert spec.entry_point == f"{__name__}:ToyEnv" and spec.max_episode_steps == 7
    env = gym.make(TOY_ENV, disable_env_checker=True)
    assert isinstance(env.unwrapped, ToyEnv)
    assert DECISIONS_PER_REQUEST["shed"] == 3.0 and "shed" in DECISIONS_PER_REQUEST  # an agent's budget, from the table


def test_the_documented_steps_name_files_that_exist():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    steps = doc[doc.index("Adding a decision point"):doc.index("## Agents and evaluation")]
    assert re.findall(r"^(\d)\. ", steps, re.M) == ["1", "2", "3", "4", "5"]
    paths = set(re.findall(r"`((?:envs|baselines|conf)/[\w/]+\.(?:py|yaml))`", steps))
    assert {"envs/sim/policy.py", "envs/sim/points.py", "conf/config.yaml"} <= paths
    for rel in paths:
        assert (ROOT / rel).exists(), rel
    for name in ("prefill.py", "decode.py", "colocated.py", "engine.py", "view.py", "events.py"):
        assert f"`{name}`" in steps and (ROOT / "envs" / "sim" / name).exists()
    assert "HANDLERS" in steps and "wake-up" in steps and "entry point" in steps and "episode limit" in steps


def test_the_golden_test_takes_a_new_point_from_the_table(toy_point, tmp_path):
    """Step 4's golden case: the point's conf folder and its golden scenario (tests/golden/points.json) are all the
    golden test needs; its case list and its per-point check follow POINTS (no list of the three points)."""
    import json
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import test_golden as G
    finally:
        sys.path.remove(str(ROOT / "tests"))
    conf = tmp_path / "conf"
    (conf / "policy" / "shed").mkdir(parents=True)  # a temporary conf folder: the real points' configs and the toy's
    for point in POINTS:
        if point != "shed":
            (conf / "policy" / point).symlink_to(ROOT / "conf" / "policy" / point)
    for name in ("none", "oldest"):
        (conf / "policy" / "shed" / f"{name}.yaml").write_text(f"name: {name}\n")
    table = tmp_path / "points.json"
    golden = json.loads(G.POINT_GOLDEN.read_text())
    table.write_text(json.dumps(golden))
    without = G.point_scenarios(POINTS, table)
    assert sorted(without) != sorted(POINTS)  # the golden test's per-point check fails: the toy has no scenario yet
    table.write_text(json.dumps({**golden, "shed": {"scenario": "decode_tier_n8", "sim": {"workload": {"num_requests": 50}}}}))
    with_toy = G.point_scenarios(POINTS, table)
    assert sorted(with_toy) == sorted(POINTS)
    got = G.cases(with_toy, conf)
    assert got["shed-oldest"] == ("decode_tier_n8", ("policy/shed=oldest",), {"workload": {"num_requests": 50}})
    assert {k for k in got if k.startswith("shed-")} == {"shed-none", "shed-oldest"}
    assert {k: v for k, v in got.items() if not k.startswith("shed-")} == G.ALL  # the real cases, untouched
