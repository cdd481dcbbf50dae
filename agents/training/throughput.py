"""Training throughput against the number of processes: env steps/s (random feasible actions through the
vector env) and SB3 timesteps/s (MaskablePPO rollouts + updates), one env per process.

    python -m pdgym.agents.training.throughput --procs 1 2 4 8 --steps 2048

`procs=1` is a DummyVecEnv (no process hop), more are SubprocVecEnv workers. The numbers depend on the
cores the machine has free: compare rows of one run, not across machines.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
from pdgym.agents.errors import OneLineParser


def _venv(n: int, env_fields: dict):
    """The vector env pdgym-train would build with n envs (one process, or n subprocess workers)."""
    from pdgym.envs.scenario import trace_splits

    from .env_factory import make_vec_env, scenario_raw
    from .schema import EnvSchema

    env = EnvSchema(**env_fields)
    app = SimpleNamespace(n_envs=n, vec_env="dummy" if n == 1 else "subproc", seed=0, max_segments=2)
    return make_vec_env(app, env, scenario_raw(env), trace_splits()["train"])


def env_steps_per_s(venv, steps: int, seed: int = 0) -> float:
    """Random feasible actions through the vector env (masks honoured), steps counted over all envs."""
    rng = np.random.default_rng(seed)
    venv.reset()
    n, t0, done = venv.num_envs, time.perf_counter(), 0
    while done < steps:
        masks = np.asarray(venv.env_method("action_masks"), dtype=bool)
        acts = np.array([rng.choice(np.flatnonzero(m)) if m.any() else 0 for m in masks])
        venv.step(acts)
        done += n
    return done / (time.perf_counter() - t0)


def sb3_steps_per_s(venv, steps: int) -> float:
    from sb3_contrib import MaskablePPO

    n_steps = max(64, 512 // venv.num_envs)
    model = MaskablePPO("MlpPolicy", venv, n_steps=n_steps, batch_size=128, n_epochs=2, seed=0, device="cpu",
                        verbose=0)
    t0 = time.perf_counter()
    model.learn(steps)
    return model.num_timesteps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    import torch

    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--steps", type=int, default=2048)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    env_kwargs = {"overrides": ["workload.num_requests=400"], "kwargs": {"skip": False}}
    print(f"cores: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}")
    print("procs | env steps/s | SB3 timesteps/s (MaskablePPO)")
    for n in args.procs:
        venv = _venv(n, env_kwargs)
        try:
            e = env_steps_per_s(venv, args.steps)
            s = sb3_steps_per_s(venv, args.steps)
        finally:
            venv.close()
        print(f"{n:5d} | {e:11.0f} | {s:15.0f}", flush=True)


if __name__ == "__main__":
    main()
