"""Interleaved A/B of the simulator's and the envs' speed between two source trees (two git worktrees of pdgym).

    python -m bench.ab /path/to/tree_a /path/to/tree_b [--rounds 9] [--repeats 2] [--cases coloc,disagg]
        [--requests N]

Cases: coloc, disagg (`Simulator.run()` on bench_sim's scenarios), env_decode, env_prefill, env_batching
(`env.step` on bench_decode's / bench_prefill's / bench_batching's env, with seeded random valid actions) and
route_br0, route_brh (the CPU seconds of a decode router's steady rounds in bench_decode's normal regime, N = 32,
pool 200-320: the summed `route()` calls of one run, whose count and pool sizes must agree between the trees).

Each sample is a fresh process that imports pdgym from one tree (a temporary package folder of links to the
tree's agents, baselines, conf, data and envs, first on PYTHONPATH) and measures the CPU time
(`time.process_time`) of `Simulator.run()` on one of bench_sim's scenarios, or of an env's steps, the best of
`--repeats` runs in that process. Rounds alternate the order (A B, then B A, ...), so drift in the shared machine's load falls on both
sides alike; CPU time rather than wall time, so other processes on the cores count less. Both trees must
simulate the same thing: the event counts (an env's steps and return) must agree (a refactor or a budget check,
not a physics change).
Prints per case the median CPU seconds of each side and the median of the per-round ratios B / A with its
interquartile range.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from bench.bench_decode import EXTRA, POOL, B, N
from bench.bench_sim import COLOC, DISAGG

CASES = {"coloc": COLOC, "disagg": DISAGG, "disagg_numba": {**DISAGG, "engine": "numba"}}
# bench_decode.dispatch_ms's normal regime: a closed loop holding N B + POOL + EXTRA requests, 9,000 requests
ROUTE_CASES = {name: {"spec": spec, "scenario": "decode_tier_n32", "lo": 200, "hi": 320,
                      "overrides": ["oracle=true", "workload.arrival=closed", f"workload.concurrency={N * B + POOL + EXTRA}",
                                    "workload.num_requests=9000", f"cluster.decode.batch_limit={B}"]}
               for name, spec in (("route_br0", "br0"), ("route_brh", {"name": "brh", "predictor": "memo"}))}
PROBE = """
import json, sys, time
from pdgym.envs.sim import Simulator
cfg, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
best = float("inf")
for _ in range(repeats):
    sim = Simulator(cfg, None, seed=0)
    t = time.process_time()
    sim.run()
    best = min(best, time.process_time() - t)
print(json.dumps({"cpu_s": best, "events": sim.n_events}))
"""
ENV_PROBE = """
import json, sys, time
import numpy as np
case, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
if case == "env_decode":
    from pdgym.envs.decode_routing import make_env
    make = lambda: make_env(scenario="decode_tier_n16", overrides=["workload.num_requests=3000", "workload.rate=600"])
elif case == "env_prefill":
    from pdgym.envs.prefill_dispatch import make_env
    make = lambda: make_env(overrides=["workload.num_requests=1500", "workload.rate=150"])
else:
    from pdgym.envs.phase_batching import make_env
    make = lambda: make_env(overrides=["workload.num_requests=2000"])
best = float("inf")
for _ in range(repeats):
    env, rng = make(), np.random.default_rng(0)
    env.reset(seed=0)
    t, steps, ret, done = time.process_time(), 0, 0.0, False
    while not done:
        _, r, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        steps, ret, done = steps + 1, ret + float(r), term or trunc
    best = min(best, time.process_time() - t)
print(json.dumps({"cpu_s": best, "events": [steps, round(ret, 9)]}))
"""
ENV_CASES = ("env_decode", "env_prefill", "env_batching")
ROUTE_PROBE = """
import json, sys, time
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import Simulator
case, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
best = float("inf")
for _ in range(repeats):
    pol = make_policy("decode", case["spec"])
    inner, acc = pol.route, [0.0, 0, 0]

    def timed(sim, inst):
        n, d = len(sim.pool), sim.decode[inst]
        steady = (d.batch_limit - d.batch).sum() <= 0.1 * d.dp * d.batch_limit and case["lo"] <= n <= case["hi"]
        t = time.process_time()
        inner(sim, inst)
        if steady:
            acc[0] += time.process_time() - t
            acc[1] += 1
            acc[2] += n

    pol.route = timed
    Simulator(load_scenario(case["scenario"], case["overrides"]).sim, {"decode": pol}, seed=0).run()
    best = min(best, acc[0])
print(json.dumps({"cpu_s": best, "events": acc[1:]}))
"""
PACKAGES = ("agents", "baselines", "conf", "data", "envs")


def shim(tree: pathlib.Path, root: pathlib.Path) -> str:
    """A folder holding `pdgym/` whose subpackages are links to `tree`'s: put first on PYTHONPATH."""
    pkg = root / "pdgym"
    pkg.mkdir(parents=True)
    for name in PACKAGES:
        (pkg / name).symlink_to(tree.resolve() / name, target_is_directory=True)
    return str(root)


def sample(path: str, cfg, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    probe = ENV_PROBE if isinstance(cfg, str) else ROUTE_PROBE if "spec" in cfg else PROBE
    out = subprocess.run([sys.executable, "-c", probe, json.dumps(cfg), str(repeats)], env=env, check=True,
                         capture_output=True, text=True, cwd=path)
    return json.loads(out.stdout.strip().splitlines()[-1])


def quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.splitlines()[0])
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cases", default="coloc,disagg")
    ap.add_argument("--requests", type=int, default=None, help="num_requests of every case (default: bench_sim's)")
    args = ap.parse_args(argv)
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = [shim(pathlib.Path(t), pathlib.Path(tmp) / side) for t, side in ((args.tree_a, "a"),
                                                                                  (args.tree_b, "b"))]
        for case in args.cases.split(","):
            cfg = case if case in ENV_CASES else json.loads(json.dumps({**CASES, **ROUTE_CASES}[case]))
            if args.requests and case in CASES:
                cfg["workload"]["num_requests"] = args.requests
            cpu = ([], [])
            for r in range(args.rounds):
                order = (0, 1) if r % 2 == 0 else (1, 0)
                got = {side: sample(paths[side], cfg, args.repeats) for side in order}
                if got[0]["events"] != got[1]["events"]:
                    raise SystemExit(f"{case}: the trees simulate different runs ({got[0]['events']} vs "
                                     f"{got[1]['events']} events); an A/B of speed needs the same physics")
                for side in (0, 1):
                    cpu[side].append(got[side]["cpu_s"])
                print(f"{case} round {r + 1}: A {cpu[0][-1]:.3f} s  B {cpu[1][-1]:.3f} s  "
                      f"B/A {cpu[1][-1] / cpu[0][-1]:.4f}", flush=True)
            ratios = [b / a for a, b in zip(*cpu)]
            lo, hi = quartiles(ratios)
            result[case] = {"a_cpu_s": statistics.median(cpu[0]), "b_cpu_s": statistics.median(cpu[1]),
                            "ratio": statistics.median(ratios), "ratio_q1": lo, "ratio_q3": hi,
                            "events": got[0]["events"], "rounds": args.rounds}
            print(f"{case}: median CPU A {result[case]['a_cpu_s']:.3f} s, B {result[case]['b_cpu_s']:.3f} s; "
                  f"B/A median {result[case]['ratio']:.4f} (IQR {lo:.4f}-{hi:.4f}, {args.rounds} rounds)", flush=True)
    return result


if __name__ == "__main__":
    main()
