"""The contract all three envs share (envs/base.py): checkers, the invalid-action rule, stalls, seeded
trace windows, registered truncation, rendering, action meanings and obs_layout."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the envs)
import pytest
from gymnasium.utils.env_checker import check_env
from pdgym.envs.decode_routing import N_GLOBAL, N_WORKER
from pdgym.envs.decode_routing import AgentPolicy as DecodeAgent
from pdgym.envs.scenario import trace_splits
from pdgym.envs.sim import ConfigError, simulate
from pdgym.envs.sim.points import POINTS

DOWN = ["+faults.down=[{instance: 2, at: 0.0}]", "faults.detect_s=0.0"]  # instance 2 masked throughout
SMALL = {
    "prefill": ("pdgym/PrefillDispatch-v0", {"overrides": ["workload.num_requests=80", "workload.rate=150", *DOWN]}),
    "allocation": ("pdgym/PrefillDispatch-v0", {"overrides": ["workload.num_requests=80", "workload.rate=150", *DOWN],
                                                "mode": "allocation"}),
    "decode": ("pdgym/DecodeRouting-v0", {"scenario": "decode_tier_n8",
                                          "overrides": ["workload.num_requests=120", "workload.rate=400",
                                                        "cluster.decode.batch_limit=4"]}),
    "phase": ("pdgym/PhaseBatching-v0", {"overrides": ["workload.num_requests=60", "workload.concurrency=32"],
                                         "skip_forced": False}),
    "threshold": ("pdgym/PhaseBatching-v0", {"overrides": ["workload.num_requests=60", "workload.concurrency=32"],
                                             "mode": "threshold", "choose_mode": True}),
    "continuous": ("pdgym/PhaseBatching-v0", {"overrides": ["workload.num_requests=60", "workload.concurrency=32"],
                                              "mode": "threshold", "continuous": True, "choose_mode": True}),
}


def make(name, **kw):
    env_id, base = SMALL[name]
    return gym.make(env_id, disable_env_checker=True, **base, **kw).unwrapped


def state(env):
    """What the agent sees plus the simulator's progress (to compare two envs step by step)."""
    s = env.sim
    return (env._observe().tobytes(), env.action_masks().tobytes(), s.now, s.tokens_out, s.n_resolved)


@pytest.mark.parametrize("name", ["prefill", "decode", "phase"])
def test_gymnasium_checker_passes_with_both_render_modes(name):
    env = make(name, render_mode="ansi")
    check_env(env)  # also makes the env in every declared render mode through its spec and renders it
    assert env.metadata["render_modes"] == ["ansi", "rgb_array"]


def bad_actions(env):
    """Actions that are not members of the action space, and "masked": one the mask forbids now, if any."""
    space = env.action_space
    if isinstance(space, gym.spaces.Box):
        return [np.full(space.shape, 2.0), np.full(space.shape, np.nan), np.zeros(space.shape[0] + 1), "x"]
    return ["masked", -1, space.n, 10**9, 0.5, np.float32(1.0), np.array([0]), "masked"]


@pytest.mark.parametrize("name", list(SMALL))
def test_one_invalid_action_rule_for_every_env(name):
    """An invalid action does exactly what default_action() does, is counted, and never raises."""
    env, ref = make(name), make(name)
    env.reset(seed=3)
    ref.reset(seed=3)
    env.action_space.seed(3)  # the valid Box actions below are sampled: the same ones every run
    count, checked_masked = 0, False
    for k in range(12):
        for a in bad_actions(env):
            if isinstance(a, str) and a == "masked":
                masked = np.flatnonzero(~env.action_masks())
                if not len(masked):
                    continue
                a, checked_masked = int(masked[0]), True
            default = ref.default_action()
            assert env.action_space.contains(default) if not isinstance(default, np.ndarray) else \
                env.action_space.contains(default.astype(np.float32))
            _, r1, t1, tr1, info = env.step(a)
            _, r2, t2, tr2, _ = ref.step(default)
            count += 1
            assert info["invalid_actions"] == count
            assert (r1, t1, tr1) == (r2, t2, tr2) and state(env) == state(ref)
            if t1 or tr1:
                break
        if t1 or tr1:
            break
        valid = np.flatnonzero(env.action_masks())
        a = env.action_space.sample() if isinstance(env.action_space, gym.spaces.Box) else int(valid[k % len(valid)])
        _, _, t1, tr1, info = env.step(a)
        ref.step(a)
        assert info["invalid_actions"] == count  # a valid action is not counted
        if t1 or tr1:  # a valid action may end the episode too (a stall end in threshold mode)
            break
    assert count >= 4
    if name not in ("threshold", "continuous"):  # threshold mode masks nothing: every theta is allowed
        assert checked_masked  # a masked action was among those tried


