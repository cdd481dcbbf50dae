"""One Gymnasium id per formulation (envs/specs.py): registered at its point's env, every formulation covered, the
point's own id with another formulation's options an alias that warns, contradicting options refused."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pdgym.envs  # noqa: F401  (registers the envs)
import pytest
from pdgym.envs import decode_routing, phase_batching, prefill_dispatch
from pdgym.envs.sim import ConfigError
from pdgym.envs.sim.notices import EnvWarning
from pdgym.envs.sim.points import POINTS
from pdgym.envs.specs import SPECS, formulation

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
    choices = {("prefill", "mode", m) for m in prefill_dispatch.MODES}
    choices |= {("decode", "action", a) for a in decode_routing.ACTIONS}
    choices |= {("batching", "mode", m) for m in phase_batching.MODES}
    for point, key, value in choices:
        s = formulation(point, {key: value})
        assert s is not None and s.point == point
        assert s.options.get(key, value) == value
        assert s.options or s.id == POINTS[point].env_id  # the default formulation is the point's own id
    assert formulation("batching", {"mode": "threshold", "continuous": True}).id == "pdgym/BatchingThresholdContinuous-v0"


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
