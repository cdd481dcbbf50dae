"""Peak memory (max RSS) of one simulation of 1,000,000 requests, in a fresh subprocess so nothing else
of the bench counts: the DeepSeek-V3 disaggregated scenario with Poisson arrivals at 60 req/s and
Azure-conversation lengths (empirical), default policies, the run read by its summary() only
(Simulator(step_log=False): no step table, only the passes' figures the summary reads; no pandas loaded).
Also the interpreter's baseline RSS after
the same imports, so the per-request cost can be read off, and the RSS after each stage (construction: the
request table; `run()`: the step log and the columns the run writes; `SimResult`: the result frames), so the
peak's parts can be read off too (docs/performance.md, "Where the remaining time is")."""

from __future__ import annotations

import json
import subprocess
import sys

N = 1_000_000
CHILD = """
import json, sys, time
from pdgym.envs.sim import SimResult, Simulator

def status_kb(key):  # VmHWM / VmRSS of this process; ru_maxrss would carry the parent's peak across exec
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

base = status_kb("VmRSS")
n = int(sys.argv[1])
cfg = {"hardware": "h800", "model": "deepseek_v3",
       "cluster": {"topology": "disaggregated", "prefill": {"count": 3, "dp": 8, "tp": 2, "ep": 16,
                                                                 "chunk_tokens": 3072},
                   "decode": {"count": 1, "dp": 32, "ep": 32, "batch_limit": 128}},
       "workload": {"num_requests": n, "arrival": "poisson", "rate": 60.0,
                    "prompt": {"dist": "empirical", "source": "azure_conv"},
                    "output": {"dist": "empirical", "source": "azure_conv"}}}
sim = Simulator(cfg, None, seed=0, step_log=False)  # a run read by its summary only: no step table kept
built = status_kb("VmRSS")
t = time.perf_counter()
sim.run()
wall = time.perf_counter() - t
ran = status_kb("VmRSS")
res = SimResult(sim)
framed = status_kb("VmRSS")
res.summary()
peak = status_kb("VmHWM")
print(json.dumps({"base_kb": base, "built_kb": built, "ran_kb": ran, "framed_kb": framed, "peak_kb": peak,
                  "wall_s": wall, "events": sim.n_events}))
"""


def measure(n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> dict:
    m = measure(N)
    return {"peak_mb_1m": m["peak_kb"] / 1024, "import_mb": m["base_kb"] / 1024,
            "construct_mb_1m": (m["built_kb"] - m["base_kb"]) / 1024, "run_mb_1m": (m["ran_kb"] - m["built_kb"]) / 1024,
            "result_mb_1m": (m["framed_kb"] - m["ran_kb"]) / 1024, "summary_peak_mb_1m": (m["peak_kb"] - m["framed_kb"]) / 1024,
            "kb_per_request": (m["peak_kb"] - m["base_kb"]) / N, "requests_per_wall_s_1m": N / m["wall_s"]}