def test_agent_policy_follows_the_same_rule():
    """Through simulate(), a predict() that always answers 10**9 runs exactly like one that picks the
    default action itself (END when allowed, else the least-loaded worker that fits); only the first
    counts invalid actions."""
    kw = {"scenario": "decode_tier_n8", "overrides": ["workload.num_requests=30", "workload.rate=100"]}
    cfg = gym.make("pdgym/DecodeRouting-v0", disable_env_checker=True, **kw).unwrapped.sim_config

    def default(obs, mask):
        load = obs[N_GLOBAL:].reshape(8, N_WORKER)[:, 1]
        return 8 if mask[8] else int(np.argmin(np.where(mask[:8], load, np.inf)))

    bad, good = DecodeAgent(lambda obs, mask: 10**9, **kw), DecodeAgent(default, **kw)
    a = simulate(cfg, {"decode": bad}, seed=1).requests
    b = simulate(cfg, {"decode": good}, seed=1).requests
    assert a[["worker", "finish"]].equals(b[["worker", "finish"]])
    assert bad.invalid_actions > 30 and good.invalid_actions == 0


def test_an_agent_that_always_holds_ends_its_episode_by_stall():
    env = make("prefill", stall_s=5.0)
    env.reset(seed=0)
    for n in range(100_000):  # noqa: B007
        _, _, term, trunc, info = env.step(0)
        if term or trunc:
            break
    assert trunc and not term and info["stalled"]
    assert "summary" in info and info["summary"]["finished"] == 0
    # quiet for stall_s: ticks every tick_s with nothing released, so about stall_s / tick_s decisions
    assert 5.0 / 0.02 <= n + 1 <= 2 * 5.0 / 0.02 + 200
    with pytest.raises(RuntimeError, match="ended"):
        env.step(0)


@pytest.mark.parametrize("name", ["prefill", "decode", "phase"])
def test_a_working_agent_is_never_taken_for_a_stall(name):
    env = make(name, stall_s=1.0)
    rng = np.random.default_rng(0)
    env.reset(seed=1)
    while True:
        m = env.action_masks()
        allowed = np.flatnonzero(m)
        act = allowed[allowed > 0] if name == "prefill" and (allowed > 0).any() else allowed
        _, _, term, trunc, info = env.step(int(rng.choice(act)))
        if term or trunc:
            break
    assert term and not trunc and not info["stalled"]
    s = info["summary"]
    assert s["finished"] + s["rejected"] == env.sim.req.n


def test_reset_seeds_vary_trace_windows_within_the_split():
    env = make("decode")
    lo_frac, hi_frac = trace_splits()["train"]["trace_from"], trace_splits()["train"]["trace_to"]
    total = 19366  # rows of azure_conv
    lo, hi = int(lo_frac * total), int(hi_frac * total)

    def episode(seed=None):
        env.reset(seed=seed)
        off = env.sim.cfg.workload.trace_offset
        total_r = 0.0
        while True:
            m = env.action_masks()
            _, r, term, trunc, _ = env.step(int(np.flatnonzero(m)[0]))
            total_r += r
            if term or trunc:
                return off, env.sim.cfg.workload.num_requests, round(total_r, 9)

    a, b, c, d = episode(0), episode(), episode(1), episode(0)
    assert a == d  # the same seed repeats the episode
    assert len({a[0], b[0], c[0]}) == 3 and len({a[2], b[2], c[2]}) == 3  # seeds move the window
    for off, n, _ in (a, b, c):
        assert n == 120 and lo <= off and off + n <= hi  # inside the train rows only

    test = make("decode", trace_split="test")
    t_lo = int(trace_splits()["test"]["trace_from"] * total)
    offs = set()
    for s in range(5):
        test.reset(seed=s)
        offs.add(test.sim.cfg.workload.trace_offset)
    assert min(offs) >= t_lo and len(offs) > 1

    pinned = gym.make("pdgym/DecodeRouting-v0", disable_env_checker=True, scenario="decode_tier_n8",
                      overrides=["workload.num_requests=120", "workload.trace_offset=777"]).unwrapped
    for s in range(3):
        pinned.reset(seed=s)
        assert pinned.sim.cfg.workload.trace_offset == 777


def test_a_split_too_small_for_the_window_warns():
    with pytest.warns(UserWarning, match="every episode replays the same rows"):
        gym.make("pdgym/DecodeRouting-v0", disable_env_checker=True, scenario="decode_tier_n8",
                 overrides=["workload.num_requests=3000"], trace_split="val")


