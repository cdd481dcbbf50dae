"""PPO training throughput (environment steps per second, rollouts + updates) on DecodeRouting-v0 with one
process (DummyVecEnv) and two (SubprocVecEnv), next to SB3 PPO on CartPole-v1 measured in the same run,
so the ratio is comparable across machines. Same PPO settings everywhere (SB3 defaults, n_steps 512,
2 envs, torch 1 thread); the routing env replays the N = 16 Azure decode tier."""

from __future__ import annotations

import time

STEPS = 4096


def _ppo_rate(make_venv) -> float:
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)
    venv = make_venv()
    model = PPO("MlpPolicy", venv, n_steps=512, batch_size=64, seed=0, device="cpu", verbose=0)
    model.learn(512)  # warm-up: first rollout, torch initialisation
    t0 = time.perf_counter()
    model.learn(STEPS, reset_num_timesteps=False)
    rate = STEPS / (time.perf_counter() - t0)
    venv.close()
    return rate


def _routing(n_envs: int, subproc: bool):
    from pdgym.envs.decode_routing import make_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [lambda: make_env(scenario="decode_tier_n16", overrides=["workload.num_requests=2000"])] * n_envs
    return (SubprocVecEnv(fns) if subproc else DummyVecEnv(fns))


def run() -> dict:
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    cart = _ppo_rate(lambda: DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2))
    one = _ppo_rate(lambda: _routing(2, subproc=False))
    two = _ppo_rate(lambda: _routing(2, subproc=True))
    return {"cartpole_ppo_steps_per_s": cart, "decode_routing_ppo_steps_per_s_1proc": one,
            "decode_routing_ppo_steps_per_s_2proc": two, "ratio_1proc_vs_cartpole": one / cart,
            "ratio_2proc_vs_cartpole": two / cart}
