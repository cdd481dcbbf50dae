"""RLlib on Ray (agents/training/rllib.py, issue 45 item 3): PPO over 2 env runners for one iteration on a local Ray,
exported as a pdgym agent that pdgym-eval runs. Needs ray[rllib], not a pdgym dependency (it moves gymnasium to
1.2.x): `make rllib-check` runs this file in a side environment; `make test` skips it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import pytest

pytest.importorskip("ray.rllib")

import pdgym  # noqa: E402, F401  (registers the envs)
import torch  # noqa: E402
from pdgym.agents.learned.model_store import load_predictor  # noqa: E402
from pdgym.agents.training import rllib  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402

ENV = "pdgym/DecodeRouting-v0"
KWARGS = {"scenario": "decode_tier_n8", "overrides": ["workload.num_requests=60"]}


def test_the_exported_agent_acts_as_the_rllib_module(tmp_path):
    """The module's greedy action (argmax of its masked logits) is the exported pdgym agent's at every decision
    of an episode: the same layers, loaded strictly into MaskablePPO's MlpPolicy (a random init, no training)."""
    env = gym.make(ENV, mask_in_obs=True, **KWARGS)
    torch.manual_seed(0)
    module = rllib.MaskedActorCritic(observation_space=env.observation_space, action_space=env.action_space,
                                     model_config={"hiddens": [32, 16]})
    rllib.export(module.state_dict(), ENV, KWARGS, [32, 16], 0, tmp_path)
    predict = load_predictor(tmp_path / "final_model.zip")
    obs, _ = env.reset(seed=0)
    agree = n = 0
    for _ in range(200):
        batch = {Columns.OBS: {k: torch.as_tensor(v)[None] for k, v in obs.items()}}
        with torch.no_grad():
            want = int(module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS].argmax(-1))
        got = int(predict(obs["observation"], obs["action_mask"].astype(bool)))
        agree, n = agree + (got == want), n + 1
        assert obs["action_mask"][want]  # the module never prefers a masked action
        obs, _, term, trunc, _ = env.step(want)
        if term or trunc:
            break
    assert agree == n and n > 10


def test_ppo_with_two_env_runners_trains_and_pdgym_eval_runs_the_agent(tmp_path):
    """One PPO iteration on a local Ray with 2 env runners, each making `pdgym:pdgym/...` in a fresh worker (they
    died with NamespaceNotFound before), then pdgym-eval on the exported folder like any pdgym-train run."""
    import ray

    out = tmp_path / "agent"
    try:
        res = rllib.train(ENV, out, runners=2, iterations=1, env_kwargs=KWARGS, batch=256, num_cpus=3)
    finally:
        ray.shutdown()
    assert res["env_steps"] >= 256 and (out / "final_model.zip").is_file()
    meta = json.loads((out / "agent.json").read_text())
    assert meta["point"] == "decode" and meta["env_id"] == ENV and "mask_in_obs" not in meta["env_kwargs"]
    run = tmp_path / "eval"
    subprocess.run([sys.executable, "-m", "pdgym.agents.evaluation.evaluate", f"policy={out}", "scenario=decode_tier_n8",
                    "workload.num_requests=60", "seeds=[0]", f"hydra.run.dir={run}"], check=True, capture_output=True,
                   env={**os.environ, "WANDB_MODE": "offline"}, timeout=300)
    result = json.loads((run / "metrics.json").read_text())
    assert result["kind"] == "agent" and result["point"] == "decode" and result["source"] == str(out / "final_model.zip")
    assert [s["finished"] + s["rejected"] for s in result["per_seed"].values()] == [60]  # every request resolved


@pytest.mark.parametrize(("argv", "key"), [
    (["--env", "pdgym/BatchingThresholdContinuous-v0"], "env.mask_in_obs: needs a Discrete action space"),
    (["--override", "workload.bogus=1"], "workload.bogus"),
    (["--env", "CartPole-v1"], "env: unknown 'CartPole-v1'"),
    (["--runners", "0"], "runners: got 0"),
])
def test_bad_input_is_one_line_before_ray_starts(tmp_path, capsys, argv, key):
    import ray

    assert rllib.main([*argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert key in err and err.count("\n") == 1 and not ray.is_initialized() and not (tmp_path / "x").exists()


def test_an_existing_run_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "agent.json").write_text("{}")
    assert rllib.main(["--out", str(tmp_path)]) == 2
    assert "out: " in capsys.readouterr().err and (tmp_path / "agent.json").read_text() == "{}"
