"""Issue 36 item 3: does the cost of a request grow with the cluster? The bench's disaggregated cluster
(bench_sim.DISAGG: 3 prefill x DP 8 + 1 decode x DP 32, 4 instances) scaled k-fold, k = 1, 4, 16, 64, 256
(4 to 1,024 instances), at a fixed number of requests offered k times as fast (60 k req/s), so each
instance sees the same traffic. Reported per k: wall seconds per request and per event of
`Simulator.run()`, events per request, and the per-request cost relative to k = 1 (4 instances; target:
<= 1.5 at k = 256, 1,024 instances). Default policies (round-robin dispatch, least-KV admission).

    .venv/bin/python -m bench bench_scale             # 19,366 requests (the trace), best of 2 per k
    PDGYM_BENCH_QUICK=1 .venv/bin/python -m bench bench_scale      # 4,000 requests, one run per k
    .venv/bin/python bench/bench_scale.py [--quick]   # the table alone, not recorded
"""

from __future__ import annotations

import copy
import os
import sys
import time

from pdgym.envs.sim import Simulator

try:
    from bench.bench_sim import DISAGG
except ImportError:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.bench_sim import DISAGG

FOLDS = (1, 4, 16, 64, 256)
FULL, QUICK = 19_366, 4_000


def scaled(k: int, n: int) -> dict:
    """The bench cluster with k times the instances and k times the arrival rate, n requests."""
    cfg = copy.deepcopy(DISAGG)
    cfg["cluster"]["prefill"]["count"] *= k
    cfg["cluster"]["decode"]["count"] *= k
    cfg["workload"]["rate"] *= k
    cfg["workload"]["num_requests"] = n
    return cfg


def measure(k: int, n: int, repeats: int) -> dict:
    """Best of `repeats` runs: wall of run() (construction excluded), events, requests, instances."""
    best = None
    for _ in range(repeats):
        sim = Simulator(scaled(k, n), None, seed=0)
        t0 = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, sim.n_events, sim.req.n, len(sim.prefill) + len(sim.decode))
    wall, events, reqs, inst = best
    return {"instances": inst, "us_per_request": 1e6 * wall / reqs, "us_per_event": 1e6 * wall / events,
            "events_per_request": events / reqs}


def run(quick: bool | None = None) -> dict:
    if quick is None:
        quick = bool(os.environ.get("PDGYM_BENCH_QUICK"))
    n, repeats = (QUICK, 1) if quick else (FULL, 2)
    rows = {k: measure(k, n, repeats) for k in FOLDS}
    out = {}
    base = rows[1]["us_per_request"]
    for k, r in rows.items():
        out.update({f"k{k}_{name}": v for name, v in r.items() if name != "instances"})
        out[f"k{k}_cost_vs_k1"] = r["us_per_request"] / base
    return out


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    n, repeats = (QUICK, 1) if quick else (FULL, 2)
    print(f"{'k':>4} {'instances':>9} {'us/request':>11} {'us/event':>9} {'events/req':>10} {'vs k=1':>7}")
    base = None
    for k in FOLDS:
        r = measure(k, n, repeats)
        base = r["us_per_request"] if k == 1 else base
        rel = f"{r['us_per_request'] / base:7.2f}" if base else "       "
        print(f"{k:4d} {r['instances']:9d} {r['us_per_request']:11.1f} {r['us_per_event']:9.1f} "
              f"{r['events_per_request']:10.2f} {rel}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
