"""Agents: extractor invariance, statistics, held-out splits, pdgym-eval, training of every algorithm,
behaviour cloning, determinism, resume, wandb offline and a 2-job joblib multirun. Kept small: a few
hundred environment steps on a few hundred requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
from gymnasium import spaces
from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.metric_keys import METRIC_KEYS
from pdgym.agents.evaluation.runner import evaluate, run_one
from pdgym.agents.evaluation.stats import interval
from pdgym.agents.learned import model_store
from pdgym.agents.learned.extractors import SlotSetExtractor, policy_kwargs
from pdgym.agents.training import imitation
from pdgym.agents.training.train import train_from_overrides
from pdgym.envs.scenario import load_scenario, trace_splits
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.splits import segment, split_seed

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
    from pdgym.agents.learned.extractors import SlotPointerExtractor

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
    s = interval([1.0, 2.0, 3.0, float("nan")])
    assert s["n"] == 3 and s["mean"] == pytest.approx(2.0) and s["std"] == pytest.approx(1.0)
    assert 1.0 <= s["ci_low"] < 2.0 < s["ci_high"] <= 3.0
    one = interval([5.0])
    assert one["ci_low"] == one["ci_high"] == 5.0


def test_splits_replay_disjoint_trace_rows():
    splits = trace_splits()
    wl = {"trace": "azure_conv", "num_requests": 1000}
    used = {}
    for name, sp in splits.items():
        rows = set()
        for i in range(6):
            seg = segment(wl, sp, i)
            rows |= set(range(seg["trace_offset"], seg["trace_offset"] + seg["num_requests"]))
        used[name] = rows
    assert not used["train"] & used["test"] and not used["train"] & used["val"] and not used["val"] & used["test"]
    assert segment({"trace": None, "num_requests": 5}, splits["test"], 3) == {}
    assert split_seed(splits["test"], 2) == 2 and split_seed(splits["train"], 2) == 1002


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


def test_eval_cli_tables_parquet(tmp_path):
    """tables=parquet: the per-request table of every seed as requests.parquet, no CSV beside it."""
    pytest.importorskip("pyarrow")
    r = cli("pdgym.agents.evaluation.evaluate", "policy=least_kv", "point=decode", "scenario=decode_tier_n16",
            "seeds=[0,1]", "workload.num_requests=100", "progress=false", "tables=parquet", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(req) == 200 and set(req.seed) == {0, 1} and not (tmp_path / "requests.csv").exists()
    assert json.loads((tmp_path / "metrics.json").read_text())["seeds"] == [0, 1]


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
    cand = candidates.resolve(str(run))
    assert cand.kind == "agent" and cand.point == "decode"
    from pdgym.envs.scenario import load_scenario

    raw = load_scenario("decode_tier_n16", ["workload.num_requests=100", "max_sim_time_s=8"]).raw
    ev = evaluate(raw, cand, [0], trace_splits()["test"])
    assert ev.per_seed[0]["finished"] + ev.per_seed[0]["rejected"] == 100


def test_progress_past_the_target_is_the_real_count_without_a_percentage():
    """SB3 ends on a whole rollout (6144 steps for 6000 in rollouts of 2 x 256): no "102%" is printed."""
    from types import SimpleNamespace

    from pdgym.agents.training.callbacks import ProgressLog

    log = ProgressLog(6000, 300, "run")
    log.model = SimpleNamespace(n_envs=2, n_steps=256)
    assert log.done(3000) == "step 3000/6000 (50%)" and log.done(6000) == "step 6000/6000 (100%)"
    assert log.done(6144) == "step 6144 (total_timesteps=6000 rounded up to whole rollouts of 512 steps)"
    log.model = SimpleNamespace(n_envs=1)  # off-policy (DQN): no rollout size to name
    assert log.done(300) == "step 300/6000 (5%)" and "%" not in log.done(6010)


def test_held_out_evaluations_run_where_the_policy_changes_and_never_twice_at_the_end(tmp_path):
    # rollouts of 2 x 64 = 128 steps; freq 100 and 300 steps: checks at rollout starts 128 and 256 (the policy
    # of a rollout's start: a check at step 200 would evaluate step 128's policy again), then the end, 384
    # (300 rounded up to whole rollouts), once: before, 100, 200, 300 and 384 (two evaluations of one policy)
    train_from_overrides([*TINY, "agent=maskable_ppo", *SMALL_PPO, "total_timesteps=300", "eval.freq=100"], tmp_path)
    steps = pd.read_csv(tmp_path / "eval_history.csv").timesteps.tolist()
    assert steps == [128, 256, 384]


def test_time_left_counts_the_evaluations_to_come():
    from pdgym.agents.training.callbacks import HeldOutEval

    ev = HeldOutEval(lambda model: {}, 5000, "imbalance_mean", Path("."), None)
    ev.last = 0
    # rollouts of 1024 steps up to 10,240: a check at 5,120, then the final one
    assert ev.left(0, 10240, 1024) == 2 and ev.left(6000, 10240, 1024) == 2
    ev.last = 5120
    assert ev.left(6000, 10240, 1024) == 1 and ev.left(10240, 10240, 1024) == 1
    ev.last = 10240
    assert ev.left(10240, 10240, 1024) == 0
    ev.freq = 0  # no periodic checks: only the final one
    ev.last = 0
    assert ev.left(0, 10240, 1024) == 1


def test_an_evaluation_that_stopped_early_is_never_the_best_model(tmp_path):
    from types import SimpleNamespace

    from pdgym.agents.training import callbacks as C

    stats = {k: {"mean": 1.0} for k in METRIC_KEYS}
    saved = []
    ev = C.HeldOutEval(lambda model: {**stats, C.STOPPED: {0: "stalled: ..."}}, 0, "imbalance_mean", tmp_path,
                       lambda model, path: saved.append(path))
    ev.model = SimpleNamespace(num_timesteps=64, logger=SimpleNamespace(record=lambda *a, **k: None,
                                                                          dump=lambda *a: None))
    ev.run()  # a stalled router's imbalance over the few requests it resolved is tiny: not a best model
    assert not saved and not (tmp_path / "best_metrics.json").exists()
    ev.evaluate_fn = lambda model: {**stats, C.STOPPED: {}}
    ev.run()
    assert saved == [tmp_path / "best_model.zip"]


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


def test_resume_continues_from_the_newest_whole_checkpoint(tmp_path):
    args = [*TINY, "agent=maskable_ppo", *SMALL_PPO]
    first = train_from_overrides(args, tmp_path)
    assert first["resumed_from"] is None
    ckpts = model_store.checkpoints(tmp_path / "checkpoints")
    assert [int(p.stem.split("_")[1]) for p in ckpts] == [128, 256]
    # a checkpoint cut short (a kill during a copy, a full disk) must not block the resume
    data = ckpts[-1].read_bytes()
    ckpts[-1].write_bytes(data[: len(data) // 2])
    saved = model_store.read(ckpts[0])
    weights, fresh = saved["policy"], saved["spec"].build_policy().state_dict()
    second = train_from_overrides([*args, "total_timesteps=512"], tmp_path)
    assert second["resumed_from"] == str(ckpts[0]) and second["timesteps"] >= 512
    # the resumed run started from the checkpoint's weights, not a fresh network: its first update moved
    # them by a small step (learning rate 3e-4), nowhere near a re-initialisation
    policy, _, _ = model_store.load_policy(tmp_path / "final_model.zip")
    k = next(k for k in weights if k.endswith("weight"))
    moved = (policy.state_dict()[k] - weights[k]).abs().mean()
    assert moved < 0.2 * (fresh[k] - weights[k]).abs().mean()


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    """A write that dies half-way leaves the previous file whole and no partial file under the name."""
    path = tmp_path / "model_1.zip"
    model_store.write_atomic(path, {"pdgym_model.json": b'{"format": "x", "members": []}'})
    before = path.read_bytes()

    def dying(self, name, data, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("zipfile.ZipFile.writestr", dying)
    with pytest.raises(KeyboardInterrupt):
        model_store.write_atomic(path, {"a": b"1" * 1000})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model_1.zip"]


def test_resume_with_another_config_stops_before_writing(tmp_path):
    args = [*TINY, "agent=a2c", *ALGO_ARGS["a2c"], "total_timesteps=64"]
    train_from_overrides(args, tmp_path)
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    other = [a if not a.startswith("env.overrides") else 'env.overrides=["workload.num_requests=130","max_sim_time_s=8"]'
             for a in args]
    with pytest.raises(ConfigError, match=r"^resume: .*differs in env\.overrides\b.*another name=") as exc:
        train_from_overrides(other, tmp_path)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"differs in agent\.kwargs\.learning_rate, seed\);"):
        train_from_overrides([*args, "seed=3", "agent.kwargs.learning_rate=0.001"], tmp_path)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
    # starting over in the same folder would mix the two runs' best model, history and checkpoints
    with pytest.raises(ConfigError, match=r"^resume: never, but .* holds an earlier training run \(agent\.json, "
                                          r"checkpoints, .*another name="):
        train_from_overrides([*args, "resume=never"], tmp_path)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
    # budget keys may change: the same experiment continues
    s = train_from_overrides([*args[:-1], "total_timesteps=96", "eval.seeds=[1]"], tmp_path)
    assert s["resumed_from"] and s["timesteps"] >= 96


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


@pytest.mark.parametrize("configured, environment, expected", [
    ("disabled", "offline", "disabled"),  # a config that says disabled starts no wandb under `make test`
    ("online", "offline", "offline"),  # WANDB_MODE=offline can never go online
    ("offline", None, "offline"), ("online", "", "online"), ("offline", "disabled", "disabled")])
def test_wandb_environment_mode_is_a_ceiling(configured, environment, expected):
    from pdgym.agents.training.wandb_utils import effective_mode

    assert effective_mode(configured, environment) == expected


def test_wandb_mode_typo_is_one_line():
    from pdgym.agents.training.wandb_utils import effective_mode

    with pytest.raises(ConfigError, match=r"^WANDB_MODE \(environment\): got 'ofline'; allowed: offline, online, disabled$"):
        effective_mode("offline", "ofline")


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
    """The clone matches the teacher on its held-out tenth (48 decisions) far above what a clone that learned
    nothing reaches: the better of chance among the legal workers and always the teacher's most frequent worker,
    both computed on an independent batch of the teacher's decisions (another seed); the bound is that null's
    binomial 1e-6 upper tail, so a clone at the null fails with probability 1e-6."""
    from scipy.stats import binom

    s = train_from_overrides([*TINY, "agent=bc_maskable_ppo", *SMALL_PPO, "agent.bc.teacher=br0",
                              "agent.bc.episodes=4", "agent.bc.max_steps=480", "agent.bc.epochs=5",
                              "total_timesteps=128"], tmp_path)
    assert s["bc"]["samples"] == 480 and s["bc"]["teacher"] == "br0"
    assert (tmp_path / "bc.json").is_file()

    def make():
        return gym.make("pdgym/DecodeRouting-v0", scenario="decode_tier_n16", skip=False,
                        overrides=["workload.num_requests=120", "max_sim_time_s=8"]).unwrapped

    other = imitation.collect(make, "br0", "decode", episodes=4, max_steps=480, gamma=0.9, seed=999)
    null = max(float(np.mean(1.0 / other["mask"].sum(axis=1))), np.bincount(other["act"]).max() / len(other["act"]))
    n_val = s["bc"]["samples"] // 10
    assert s["bc"]["val_accuracy"] > binom.isf(1e-6, n_val, null) / n_val, (s["bc"], null)


def test_total_timesteps_zero_keeps_the_clone_as_the_agent(tmp_path):
    s = train_from_overrides([*TINY, "agent=bc_maskable_ppo", "agent.bc.episodes=2", "agent.bc.max_steps=200",
                              "agent.bc.epochs=2", "total_timesteps=0"], tmp_path)
    assert s["timesteps"] == 0 and s["bc"]["samples"] == 200
    steps = pd.read_csv(tmp_path / "eval_history.csv").timesteps.tolist()
    assert steps == [0] and (tmp_path / "final_model.zip").is_file() and (tmp_path / "best_model.zip").is_file()


def test_composition_recipe_clones_a_teacher_given_as_a_spec_and_saves_reward_only_normalisation(tmp_path):
    """experiment=prefill_composition_bc_ppo: the teacher is {name: sbs, compose: length}; normalize reward only
    (SB3 then keeps no observation statistics) saves, reloads and acts like the teacher it cloned."""
    s = train_from_overrides(["experiment=prefill_composition_bc_ppo", 'env.overrides=["workload.num_requests=800"]',
                              "agent.bc.episodes=10", "agent.bc.max_steps=1500", *SMALL_PPO, "total_timesteps=128",
                              "eval.freq=64", "eval.seeds=[0]", "checkpoint_freq=64", "wandb.mode=disabled",
                              "progress=false"], tmp_path)
    assert s["bc"]["teacher"] == {"name": "sbs", "compose": "length"} and s["bc"]["val_accuracy"] > 0.9, s["bc"]
    agent = candidates.load_agent(tmp_path)
    assert agent.point == "prefill"
    scen = {"workload.num_requests": 400}
    raw = load_scenario("ds_v3_h800_3p1d", [f"{k}={v}" for k, v in scen.items()]).raw
    got = run_one(raw, raw["policy"], candidates.resolve(str(tmp_path), "prefill"), None, 0).metrics["ttft_mean"]
    rule = run_one(raw, raw["policy"], candidates.resolve({"name": "sbs", "compose": "length"}, "prefill"), None, 0)
    sbs = run_one(raw, raw["policy"], candidates.resolve("sbs", "prefill"), None, 0).metrics["ttft_mean"]
    assert abs(got - rule.metrics["ttft_mean"]) < 0.5 * abs(sbs - rule.metrics["ttft_mean"])  # nearer the teacher


def test_bad_agent_config_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="agent.algo"):
        train_from_overrides([*TINY, "agent.algo=sac"], tmp_path)
    with pytest.raises(ConfigError, match="agent.bc.teacher"):
        train_from_overrides([*TINY, "agent=dqn", "agent.bc.teacher=br0"], tmp_path)
    with pytest.raises(ConfigError, match=r"^agent\.bc\.teacher: policy\.decode\.name: unknown 'sbs'"):
        train_from_overrides([*TINY, "agent=bc_maskable_ppo", "agent.bc.teacher=sbs"], tmp_path)
    with pytest.raises(ConfigError, match=r"^agent\.bc\.teacher: policy\.prefill\.compose: got 'bogus'"):
        train_from_overrides(["experiment=prefill_composition_bc_ppo", "agent.bc.teacher.compose=bogus"], tmp_path)
    with pytest.raises(ConfigError, match=r"^agent\.kwargs\.learning_rate: got -1; must be > 0$"):
        train_from_overrides([*TINY, "agent.kwargs.learning_rate=-1"], tmp_path)
    with pytest.raises(ConfigError, match=r"^agent\.kwargs\.gamma: got 1\.5; must be in \(0, 1\]$"):
        train_from_overrides([*TINY, "agent.kwargs.gamma=1.5"], tmp_path)
    with pytest.raises(ConfigError, match=r"^agent\.kwargs\.bogus_arg: not an argument of MaskablePPO; allowed: .*n_steps"):
        train_from_overrides([*TINY, "+agent.kwargs.bogus_arg=1"], tmp_path)
    assert not list(tmp_path.iterdir()), "a rejected config wrote files"


@pytest.mark.parametrize("args", [["agent.kwargs.learning_rate=-1"], ["+agent.kwargs.bogus_arg=1"],
                                  ["agent.kwargs.bogus_arg=1"], ["agent=dqn", "agent.kwargs.gamma=0"]])
def test_train_cli_bad_agent_kwargs_is_one_line(tmp_path, args):
    out = tmp_path / "run"
    r = cli("pdgym.agents.training.train", *TINY, *args, f"hydra.run.dir={out}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("pdgym-train: error: agent.kwargs."), r.stderr
    assert not out.exists(), "a rejected config created the run folder"


def test_train_cli_resume_with_another_config_touches_nothing(tmp_path):
    args = [*TINY, "agent=a2c", *ALGO_ARGS["a2c"], "total_timesteps=32"]
    train_from_overrides(args, tmp_path)
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    r = cli("pdgym.agents.training.train", *args, "seed=5", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "differs in seed)" in r.stderr
    assert not (tmp_path / ".hydra").exists()
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files


def test_train_cli_ends_with_the_command_that_evaluates_the_run(tmp_path):
    out = tmp_path / "run"
    r = cli("pdgym.agents.training.train", *TINY, "agent=a2c", *ALGO_ARGS["a2c"], "total_timesteps=32",
            f"hydra.run.dir={out}")
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    scenario = json.loads((out / "agent.json").read_text())["scenario"]
    from pdgym.envs.sim.shell import app_command  # the executable as this shell runs it (.venv/bin/... off PATH)

    assert last.startswith(f"evaluate it: {app_command('pdgym-eval')} policy={out} scenario={scenario}")
    assert "best model: " in r.stdout  # which model best_model.zip is, in words
    assert "(trained with workload.num_requests=120 max_sim_time_s=8)" in last


@pytest.mark.parametrize("agent", ["pointer_maskable_ppo", "attention_maskable_ppo", "set_maskable_ppo", "dqn"])
def test_subprocess_vector_envs_train_every_extractor(tmp_path, agent):
    """SubprocVecEnv workers are other processes: the observation layout reaches the network builder
    through get_attr, and the pointer extractor gets its action count from the vector env. (flat is
    the dqn agent's extractor; the BC recipe is maskable_ppo with a teacher, covered by the BC tests.)"""
    args = ALGO_ARGS["dqn"] if agent == "dqn" else SMALL_PPO
    s = train_from_overrides([*TINY, f"agent={agent}", *args, "vec_env=subproc", "total_timesteps=128"], tmp_path)
    assert s["timesteps"] >= 128
    spec = model_store.read(tmp_path / "final_model.zip")["spec"]
    kind = spec.features.get("kind", "flat")
    assert kind == {"dqn": "flat"}.get(agent, agent.split("_")[0]), spec.features
    if kind != "flat":
        assert spec.features["n_slots"] == 16
    assert spec.n_actions >= 16


# --------------------------------------------------------------------------- multirun
def test_joblib_multirun_runs_two_jobs(tmp_path):
    r = cli("pdgym.agents.training.train", "-m", "hydra/launcher=joblib_local", "seed=0,1", "agent=a2c",
            *ALGO_ARGS["a2c"], *[a for a in TINY if not a.startswith("total")], "total_timesteps=32",
            f"hydra.sweep.dir={tmp_path}", timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = sorted(tmp_path.glob("*/metrics.json"))
    assert len(runs) == 2
    names = {json.loads(p.read_text())["name"] for p in runs}
    # default names carry the config hash: two seeds, two different hashes
    assert {n.rsplit("_", 1)[0] for n in names} == {f"{ENV}_a2c_s0", f"{ENV}_a2c_s1"}
    assert len({n.rsplit("_", 1)[1] for n in names}) == 2


# --------------------------------------------------------------------------- nothing in a run executes
class _Trap:
    """Unpickling this creates the marker file (what an attacker's payload would do, harmlessly)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant_traps(run, marker) -> None:
    """Booby-trapped files where the SB3 / pickle era looked: VecNormalize and replay pickles beside every
    model, and an SB3-style zip (cloudpickled `data` entry, pickled policy.pth) as the newest checkpoint."""
    import base64
    import pickle
    import zipfile

    payload = pickle.dumps(_Trap(marker))
    for model in [*run.glob("*.zip"), *run.glob("checkpoints/*.zip")]:
        model.with_name(model.stem + "_vecnormalize.pkl").write_bytes(payload)
        model.with_name(model.stem + "_replay.pkl").write_bytes(payload)
    data = {"policy_class": {":type:": "<class 'abc.ABCMeta'>", ":serialized:": base64.b64encode(payload).decode()},
            "observation_space": {":serialized:": base64.b64encode(payload).decode()}}
    with zipfile.ZipFile(run / "checkpoints" / "model_999999.zip", "w") as zf:
        zf.writestr("data", json.dumps(data))
        zf.writestr("policy.pth", payload)
        zf.writestr("pytorch_variables.pth", payload)
        zf.writestr("_stable_baselines3_version", "2.9.2")


def test_loading_a_run_executes_nothing_from_its_files(tmp_path):
    from pdgym.agents.apps import leaderboard as L

    run, marker = tmp_path / "run", tmp_path / "PWNED"
    args = [*TINY, "agent=maskable_ppo", *SMALL_PPO, "total_timesteps=128", "normalize.obs=true"]
    train_from_overrides(args, run)
    _plant_traps(run, marker)
    trap = run / "checkpoints" / "model_999999.zip"
    # the traps are live: the loaders pdgym used before fire them
    import pickle

    from sb3_contrib import MaskablePPO

    pickle.loads((run / "final_model_vecnormalize.pkl").read_bytes())
    assert marker.exists()
    marker.unlink()
    with pytest.raises(Exception):  # noqa: B017  (SB3 fails after its unpickling ran the payload)
        MaskablePPO.load(trap, device="cpu")
    assert marker.exists()
    marker.unlink()

    # pdgym-eval on the run directory, and on the trap zip itself (refused in one line)
    r = cli("pdgym.agents.evaluation.evaluate", f"policy={run}", "scenario=decode_tier_n16", "seeds=[0]",
            "workload.num_requests=60", "max_sim_time_s=8", "progress=false", f"hydra.run.dir={tmp_path / 'ev'}")
    assert r.returncode == 0, r.stderr
    r = cli("pdgym.agents.evaluation.evaluate", f"policy={trap}", "scenario=decode_tier_n16", "seeds=[0]",
            "progress=false", f"hydra.run.dir={tmp_path / 'ev2'}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a pdgym model file" in r.stderr, r.stderr
    # the leaderboard's loading path; the trap checkpoint is what a run without best/final model offers
    for name in ("best_model.zip", "final_model.zip"):
        (run / name).rename(tmp_path / name)
    assert L.agent_point(str(run)) == "decode"
    cand = L.resolve_cached("agent", "agent", str(run), "decode")  # newest *whole* checkpoint, not the trap
    assert cand.agent.path.name == "model_128.zip"
    with pytest.raises(ConfigError, match="not a pdgym model file"):
        candidates.resolve(str(trap))
    # train resume skips the trap (not a pdgym checkpoint) and continues the newest whole one
    s = train_from_overrides([*args[:-2], "total_timesteps=192", "normalize.obs=true"], run)
    assert s["resumed_from"].endswith("model_128.zip")
    assert not marker.exists(), "a file of the run directory executed code"


def test_predictor_acts_as_the_policys_own_predict():
    """model_store.predictor skips SB3's per-call predict() overhead: the same masked greedy actions."""
    from pdgym.agents.learned.model_store import predictor
    from sb3_contrib import MaskablePPO

    model = MaskablePPO("MlpPolicy", _ArgmaxEnv(), seed=0, device="cpu", policy_kwargs={"net_arch": [32]})
    model.policy.set_training_mode(True)  # as after a training update: the predictor must switch it off
    act = predictor(model.policy, "maskable_ppo")
    rng = np.random.default_rng(1)
    for _ in range(200):
        obs = rng.random(8).astype(np.float32)
        mask = rng.random(4) > 0.5
        mask[rng.integers(4)] = True
        want, _ = model.policy.predict(obs, action_masks=mask, deterministic=True)
        got = act(obs, mask)
        assert got == int(want) and mask[got]
    assert not model.policy.training
    nothing = np.zeros(4, dtype=bool)  # no allowed action: what sb3-contrib picks too
    assert act(np.ones(8, np.float32), nothing) == int(model.policy.predict(np.ones(8, np.float32),
                                                                            action_masks=nothing,
                                                                            deterministic=True)[0])


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_predictor_of_an_unmasked_agent_is_its_masked_greedy_action(algo):
    """PPO / A2C: the predictor's actor-only forward gives the argmax of the policy's own logits among the allowed
    actions (the distribution SB3 builds, masked here)."""
    import torch
    from pdgym.agents.learned.model_store import predictor
    from stable_baselines3 import A2C, PPO

    model = {"ppo": PPO, "a2c": A2C}[algo]("MlpPolicy", _ArgmaxEnv(), seed=0, device="cpu",
                                           policy_kwargs={"net_arch": [32, 16]})
    act = predictor(model.policy, algo)
    rng = np.random.default_rng(2)
    for _ in range(200):
        obs = rng.random(8).astype(np.float32)
        mask = rng.random(4) > 0.5
        mask[rng.integers(4)] = True
        with torch.no_grad():
            logits = model.policy.get_distribution(model.policy.obs_to_tensor(obs)[0]).distribution.logits[0].numpy()
        assert act(obs, mask) == int(np.argmax(np.where(mask, logits, -np.inf)))
