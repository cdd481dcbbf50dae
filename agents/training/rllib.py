"""PPO on Ray RLlib over N env runners, exported as a pdgym agent that pdgym-eval runs like any other.

RLlib is where training outgrows one machine (env runners on a Ray cluster); pdgym-train stays SB3 on one. This
recipe trains RLlib's PPO with a masked actor-critic (`MaskedActorCritic`) whose layers are exactly sb3-contrib's
MaskablePPO MlpPolicy (separate policy and value MLPs, tanh, a linear action and value head, masked logits -1e8),
so the trained weights are written as a pdgym model (agents/learned/model_store.py: a spec and a state_dict, no
pickle, unlike an RLlib checkpoint, which RLlib itself unpickles) with an agent.json beside it:

    python -m pdgym.agents.training.rllib --env pdgym/DecodeRouting-v0 --runners 4 --iterations 50 \\
        --scenario decode_tier_n8 --out runs/rllib/decode
    pdgym-eval policy=runs/rllib/decode scenario=decode_tier_n8          # the held-out evaluation, as for pdgym-train

The env runners make `pdgym:<id>` (gymnasium imports pdgym in each runner: a Ray worker never ran this process's
imports) with `mask_in_obs=True` (envs/masks.py): the module reads the mask from the Dict observation. Needs
`ray[rllib]`, not a pdgym dependency (it moves gymnasium's version): `make rllib-check` installs it in a side
environment and runs tests/test_rllib.py (2 runners, 1 iteration).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from pdgym.envs.masks import MASK_KEY, OBS_KEY
from pdgym.envs.sim.config import ConfigError
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn

MASKED_LOGIT = -1e8  # sb3-contrib's MaskableCategorical: the exported policy acts as it trained
MASK_OPTIONS = {"mask_in_obs": True, "obs_key": OBS_KEY, "mask_key": MASK_KEY}


def _mlp(n_in: int, hiddens: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hiddens:
        layers += [nn.Linear(n_in, width), nn.Tanh()]
        n_in = width
    return nn.Sequential(*layers)


class MaskedActorCritic(TorchRLModule, ValueFunctionAPI):
    """PPO's RLModule on a pdgym env with `mask_in_obs`: parameter names and shapes are MaskablePPO's MlpPolicy's
    (mlp_extractor.policy_net / value_net, action_net, value_net), so its state_dict loads into that policy."""

    def setup(self):
        n_in = int(np.prod(self.observation_space[OBS_KEY].shape))
        hiddens = list(self.model_config.get("hiddens", [64, 64]))
        self.mlp_extractor = nn.Module()
        self.mlp_extractor.policy_net = _mlp(n_in, hiddens)
        self.mlp_extractor.value_net = _mlp(n_in, hiddens)
        self.action_net = nn.Linear(hiddens[-1], int(self.action_space.n))
        self.value_net = nn.Linear(hiddens[-1], 1)

    def _forward(self, batch, **kwargs):
        obs = batch[Columns.OBS]
        logits = self.action_net(self.mlp_extractor.policy_net(obs[OBS_KEY].float()))
        masked = torch.where(obs[MASK_KEY].bool(), logits, torch.full_like(logits, MASKED_LOGIT))
        return {Columns.ACTION_DIST_INPUTS: masked}

    def compute_values(self, batch, embeddings=None):
        x = batch[Columns.OBS][OBS_KEY].float()
        return self.value_net(self.mlp_extractor.value_net(x)).squeeze(-1)


def ppo_config(env_id: str, env_kwargs: dict, runners: int, hiddens: list[int], seed: int, batch: int):
    """RLlib's PPOConfig: `runners` env runners, each making `pdgym:<env_id>` with the mask in the observation."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    return (PPOConfig()
            .environment(f"pdgym:{env_id}", env_config={**env_kwargs, **MASK_OPTIONS})
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=1)
            .learners(num_learners=0)
            .training(train_batch_size_per_learner=batch, minibatch_size=min(64, batch), num_epochs=4)
            .rl_module(rl_module_spec=RLModuleSpec(module_class=MaskedActorCritic, model_config={"hiddens": hiddens}))
            .debugging(seed=seed))


