"""Golden episodes of the envs, one case or more per formulation: what an agent sees, may do and earns must not
change by accident.

Each formulation is played under its own id (envs/specs.py; the digests were recorded under the point's id
with the formulation's options, so they also prove the ids are those envs). Each case plays a seeded random
agent (uniform over the allowed actions) for STEPS steps and reduces
every observation, action mask, reward and end flag to one SHA-256 digest, committed in
tests/golden/env_digests.json. An env refactor (a faster observation, an incremental pool order)
keeps every digest; a commit that changes an env on purpose regenerates them and says why:

    PDGYM_UPDATE_GOLDEN=1 python -m pytest tests/test_env_golden.py
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the envs)
import pytest
from test_golden import UPDATE, load, match_or_record  # the digest-file helpers

GOLDEN = Path(__file__).parent / "golden" / "env_digests.json"
STEPS = 400
DECODE = {"scenario": "decode_tier_n8", "overrides": ["workload.num_requests=300", "workload.rate=400"]}
TIGHT = {"scenario": "decode_tier_n8", "overrides": ["workload.num_requests=300", "workload.rate=400",
                                                     "cluster.decode.kv_capacity_tokens=16000"]}
CASES = {
    "decode_length": ("pdgym/DecodeRouting-v0", {**DECODE, "order": "length"}),
    "decode_arrival": ("pdgym/DecodeRouting-v0", {**DECODE, "order": "arrival"}),
    "decode_memo_features": ("pdgym/DecodeRouting-v0", {**DECODE, "horizon_features": "memo"}),
    # KV so tight that pool requests often fit no worker: the walk passes over them
    "decode_tight_kv_length": ("pdgym/DecodeRouting-v0", {**TIGHT, "order": "length"}),
    "decode_tight_kv_arrival": ("pdgym/DecodeRouting-v0", {**TIGHT, "order": "arrival"}),
    "prefill_timing": ("pdgym/PrefillDispatch-v0", {"overrides": ["workload.num_requests=150", "workload.rate=150"]}),
    "prefill_allocation": ("pdgym/PrefillAllocation-v0", {"overrides": ["workload.num_requests=150", "workload.rate=150"]}),
    # route mode on the prefix-cache board scenario, 150 trace rows from a warm point of the Mooncake trace (rate pinned)
    "prefill_route": ("pdgym/PrefillRoute-v0", {"scenario": "prefix_mooncake",
                                                   "overrides": ["workload.num_requests=150", "workload.trace_offset=4000",
                                                                 "workload.rate=8.5"]}),
    "batching_phase": ("pdgym/PhaseBatching-v0", {"overrides": ["workload.num_requests=60", "workload.concurrency=32"]}),
    "batching_threshold": ("pdgym/BatchingThreshold-v0", {"overrides": ["workload.num_requests=60",
                                                                        "workload.concurrency=32"]}),
    # SBS times the releases, the agent composes each (whole buffer, short half, long half)
    "prefill_composition": ("pdgym/PrefillComposition-v0", {"overrides": ["workload.num_requests=150",
                                                                          "workload.rate=150"]}),
    # the env names the worker, the agent picks its requests (envs/decode_pick.py)
    "decode_pick": ("pdgym/DecodePick-v0", DECODE),
    "decode_tight_kv_pick": ("pdgym/DecodePick-v0", TIGHT),
    # a Box action (theta, and MB or EB): the random agent draws it uniformly in the box
    "batching_continuous": ("pdgym/BatchingThresholdContinuous-v0", {"overrides": ["workload.num_requests=60",
                                                                                   "workload.concurrency=32"],
                                                                     "choose_mode": True}),
}


def play(env_id: str, kwargs: dict) -> dict:
    env = gym.make(env_id, disable_env_checker=True, **kwargs)
    rng = np.random.default_rng(0)
    h = hashlib.sha256()
    obs, _ = env.reset(seed=3)
    episodes, reward = 1, 0.0
    for _ in range(STEPS):
        mask = env.unwrapped.action_masks()
        h.update(np.asarray(obs, dtype=np.float32).tobytes())
        h.update(np.asarray(mask, dtype=bool).tobytes())
        if isinstance(env.action_space, gym.spaces.Box):
            space = env.action_space
            action = rng.uniform(space.low, space.high).astype(space.dtype)
            h.update(action.tobytes())
        else:
            action = int(rng.choice(np.flatnonzero(mask)))
        obs, r, term, trunc, _ = env.step(action)
        h.update(f"{float(r)!r} {bool(term)} {bool(trunc)}".encode())
        reward += float(r)
        if term or trunc:
            obs, _ = env.reset()
            episodes += 1
    env.close()
    return {"digest": h.hexdigest(), "episodes": episodes, "reward": round(reward, 9)}


def test_every_case_has_a_golden_entry():
    if UPDATE:
        pytest.skip("updating")
    assert sorted(load(GOLDEN)) == sorted(CASES), "regenerate: PDGYM_UPDATE_GOLDEN=1 python -m pytest tests/test_env_golden.py"


@pytest.mark.parametrize("case", sorted(CASES))
def test_env_golden(case):
    match_or_record(GOLDEN, case, play(*CASES[case]), "the env's observations, masks or rewards changed "
                    "(regenerate and say why)")
