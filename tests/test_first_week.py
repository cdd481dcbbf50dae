"""First-week details (issue 27, item 9), each checked against what the simulator did or what a user sees:
pdgym-enjoy says the action taken at each decision, the Python API's errors name the key and what is allowed,
gym.make's defaults do not warn about themselves, pdgym's warnings are one line, a board plot says when an
axis is the same for every policy, and a profile table measured for another model or hardware is refused."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401 - registers the envs
import pytest

ROUTE = re.compile(r"route req (\d+) .*-> (?:worker (\d+)|prefill (\d+) unit (\d+))")
SMALL = ["workload.num_requests=40"]


def _play(env, pick, steps: int = 40) -> list[tuple[str, int | None, tuple]]:
    """(description, request it names, where the request went after the step) for `steps` decisions."""
    u = env.unwrapped
    env.reset(seed=0)
    out = []
    for _ in range(steps):
        mask = np.asarray(u.action_masks(), dtype=bool)
        a = pick(u, mask)
        text = u.describe_action(a, mask)
        m = ROUTE.search(text)
        rid = int(m.group(1)) if m else None
        _, _, term, trunc, _ = env.step(a)
        req = u.sim.req
        where = (int(req.worker[rid]),) if m and m.group(2) else (int(req.prefill_inst[rid]), int(req.prefill_dp[rid])) \
            if m else ()
        out.append((text, m, where))
        if term or trunc:
            break
    return out


def _last_allowed(u, mask):
    return int(np.flatnonzero(mask)[-1])


def _first_allowed(u, mask):
    return int(np.flatnonzero(mask)[0])


@pytest.mark.parametrize("kwargs", [{}, {"action": "pick"}])
def test_decode_decisions_name_the_request_and_the_worker_it_went_to(kwargs):
    env = gym.make("pdgym/DecodeRouting-v0", scenario="decode_tier_n8", overrides=SMALL, **kwargs)
    seen = _play(env, _first_allowed)
    routed = [(m, where) for _, m, where in seen if m]
    assert routed, [t for t, _, _ in seen]
    for m, where in routed:  # the worker the line names is the worker the simulator admitted the request to
        assert where == (int(m.group(2)),)


def test_decode_skip_and_end_are_said_in_words():
    env = gym.make("pdgym/DecodeRouting-v0", scenario="decode_tier_n8", overrides=SMALL)
    u = env.unwrapped
    env.reset(seed=0)
    core = u.core
    assert u.describe_action(core.end).startswith("route req ")  # END is masked (nothing runs): the default, said so
    assert "(invalid action 8: the default instead)" in u.describe_action(core.end)
    while not u.action_masks()[core.end + 1]:
        env.step(_first_allowed(u, u.action_masks()))
    assert u.describe_action(core.end + 1).startswith(f"SKIP req {core.head} ")
    assert u.describe_action(core.end).startswith("END (no more admissions to decode 0")


@pytest.mark.parametrize("mode", ["allocation", "route"])
def test_prefill_decisions_name_the_request_and_the_unit_it_went_to(mode):
    kw = {"scenario": "prefix_single"} if mode == "route" else {}
    env = gym.make("pdgym/PrefillDispatch-v0", mode=mode, overrides=SMALL, **kw)
    seen = _play(env, _last_allowed if mode == "route" else
                 (lambda u, mask: int(np.flatnonzero(mask[1:-1])[0]) + 1 if mask[1:-1].any() else 0))
    routed = [(m, where) for _, m, where in seen if m]
    assert routed, [t for t, _, _ in seen]
    for m, where in routed:
        assert where == (int(m.group(3)), int(m.group(4)))


def test_prefill_timing_and_composition_say_what_is_released():
    env = gym.make("pdgym/PrefillDispatch-v0", overrides=SMALL)
    u = env.unwrapped
    env.reset(seed=0)
    nb = len(u.sim.buffer)
    assert u.describe_action(0) == f"hold ({nb} requests buffered)"
    assert u.describe_action(1) == f"release the buffer ({nb} requests) -> prefill 0"
    env = gym.make("pdgym/PrefillDispatch-v0", mode="composition", overrides=SMALL)
    u = env.unwrapped
    env.reset(seed=0)
    work, med = u.sim.req.work, u.core.classes.median
    short = sum(int(work[r] <= med) for r in u.sim.buffer)
    mask = u.action_masks()
    if mask[1]:
        assert f"short half (<= {med:.0f} tok: {short} of {len(u.sim.buffer)} requests)" in u.describe_action(1)
    assert u.describe_action(0).startswith(f"release the whole buffer ({len(u.sim.buffer)} requests) -> prefill ")


@pytest.mark.parametrize("kwargs,expect", [({"mode": "phase"}, r"colocated 0 unit \d+: run a (prefill|decode|mixed) batch"),
                                           ({"mode": "threshold"}, r"colocated 0 unit \d+: EB, theta = 0\.\d+"),
                                           ({"mode": "threshold", "continuous": True, "choose_mode": True},
                                            r"colocated 0 unit \d+: (EB|MB for the cycle), theta = 0\.\d+")])
def test_batching_decisions_name_the_unit_and_the_batch(kwargs, expect):
    env = gym.make("pdgym/PhaseBatching-v0", overrides=["workload.num_requests=20", "workload.concurrency=8"], **kwargs)
    u = env.unwrapped
    env.reset(seed=0)
    a = u.default_action()
    text = u.describe_action(a)
    assert re.fullmatch(expect, text), text
    if not kwargs.get("continuous"):
        assert str(u._unit) in text