def export(state: dict, env_id: str, env_kwargs: dict, hiddens: list[int], steps: int, out: Path) -> Path:
    """The trained module as a pdgym agent: out/final_model.zip (the model store's MaskablePPO MlpPolicy, loaded
    strictly, so a layer that does not match fails here) and out/agent.json (point, env id, env kwargs)."""
    import gymnasium as gym
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.learned.model_store import NetSpec, Saver
    from pdgym.envs.sim.metrics import write_json

    env = candidates.make_env(env_id, **env_kwargs)
    spec = NetSpec("maskable_ppo", "MlpPolicy", {"kind": "flat"}, list(hiddens),
                   [int(d) for d in env.observation_space.shape], int(env.action_space.n))
    assert isinstance(env.action_space, gym.spaces.Discrete)
    policy = spec.build_policy()
    policy.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    Saver(spec)(SimpleNamespace(policy=policy, num_timesteps=steps), out / "final_model.zip")
    meta = {"name": f"rllib_ppo_{env_id.split('/')[-1]}", "point": candidates.env_point(env_id), "env_id": env_id,
            "env_kwargs": env_kwargs, "algo": "rllib_ppo", "scenario": env_kwargs.get("scenario")}
    write_json(out / candidates.AGENT_META, meta)
    return out


def train(env_id: str, out: str | Path, runners: int = 2, iterations: int = 1, env_kwargs: dict | None = None,
          hiddens: tuple[int, ...] = (64, 64), seed: int = 0, batch: int = 512, num_cpus: int | None = None) -> dict:
    """Train PPO for `iterations` on a local Ray (started here unless one runs) and export it to `out`; returns the
    last iteration's result figures (env steps, episode return mean) and the folder."""
    import ray
    from pdgym.agents.evaluation import candidates

    if candidates.env_point(env_id) is None:
        raise ConfigError(f"env: unknown {env_id!r}; allowed: {', '.join(candidates.env_ids())}")
    for key, v in (("runners", runners), ("iterations", iterations), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{key}: got {v!r}; must be an integer >= 1")
    env_kwargs = {k: v for k, v in (env_kwargs or {}).items() if k not in MASK_OPTIONS}
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"out: {out} exists and is not an empty folder; give a new one (a run is never overwritten)")
    probe = candidates.make_env(env_id, **env_kwargs, **MASK_OPTIONS)  # a bad option: one line here, not in a runner
    env_kwargs.setdefault("scenario", probe.scenario)  # stored in agent.json: pdgym-eval names what it trained on
    probe.close()
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus or runners + 1, include_dashboard=False, log_to_driver=False)
    algo = ppo_config(env_id, env_kwargs, runners, list(hiddens), seed, batch).build_algo()
    try:
        for _ in range(iterations):
            result = algo.train()
        state = algo.learner_group.get_weights()["default_policy"]
    finally:
        algo.stop()
    steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
    export(state, env_id, env_kwargs, list(hiddens), steps, out)
    return {"out": str(out), "env_steps": steps, "iterations": iterations,
            "episode_return_mean": float(result["env_runners"].get("episode_return_mean", float("nan")))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdgym.agents.training.rllib", description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="pdgym/DecodeRouting-v0", help="a pdgym id with a Discrete action")
    ap.add_argument("--out", required=True, help="the agent's folder (pdgym-eval policy=OUT)")
    ap.add_argument("--runners", type=int, default=2, help="RLlib env runners (Ray workers)")
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--batch", type=int, default=512, help="env steps per PPO iteration")
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--override", action="append", default=[], help="a simulator override, e.g. workload.num_requests=200")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    kwargs = {"overrides": args.override, **({"scenario": args.scenario} if args.scenario else {})}
    try:
        res = train(args.env, args.out, args.runners, args.iterations, kwargs, seed=args.seed, batch=args.batch)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
