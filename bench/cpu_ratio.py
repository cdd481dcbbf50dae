"""A bench scenario's CPU rate as a ratio to CartPole's CPU rate, for A/B runs on a loaded machine.

    .venv/bin/python -m bench.cpu_ratio coloc        # or disagg; run from the repository root

Wall time is noise when the machine is shared; CPU time (`time.process_time`) is not, or much less. This runs
raw CartPole-v1 steps, `Simulator(config).run()` of bench_sim's scenario, then CartPole again, all timed in CPU
seconds, and prints the scenario's requests per CPU second over the mean CartPole steps per CPU second. Run it
alternately with two checkouts' interpreters (interleaved A/B) and compare the ratios.
"""

from __future__ import annotations

import copy
import sys
import time

from bench import cartpole_steps_per_s
from bench.bench_sim import COLOC, DISAGG

SCENARIOS = {"coloc": COLOC, "disagg": DISAGG}


def cartpole_cpu_rate() -> float:
    """Raw CartPole-v1 steps per CPU second."""
    return cartpole_steps_per_s(clock=time.process_time)


def main(argv: list[str]) -> None:
    from pdgym.envs.sim import Simulator

    name = argv[0] if argv else "coloc"
    if name not in SCENARIOS:
        raise SystemExit(f"cpu_ratio: scenario: got {name!r}; allowed: {', '.join(SCENARIOS)}")
    before = cartpole_cpu_rate()
    sim = Simulator(copy.deepcopy(SCENARIOS[name]), None, seed=0)
    t0 = time.process_time()
    sim.run()
    cpu = time.process_time() - t0
    ref = (before + cartpole_cpu_rate()) / 2
    rate = sim.req.n / cpu
    print(f"{name}: run() {cpu:.2f} CPU s, {rate:.0f} requests per CPU s, CartPole {ref:.0f} steps per CPU s, "
          f"ratio {rate / ref:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
