"""Agents: extractor invariance, statistics, held-out splits, pdgym-eval, training of every algorithm,
behaviour cloning, determinism, resume, wandb offline and a 2-job joblib multirun. Kept small: a few
hundred environment steps on a few hundred requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
from gymnasium import spaces
from pdgym.agents.evaluation import evaluate as E
from pdgym.agents.training import imitation
from pdgym.agents.training.features import SlotSetExtractor, policy_kwargs
from pdgym.agents.training.train import train_from_overrides
from pdgym.envs.sim.config import ConfigError

ENV = "decode_routing"
# An untrained router can spend a whole pool of SKIPs per step or admit one request at a time: no SKIP
# action and a horizon keep its evaluation cheap.
TINY = ["env=" + ENV, 'env.overrides=["workload.num_requests=120","max_sim_time_s=8"]', "+env.kwargs.skip=false",
        "total_timesteps=256", "n_envs=2", "eval.freq=0", "eval.seeds=[0]", "checkpoint_freq=128",
        "wandb.mode=disabled", "progress=false", "max_segments=2"]
SMALL_PPO = ["agent.kwargs.n_steps=64", "agent.kwargs.batch_size=64", "agent.kwargs.n_epochs=2"]
ALGO_ARGS = {"maskable_ppo": SMALL_PPO, "ppo": SMALL_PPO, "a2c": ["agent.kwargs.n_steps=8"],
             "dqn": ["agent.kwargs.learning_starts=64", "agent.kwargs.buffer_size=1000"]}
ENV_VARS = dict(os.environ, WANDB_MODE="disabled")


def cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env=ENV_VARS)


# --------------------------------------------------------------------------- extractor
def test_set_extractor_is_permutation_invariant_and_ignores_padding():
    n, d, g = 6, 3, 2
    space = spaces.Box(-np.inf, np.inf, (g + n * d,), np.float32)
    torch.manual_seed(0)
    ex = SlotSetExtractor(space, n_slots=n, per_slot_dim=d, global_dim=g, mask_index=2, attention_heads=2,
                          slot_hidden=(8, 8), global_hidden=(4,), keep_slots=True)
    slots = torch.rand(1, n, d)
    slots[:, :, 2] = 1.0
    slots[:, 4:, :] = 0.0  # two padding slots
    glob = torch.rand(1, g)
    out = ex(torch.cat([glob, slots.flatten(1)], 1))
    perm = torch.tensor([3, 1, 0, 2, 4, 5])
    out_p = ex(torch.cat([glob, slots[:, perm].flatten(1)], 1))
    pooled = 2 * 8 + 4
    assert torch.allclose(out[:, :pooled], out_p[:, :pooled], atol=1e-5)
    rows, rows_p = out[:, pooled:].reshape(n, 8), out_p[:, pooled:].reshape(n, 8)
    assert torch.allclose(rows[perm], rows_p, atol=1e-5)  # per-slot embeddings are equivariant
    junk = slots.clone()
    junk[:, 5, :2] = 9.0  # garbage in a padding row (flag 0) changes nothing pooled
    out_j = ex(torch.cat([glob, junk.flatten(1)], 1))
    assert torch.allclose(out[:, :pooled], out_j[:, :pooled], atol=1e-5)


def test_pointer_logits_follow_the_workers():
    from pdgym.agents.training.features import SlotPointerExtractor

    n, d, g = 5, 3, 2
    space = spaces.Box(-np.inf, np.inf, (g + n * d,), np.float32)
    torch.manual_seed(0)
    ex = SlotPointerExtractor(space, n_actions=n + 2, n_slots=n, per_slot_dim=d, global_dim=g, mask_index=0)
    slots = torch.rand(1, n, d)
    slots[:, :, 0] = 1.0
    glob = torch.rand(1, g)
    out = ex(torch.cat([glob, slots.flatten(1)], 1))
    perm = torch.tensor([4, 2, 0, 1, 3])
    out_p = ex(torch.cat([glob, slots[:, perm].flatten(1)], 1))
    assert out.shape[1] == ex.features_dim
    assert torch.allclose(out[0, :n][perm], out_p[0, :n], atol=1e-5)  # worker scores move with the workers
    assert torch.allclose(out[0, n:], out_p[0, n:], atol=1e-5)  # END / SKIP logits and context do not


def test_extractor_layout_errors_are_one_line():
    space = spaces.Box(0, 1, (10,), np.float32)
    with pytest.raises(ConfigError, match="n_slots \\* per_slot_dim"):
        SlotSetExtractor(space, n_slots=3, per_slot_dim=3, global_dim=2)
    with pytest.raises(ConfigError, match="agent.features.kind"):
        policy_kwargs({"kind": "graph"}, [64])
    with pytest.raises(ConfigError, match="n_slots"):
        policy_kwargs({"kind": "set"}, [64])


# --------------------------------------------------------------------------- statistics and splits
def test_interval_is_a_bootstrap_interval_inside_the_values():
    s = E.interval([1.0, 2.0, 3.0, float("nan")])
    assert s["n"] == 3 and s["mean"] == pytest.approx(2.0) and s["std"] == pytest.approx(1.0)
    assert 1.0 <= s["ci_low"] < 2.0 < s["ci_high"] <= 3.0
    one = E.interval([5.0])
    assert one["ci_low"] == one["ci_high"] == 5.0


def test_splits_replay_disjoint_trace_rows():
    splits = E.default_splits()
    wl = {"trace": "azure_conv", "num_requests": 1000}
    used = {}
    for name, sp in splits.items():
        rows = set()
        for i in range(6):
            seg = E.segment(wl, sp, i)
            rows |= set(range(seg["trace_offset"], seg["trace_offset"] + seg["num_requests"]))
        used[name] = rows
    assert not used["train"] & used["test"] and not used["train"] & used["val"] and not used["val"] & used["test"]
    assert E.segment({"trace": None, "num_requests": 5}, splits["test"], 3) == {}
    assert E.split_seed(splits["test"], 2) == 2 and E.split_seed(splits["train"], 2) == 1002


# --------------------------------------------------------------------------- pdgym-eval
def test_eval_cli_writes_metrics_with_intervals_and_requests(tmp_path):
    r = cli("pdgym.agents.evaluation.evaluate", "policy=least_kv", "point=decode", "scenario=decode_tier_n16", "seeds=[0,1]",
            "workload.num_requests=150", "progress=false", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["kind"] == "baseline" and doc["seeds"] == [0, 1] and doc["point"] == "decode"
    m = doc["metrics"]["imbalance_mean"]
    assert m["ci_low"] <= m["mean"] <= m["ci_high"] and len(m["per_seed"]) == 2
    assert set(doc["per_seed"]) == {"0", "1"} and "tpot_p99" in doc["per_seed"]["0"]
    req = pd.read_csv(tmp_path / "requests.csv")
    assert len(req) == 300 and set(req.seed) == {0, 1}
    # the test split replays different trace rows per seed: the two seeds see different prompts
    assert not np.array_equal(req[req.seed == 0].prompt.to_numpy(), req[req.seed == 1].prompt.to_numpy())


def test_eval_cli_bad_policy_is_one_line(tmp_path):
    r = cli("pdgym.agents.evaluation.evaluate", "policy=no_such_router", "scenario=decode_tier_n16", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no_such_router" in r.stderr


# --------------------------------------------------------------------------- training
@pytest.mark.parametrize("algo", ["maskable_ppo", "ppo", "a2c", "dqn"])
def test_each_algorithm_trains_and_evaluates_through_simulate(tmp_path, algo):
    s = train_from_overrides([*TINY, f"agent={algo}", *ALGO_ARGS[algo]], tmp_path / algo)
    run = tmp_path / algo
    assert s["timesteps"] >= 256 and s["algo"] == algo
    for f in ("final_model.zip", "best_model.zip", "agent.json", "config.yaml", "metrics.json", "eval_history.csv"):
        assert (run / f).is_file(), f
    assert list((run / "tb").iterdir()), "no TensorBoard events"
    cand = E.resolve(str(run))
    assert cand.kind == "agent" and cand.point == "decode"
    from pdgym.envs.scenario import load_scenario

    raw = load_scenario("decode_tier_n16", ["workload.num_requests=100", "max_sim_time_s=8"]).raw
    ev = E.evaluate(raw, cand, [0], E.default_splits()["test"])
    assert ev.per_seed[0]["finished"] + ev.per_seed[0]["rejected"] == 100


def test_same_seed_same_metrics(tmp_path):
    args = [*TINY, "agent=maskable_ppo", *SMALL_PPO, "seed=1"]
    a = train_from_overrides(args, tmp_path / "a")
    b = train_from_overrides(args, tmp_path / "b")
    a["val_final"].pop("wall_time_s")
    b["val_final"].pop("wall_time_s")
    assert a["val_final"] == b["val_final"]
    ha = pd.read_csv(tmp_path / "a/progress.csv")
    hb = pd.read_csv(tmp_path / "b/progress.csv")
    cols = [c for c in ha.columns if c.startswith("train/") and "fps" not in c]
    pd.testing.assert_frame_equal(ha[cols], hb[cols])


def test_resume_continues_from_the_last_checkpoint(tmp_path):
    args = [*TINY, "agent=maskable_ppo", *SMALL_PPO]
    first = train_from_overrides(args, tmp_path)
    assert first["resumed_from"] is None
    second = train_from_overrides([*args, "total_timesteps=512"], tmp_path)
    assert second["resumed_from"] and second["timesteps"] >= 512


def test_wandb_offline_run_is_written(tmp_path):
    env = dict(os.environ)
    os.environ.pop("WANDB_MODE", None)
    try:
        train_from_overrides([*TINY, "agent=a2c", *ALGO_ARGS["a2c"], "wandb.mode=offline", "total_timesteps=64"],
                             tmp_path)
    finally:
        os.environ.clear()
        os.environ.update(env)
    assert list((tmp_path / "wandb").glob("offline-run-*"))


# --------------------------------------------------------------------------- behaviour cloning
class _ArgmaxEnv(gym.Env):
    """Observation: 4 scores + a mask flag per slot; the teacher picks the best unmasked slot."""

    def __init__(self):
        self.observation_space = spaces.Box(0, 1, (8,), np.float32)
        self.action_space = spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._new(), {}

    def _new(self):
        self.x = self.np_random.random(4).astype(np.float32)
        self.m = self.np_random.random(4) > 0.3
        self.m[self.np_random.integers(4)] = True
        return np.concatenate([self.x, self.m.astype(np.float32)])

    def action_masks(self):
        return self.m.copy()

    def teacher_action(self, teacher):
        return int(np.argmax(np.where(self.m, self.x, -1)))

    def step(self, a):
        self.t += 1
        r = float(self.x[a])
        return self._new(), r, self.t >= 200, False, {}


def test_behaviour_cloning_learns_the_teacher():
    from sb3_contrib import MaskablePPO

    data = imitation.collect(_ArgmaxEnv, "least_kv", "decode", episodes=10, max_steps=2000, gamma=0.9, seed=0)
    assert data["obs"].shape == (2000, 8) and data["mask"][np.arange(2000), data["act"]].all()
    model = MaskablePPO("MlpPolicy", _ArgmaxEnv(), seed=0, device="cpu",
                        policy_kwargs={"net_arch": [64, 64]})
    stats = imitation.fit(model, data, epochs=30, batch_size=128, lr=3e-3, value_coef=0.5, seed=0)
    assert stats["val_accuracy"] > 0.85, stats


def test_bc_warm_start_through_the_routing_env(tmp_path):
    s = train_from_overrides([*TINY, "agent=bc_maskable_ppo", *SMALL_PPO, "agent.bc.teacher=br0",
                              "agent.bc.episodes=1", "agent.bc.max_steps=400", "agent.bc.epochs=5",
                              "total_timesteps=128"], tmp_path)
    assert s["bc"]["samples"] > 0 and s["bc"]["teacher"] == "br0"
    assert (tmp_path / "bc.json").is_file()


def test_bad_agent_config_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="agent.algo"):
        train_from_overrides([*TINY, "agent.algo=sac"], tmp_path)
    with pytest.raises(ConfigError, match="agent.bc.teacher"):
        train_from_overrides([*TINY, "agent=dqn", "agent.bc.teacher=br0"], tmp_path)


# --------------------------------------------------------------------------- multirun
def test_joblib_multirun_runs_two_jobs(tmp_path):
    r = cli("pdgym.agents.training.train", "-m", "hydra/launcher=joblib_local", "seed=0,1", "agent=a2c",
            *ALGO_ARGS["a2c"], *[a for a in TINY if not a.startswith("total")], "total_timesteps=32",
            f"hydra.sweep.dir={tmp_path}", timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = sorted(tmp_path.glob("*/metrics.json"))
    assert len(runs) == 2
    assert {json.loads(p.read_text())["name"] for p in runs} == {f"{ENV}_a2c_s0", f"{ENV}_a2c_s1"}
