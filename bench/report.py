"""The bench's targets (issue 13, issue 10 item 14), its table in docs/performance.md, and its history.

A figure is either a rate, shown with its ratio to the same run's CartPole reference (raw steps/s),
or an absolute figure (ms, MB, a ratio of two timings of the same run). Targets are stated on the
ratio for rates, so they hold across machines.
"""

from __future__ import annotations

import csv
from pathlib import Path

from pdgym.agents.experiments.harness import write_marked

# (figure, key in the results, kind, target as text, predicate on the value or its ratio)
ROWS = [
    ("Simulated requests/s, DeepSeek-V3 3P x DP8 + 1D x DP32 (19,366 Azure)", "sim.disagg_requests_per_wall_s",
     "rate", ">= 0.25", lambda r: r >= 0.25),  # issue 46: >= 0.25 on engine=python, >= 0.5 on engine=numba
    ("Simulated events/s, same", "sim.disagg_events_per_wall_s", "rate", "", None),
    ("Simulated requests/s, same, engine=numba", "sim.disagg_numba_requests_per_wall_s", "rate", ">= 0.5",
     lambda r: r >= 0.5),
    ("engine=numba: kernels compiled into an empty cache (s)", "sim.numba_compile_s", "abs", "", None),
    ("engine=numba: kernels loaded from numba's cache (s, every later run)", "sim.numba_cached_load_s", "abs", "",
     None),
    ("Simulated requests/s, Llama-3-8B A100 x4 colocated, chunk 512 (5,000 Azure at 8 req/s)",
     "sim.coloc_requests_per_wall_s", "rate", ">= 0.1", lambda r: r >= 0.1),
    ("Simulated events/s, same", "sim.coloc_events_per_wall_s", "rate", "", None),
    ("Mooncake trace replay (12,031 requests, prefix_mooncake, round robin): simulate() wall (s)",
     "prefix.mooncake_round_robin_wall_s", "abs", "< 10", lambda v: v < 10),
    ("Simulated requests/s, same", "prefix.mooncake_round_robin_requests_per_wall_s", "rate", "", None),
    ("Mooncake trace replay, cache_ttft (prefix-block index: a group of equal hits keyed once): simulate() wall (s)",
     "prefix.mooncake_cache_ttft_wall_s", "abs", "", None),
    ("Simulated requests/s, same", "prefix.mooncake_cache_ttft_requests_per_wall_s", "rate", "", None),
    ("Events per request, colocated", "sim.coloc_events_per_request", "abs", "", None),
    ("pdgym-sim 5,000 requests: whole command / simulate()", "cli.e2e_over_simulate", "abs", "<= 6",
     lambda v: v <= 6),
    ("pdgym-sim, same with plots=false", "cli.e2e_noplots_over_simulate", "abs", "<= 3", lambda v: v <= 3),
    ("pdgym-sim module import (s)", "cli.import_s", "abs", "", None),
    ("Heavy modules (torch, SB3, matplotlib) loaded by importing pdgym-sim", "cli.heavy_modules_at_import",
     "abs", "0", lambda v: v == 0),
    ("BR-0 ms per step, N = 32, pool ~256", "decode.br0_ms_per_step", "abs", "<= 0.1", lambda v: v <= 0.1),
    ("BR-0 ms per step, N = 32, overloaded (pool > 1,500)", "decode.br0_ms_per_step_overload", "abs", "<= 0.1",
     lambda v: v <= 0.1),
    ("BR-H (memo) ms per step, N = 32, pool ~256", "decode.brh_memo_ms_per_step", "abs", "<= 0.25", lambda v: v <= 0.25),
    ("BR-H (memo) ms per step, N = 32, overloaded", "decode.brh_memo_ms_per_step_overload", "abs", "<= 0.25",
     lambda v: v <= 0.25),
    ("BR-H (oracle) ms per step, N = 32, pool ~256", "decode.brh_oracle_ms_per_step", "abs", "", None),
    ("BR-H (oracle) ms per step, N = 32, overloaded", "decode.brh_oracle_ms_per_step_overload", "abs", "", None),
    ("IQR ms per step, N = 32, pool ~256", "decode.iqr_ms_per_step", "abs", "", None),
    ("IQR ms per step, N = 32, overloaded", "decode.iqr_ms_per_step_overload", "abs", "", None),
    ("Least KV ms per step, N = 32, pool ~256", "decode.least_kv_ms_per_step", "abs", "", None),
    ("Least KV ms per step, N = 32, overloaded", "decode.least_kv_ms_per_step_overload", "abs", "", None),
    ("Overload 40k requests, BR-0 wall / least KV wall", "overload.br0_over_least_kv_40k", "abs", "<= 2",
     lambda v: v <= 2),
    ("Overload 40k requests, BR-H wall / least KV wall", "overload.brh_over_least_kv_40k", "abs", "<= 2",
     lambda v: v <= 2),
    ("Overload 40k requests, IQR wall / least KV wall", "overload.iqr_over_least_kv_40k", "abs", "<= 2",
     lambda v: v <= 2),
    ("Overload 40k requests, power of two wall / least KV wall", "overload.power_of_two_over_least_kv_40k", "abs",
     "<= 2", lambda v: v <= 2),
    ("Overload, least KV wall 40k / 10k (4 = linear)", "overload.least_kv_growth_10k_to_40k", "abs", "", None),
    ("Overload, BR-0 wall 40k / 10k", "overload.br0_growth_10k_to_40k", "abs", "", None),
    ("Overload, BR-H wall 40k / 10k", "overload.brh_growth_10k_to_40k", "abs", "", None),
    ("Overload, IQR wall 40k / 10k", "overload.iqr_growth_10k_to_40k", "abs", "", None),
    ("DecodeRouting-v0 steps/s", "decode.env_agent_steps_per_s", "rate", ">= 0.15", lambda r: r >= 0.15),
    ("PrefillDispatch-v0 steps/s (timing mode)", "prefill.env_timing_steps_per_s", "rate", ">= 0.15",
     lambda r: r >= 0.15),
    ("PrefillDispatch-v0 steps/s (allocation mode)", "prefill.env_allocation_steps_per_s", "rate", ">= 0.15",
     lambda r: r >= 0.15),
    ("PhaseBatching-v0 steps/s", "batching.env_steps_per_s_phase", "rate", ">= 0.15", lambda r: r >= 0.15),
    ("CapacityControl-v0 steps/s (fluid model, 3 sub-steps a step)", "capacity.env_steps_per_s", "rate", ">= 0.1",
     lambda r: r >= 0.1),
    ("PPO on DecodeRouting / PPO on CartPole (timesteps/s, 1 process)", "train.ratio_1proc_vs_cartpole", "abs",
     "", None),
    ("Peak memory, 1M requests (MB, own process)", "memory.peak_mb_1m", "abs", "<= 300", lambda v: v <= 300),
    ("Memory per request at 1M (KB)", "memory.kb_per_request", "abs", "", None),
    ("Memory at 1M: interpreter and imports (MB)", "memory.import_mb", "abs", "", None),
    *[(f"Memory at 1M: + {what} (MB, RSS)", f"memory.{key}_mb_1m", "abs", "", None)
      for what, key in (("construction (request table)", "construct"), ("run() (step log, written columns)", "run"),
                        ("SimResult (result frames)", "result"), ("summary() to the peak", "summary_peak"))],
    ("Compiled-core prototype (numba): decode chain, engine's Python s / compiled s",
     "compiled.speedup_numba_vs_engine_chain", "abs", "", None),
    ("Decode chain's share of the Python engine's run (decode tier N = 16)", "compiled.python_decode_chain_frac",
     "abs", "", None),
    ("numba JIT compile on first use (s)", "compiled.numba_jit_compile_s", "abs", "", None),
    *[(f"Scale: bench cluster x {k} ({4 * k} instances), us per request (fixed requests, rate x {k})",
       f"scale.k{k}_us_per_request", "abs", "", None) for k in (1, 4, 16, 64, 256)],
    *[(f"Scale: x {k}, events per request", f"scale.k{k}_events_per_request", "abs", "", None) for k in (1, 256)],
    *[(f"Scale: x {k}, us per event", f"scale.k{k}_us_per_event", "abs", "", None) for k in (1, 256)],
    ("Scale: 1,024 instances, per-request cost / 4 instances'", "scale.k256_cost_vs_k1", "abs", "<= 1.5",
     lambda v: v <= 1.5),
    *[(f"Scale: x {k}, decode tokens per decode step (batch)", f"scale.k{k}_tokens_per_decode_step", "abs", "", None)
      for k in (1, 256)],
    *[(f"Scale, steady (requests x {k} too): us per request", f"scale.steady_k{k}_us_per_request", "abs", "", None)
      for k in (1, 256)],
    *[(f"Scale, steady: x {k}, events per request", f"scale.steady_k{k}_events_per_request", "abs", "", None)
      for k in (1, 256)],
    ("Scale, steady: 1,024 instances, per-request cost / 4 instances'", "scale.steady_k256_cost_vs_k1", "abs",
     "<= 1.5", lambda v: v <= 1.5),
]


