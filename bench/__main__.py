"""Run every bench/bench_*.py and record the figures (see bench/__init__.py)."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table


def cartpole_steps_per_s(n: int = 50_000) -> float:
    """Raw Gymnasium CartPole-v1 steps per second: the machine's speed reference."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(n):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    return n / (time.perf_counter() - t0)


def main(argv: list[str]) -> None:
    only = set(argv)
    import bench

    mods = [m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")]
    results: dict[str, float] = {"ref_cartpole_steps_per_s": cartpole_steps_per_s()}
    for name in sorted(mods):
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        figures = importlib.import_module(f"bench.{name}").run()
        results.update({f"{name[6:]}.{k}": float(v) for k, v in figures.items()})
        print(f"{name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    ref = results["ref_cartpole_steps_per_s"]
    table = Table(title="pdgym bench")
    for col in ("figure", "value", "per 100k CartPole steps/s"):
        table.add_column(col, justify="right" if col != "figure" else "left")
    for k, v in results.items():
        table.add_row(k, f"{v:,.4g}", f"{v / ref * 1e5:,.4g}")
    Console().print(table)
    out = Path("runs/bench")
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().isoformat(timespec="seconds")
    row = {"time": stamp, "python": platform.python_version(), **results}
    (out / "latest.json").write_text(json.dumps(row, indent=2) + "\n")
    hist = out / "history.csv"
    df = pd.DataFrame([row])
    if hist.exists():
        df = pd.concat([pd.read_csv(hist), df], ignore_index=True)
    df.to_csv(hist, index=False)
    print(f"recorded in {hist}")


if __name__ == "__main__":
    main(sys.argv[1:])
