"""Issue 36 item 3: does the cost of a request grow with the cluster? The bench's disaggregated cluster
(bench_sim.DISAGG: 3 prefill x DP 8 + 1 decode x DP 32, 4 instances) scaled k-fold, k = 1, 4, 16, 64, 256
(4 to 1,024 instances), at a fixed number of requests offered k times as fast (60 k req/s), so each
instance sees the same traffic. Reported per k: CPU seconds (`time.process_time`: on a shared machine the
ratios between k hold where wall time does not) per request and per event of `Simulator.run()`, events per
request, and the per-request cost relative to k = 1 (4 instances; target: <= 1.5 at k = 256, 1,024 instances).
Default policies (round-robin dispatch, least-KV admission).

At fixed requests a k-fold cluster holds each instance's few requests for 1/k of the time, so each decode
instance steps its last requests out alone (small batches, one step-table row per token): the events per
request grow with k because the simulated work does (docs/performance.md, "Where the remaining time is").
The steady variant (`steady_*` figures) scales the requests k-fold too (Poisson arrivals at 60 k req/s,
Azure-conversation lengths drawn from the trace's empirical distributions, STEADY requests per k = 1
cluster), so every instance sees the same traffic for the same simulated time, as a fleet in steady state
does: there the per-request cost measures the engine's bookkeeping alone. Both variants report the decode
tokens per decode step (the batch a step serves), the physical quantity the two regimes differ in.

    .venv/bin/python -m bench bench_scale             # 19,366 requests (the trace), best of 2 per k; steady 2,000 k
    PDGYM_BENCH_QUICK=1 .venv/bin/python -m bench bench_scale      # 4,000 requests, steady 1,000 k, one run per k
    .venv/bin/python bench/bench_scale.py [--quick] [--engine numba]  # the tables alone, not recorded
"""

from __future__ import annotations

import copy
import os
import sys
import time

from pdgym.envs.sim import PassKind, Simulator

try:
    from bench.bench_sim import DISAGG
except ImportError:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.bench_sim import DISAGG

FOLDS = (1, 4, 16, 64, 256)
FULL, QUICK = 19_366, 4_000
STEADY, STEADY_QUICK = 2_000, 1_000  # steady variant: requests per k = 1 cluster (k * this in all)
# the steady variant's traffic: Poisson arrivals, lengths from the Azure conversation trace's distributions
STEADY_WORKLOAD = {"arrival": "poisson", "prompt": {"dist": "empirical", "source": "azure_conv"},
                   "output": {"dist": "empirical", "source": "azure_conv"}}


def scaled(k: int, n: int, steady: bool = False, engine: str = "python") -> dict:
    """The bench cluster with k times the instances and k times the arrival rate: n requests, or with
    `steady` n * k requests of STEADY_WORKLOAD (the same traffic per instance for the same time)."""
    cfg = copy.deepcopy(DISAGG)
    cfg["engine"] = engine
    cfg["cluster"]["prefill"]["count"] *= k
    cfg["cluster"]["decode"]["count"] *= k
    cfg["workload"]["rate"] *= k
    cfg["workload"]["num_requests"] = n * k if steady else n
    if steady:
        del cfg["workload"]["trace"]
        cfg["workload"].update(copy.deepcopy(STEADY_WORKLOAD))
    return cfg


def measure(k: int, n: int, repeats: int, steady: bool = False, engine: str = "python") -> dict:
    """Best of `repeats` runs: CPU time of run() (construction excluded), events, requests, instances, and the
    decode tokens per decode step (mean batch of a decode pass)."""
    best = None
    for _ in range(repeats):
        sim = Simulator(scaled(k, n, steady, engine), None, seed=0)
        t0 = time.process_time()
        sim.run()
        wall = time.process_time() - t0
        if best is None or wall < best[0]:
            best = (wall, sim)
    wall, sim = best
    steps = sim.steps.frame()
    tokens = steps.tokens.to_numpy()[steps.kind.to_numpy() == PassKind.DECODE]
    reqs, events = sim.req.n, sim.n_events
    return {"instances": len(sim.prefill) + len(sim.decode), "requests": reqs,
            "us_per_request": 1e6 * wall / reqs, "us_per_event": 1e6 * wall / events,
            "events_per_request": events / reqs,
            "tokens_per_decode_step": float(tokens.mean()) if len(tokens) else 0.0}


def sizes(quick: bool) -> tuple[int, int, int]:
    """(fixed requests, steady requests per k = 1 cluster, repeats)."""
    return (QUICK, STEADY_QUICK, 1) if quick else (FULL, STEADY, 2)


def run(quick: bool | None = None) -> dict:
    if quick is None:
        quick = bool(os.environ.get("PDGYM_BENCH_QUICK"))
    n, n0, repeats = sizes(quick)
    out = {}
    for prefix, rows in (("", {k: measure(k, n, repeats) for k in FOLDS}),
                         ("steady_", {k: measure(k, n0, 1, steady=True) for k in FOLDS})):
        base = rows[1]["us_per_request"]
        for k, r in rows.items():
            out.update({f"{prefix}k{k}_{name}": v for name, v in r.items() if name not in ("instances", "requests")})
            out[f"{prefix}k{k}_cost_vs_k1"] = r["us_per_request"] / base
    return out


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    engine = argv[argv.index("--engine") + 1] if "--engine" in argv else "python"
    n, n0, repeats = sizes(quick)
    for title, steady in (("fixed requests", False), ("steady: requests x k", True)):
        print(f"{title} (engine={engine})")
        print(f"{'k':>4} {'instances':>9} {'requests':>9} {'us/request':>11} {'us/event':>9} {'events/req':>10} "
              f"{'tok/dstep':>9} {'vs k=1':>7}")
        base = None
        for k in FOLDS:
            r = measure(k, n0 if steady else n, 1 if steady else repeats, steady, engine)
            base = r["us_per_request"] if k == 1 else base
            print(f"{k:4d} {r['instances']:9d} {r['requests']:9d} {r['us_per_request']:11.1f} "
                  f"{r['us_per_event']:9.1f} {r['events_per_request']:10.2f} {r['tokens_per_decode_step']:9.1f} "
                  f"{r['us_per_request'] / base:7.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