def latest(history: Path) -> dict[str, tuple[str, float, float]]:
    """figure -> (time, value, ratio to its own run's CartPole) of the newest row of each figure."""
    out = {}
    with history.open(newline="") as f:
        for row in csv.DictReader(f):
            out[row["figure"]] = (row["time"], float(row["value"]), float(row["ratio_to_cartpole"]))
    return out


def render_table(history: Path, machine: str) -> str:
    """Markdown table of the newest value of every figure in the history (each with its own run's ratio)."""
    figs = latest(history)
    ref = figs.get("ref.cartpole_steps_per_s")
    lines = [f"Machine: {machine}. Each figure is the newest in bench/history.csv, with its ratio to the CartPole",
             "reference of the same run (raw steps/s; the run's time is in the last column).",
             "", "| figure | value | ratio to CartPole | target | met | run (UTC) |", "|---|---:|---:|---|---|---|"]
    if ref:
        lines.insert(2, f"Latest CartPole reference: {ref[1]:,.0f} steps/s ({ref[0]}).")
    for label, key, kind, target, ok in ROWS:
        if key not in figs:
            continue
        t, v, ratio = figs[key]
        judged = ratio if kind == "rate" else v
        met = "" if ok is None else ("yes" if ok(judged) else "**no**")
        shown = f"{ratio:.3f}" if kind == "rate" else ""
        lines.append(f"| {label} | {v:,.4g} | {shown} | {target} | {met} | {t} |")
    return "\n".join(lines)


def write_doc(path: Path, table: str) -> None:
    """Replace the text between the bench markers of `path` (appended at the end if it has none)."""
    write_marked(path, "bench", table, head="# Performance\n")


def history_row(path: Path, stamp: str, machine: str, results: dict[str, float]) -> Path:
    """Append one run to the history CSV (long format: time, machine, figure, value, ratio to CartPole)."""
    ref = results["ref.cartpole_steps_per_s"]
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["time", "machine", "figure", "value", "ratio_to_cartpole"])
        for k, v in results.items():
            w.writerow([stamp, machine, k, f"{v:.6g}", f"{v / ref:.6g}"])
    return path
