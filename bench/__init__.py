"""`make bench`: speed figures of the simulator, baselines and training, recorded run to run.

Every module bench/bench_*.py exposes `run() -> dict[str, float]`; this package runs them
all, measures a reference (Gymnasium CartPole raw steps/s) in the same process so figures
can be compared across machines and runs as ratios, prints a table, appends every figure to
bench/history.csv and, on a full run, writes the table into docs/performance.md
(bench/report.py holds the targets). runs/bench/latest.json keeps the last run. bench/cpu_ratio.py (not run by
`make bench`) gives one scenario's CPU rate over CartPole's, for A/B runs on a shared machine.
"""

import time


def cartpole_steps_per_s(n: int = 50_000, clock=time.perf_counter) -> float:
    """Raw Gymnasium CartPole-v1 steps per second of `clock` (wall by default; `time.process_time` gives steps per
    CPU second, bench/cpu_ratio.py): the machine's speed reference."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    t0 = clock()
    for _ in range(n):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    return n / (clock() - t0)
