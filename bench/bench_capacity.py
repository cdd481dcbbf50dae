"""CapacityControl-v0 steps per second (issue 43 budget: a step at >= 0.1 of CartPole's rate): whole episodes of the
diurnal_bursts board (240 intervals of 3 fluid sub-steps, the end-of-day drain included) under the no-op action."""

from __future__ import annotations

import time


def run() -> dict:
    import gymnasium as gym
    import pdgym.envs  # noqa: F401

    env = gym.make("pdgym/CapacityControl-v0").unwrapped
    env.reset(seed=0)
    steps, t0 = 0, time.perf_counter()
    for s in range(4):
        env.reset(seed=s)
        done = False
        while not done:
            done = env.step(0)[2]
            steps += 1
    return {"env_steps_per_s": steps / (time.perf_counter() - t0)}