@pytest.mark.parametrize("env_id", [p.env_id for p in POINTS.values()])
def test_max_episode_steps_is_registered_and_truncates(env_id):
    limit = next(p.max_episode_steps for p in POINTS.values() if p.env_id == env_id)
    assert gym.spec(env_id).max_episode_steps == limit >= 1000
    name = {"pdgym/PrefillDispatch-v0": "prefill", "pdgym/DecodeRouting-v0": "decode",
            "pdgym/PhaseBatching-v0": "phase"}[env_id]
    env = gym.make(env_id, max_episode_steps=5, disable_env_checker=True, **SMALL[name][1])
    env.reset(seed=0)
    for k in range(5):
        _, _, term, trunc, info = env.step(int(np.flatnonzero(env.unwrapped.action_masks())[0]))
        assert not term and trunc == (k == 4) and "summary" not in info
    s = env.unwrapped.summary()  # TimeLimit truncates outside the env: the summary is asked for
    assert s["finished"] + s["rejected"] <= env.unwrapped.sim.req.n and "ttft_mean" in s


@pytest.mark.parametrize("name", ["prefill", "decode", "phase"])
def test_render_modes_draw_the_cluster(name):
    env = make(name, render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    group = {"prefill": "prefill 0", "decode": "decode 0", "phase": "colocated 0"}[name]
    assert isinstance(text, str) and group in text and "t = " in text and "allowed" in text
    rgb = make(name, render_mode="rgb_array")
    rgb.reset(seed=0)
    first = rgb.render()
    for _ in range(3):
        rgb.step(int(np.flatnonzero(rgb.action_masks())[-1]))
    second = rgb.render()
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[2] == 3 and first.shape[0] > 100
    assert first.shape == second.shape and not np.array_equal(first, second)  # a fixed frame size; it moves
    assert (first < 128).any() and (first > 200).any()  # drawn, not blank


def test_bad_render_mode_and_options_fail_with_one_line():
    for kw, key in (({"render_mode": "rgb"}, "env.render_mode"), ({"stall_s": 0}, "env.stall_s"),
                    ({"trace_split": "holdout"}, "env.trace_split"), ({"bogus": 1}, "env.bogus")):
        with pytest.raises(ConfigError) as exc, warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*initialised with render_mode")
            make("decode", **kw)
        assert str(exc.value).startswith(key) and "\n" not in str(exc.value)


@pytest.mark.parametrize("name", list(SMALL))
def test_action_meanings_and_obs_layout(name):
    env = make(name)
    names = env.get_action_meanings()
    space = env.action_space
    assert len(names) == (space.n if isinstance(space, gym.spaces.Discrete) else space.shape[0])
    assert len(set(names)) == len(names)
    lay = env.obs_layout
    assert lay["global_dim"] + lay["n_slots"] * lay["per_slot_dim"] == env.observation_space.shape[0]


@pytest.mark.parametrize("kw, msg", [
    ({"overrides": "workload.num_requests=100"}, "env.overrides: got 'workload"),  # a string, not a list
    ({"overrides": 5}, "env.overrides"),
    ({"config": [1, 2]}, "env.config"),
    ({"bogus": 1}, "allowed: action, batching, config, horizon"),  # the env's own keys are named too
])
def test_env_kwargs_of_the_wrong_kind_are_one_line(kw, msg):
    with pytest.raises(ConfigError) as e:
        gym.make("pdgym/DecodeRouting-v0", **kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_a_bad_core_option_is_named_as_the_env_option_it_was_given_as():
    """The prefill env's SBS core checks `window` under policy.prefill.window; given to the env, it is env.window."""
    with pytest.raises(ConfigError, match=r"^env\.window: got 0"):
        gym.make("pdgym/PrefillDispatch-v0", window=0)


def test_a_scenario_that_leaves_no_decision_is_refused_at_reset():
    """md1_single_slot with skip_forced: every phase choice is forced, so the whole run went by inside reset() and
    step() could only refuse; reset says so and what to change. skip_forced=False leaves the decisions."""
    kw = {"scenario": "md1_single_slot", "overrides": ["workload.num_requests=50"]}
    with pytest.raises(ConfigError, match="left the agent no decision.*skip_forced=False"):
        gym.make("pdgym/PhaseBatching-v0", **kw).reset(seed=0)
    env = gym.make("pdgym/PhaseBatching-v0", skip_forced=False, **kw)
    env.reset(seed=0)
    assert env.action_space.contains(env.action_space.sample())


@pytest.mark.parametrize("seed", ["abc", None, -3, 1.5, True])
def test_simulate_refuses_a_seed_that_is_not_a_whole_number(seed):
    from pdgym.envs.scenario import load_scenario

    with pytest.raises(ConfigError, match="^seed: got "):
        simulate(load_scenario("decode_tier_n8", ["workload.num_requests=20"]).sim, seed=seed)
    assert simulate(load_scenario("decode_tier_n8", ["workload.num_requests=20"]).sim, seed=np.int64(2)).metrics()
