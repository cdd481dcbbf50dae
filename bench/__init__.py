"""`make bench`: speed figures of the simulator, baselines and training, recorded run to run.

Every module bench/bench_*.py exposes `run() -> dict[str, float]`; this package runs them
all, measures a reference (Gymnasium CartPole raw steps/s) in the same process so figures
can be compared across machines and runs as ratios, prints a table and appends to
runs/bench/history.csv (plus runs/bench/latest.json).
"""
