"""The batching study's effects (ALGORITHMS.md s4) on a colocated instance with the piecewise-linear
service curve S(b) = c + a max(0, b - b0):

- chunk-size knee: chunked prefill with budget K alternating with decode; chunk sizes at or above
  K / 4 keep TTFT and throughput flat, smaller ones raise TTFT and the decode stall time;
- FCFS tail collapse: process-to-completion's p99 TTFT explodes near its saturation while
  prefill-first batching at the same rates stays bounded;
- prompt length drives TTFT, output length drives TBT (mean TPOT);
- fixed batching (b tokens, timeout) vs dynamic batching: token cadence (spread of the
  per-token gaps) vs typical completion time.

Calibration: the study's regime (conf/repro/chunk_knee.yaml: c = 20 ms, a = 0.3 ms, b0 = 64,
K = 128, 20-token prompts, 16 output tokens, 15 requests/s). The knee sits where chunk_size drops
below the prompt length; `long_prompt` reruns it with longer prompts to show it move.

decode_stall_s: total duration of prefill-only iterations that ran while some request was
decoding (each held every running decode back for that long). With workload.trace=PATH the
lengths come from the trace.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
from pdgym.agents import plots
from pdgym.baselines import make_policy
from pdgym.envs.sim import simulate
from pdgym.envs.sim.config import LengthConfig
from pdgym.envs.sim.events import PassKind
from tqdm import tqdm

from .harness import Experiment, experiment


def decode_stall_s(res) -> float:
    """Seconds of prefill-only iterations during which at least one request was decoding."""
    s = res.steps
    pre = s[(s.kind == PassKind.COLOCATED) & (s.reqs == 0) & (s.tokens > 0)]
    r = res.requests
    r = r[(r.output > 1) & r.first_token.notna()]
    starts = np.sort(r.first_token.to_numpy())
    ends = np.sort(r.finish.to_numpy())
    t = pre.t.to_numpy()
    decoding = np.searchsorted(starts, t, side="right") - np.searchsorted(ends, t, side="right")
    return float(pre.dur.to_numpy()[decoding > 0].sum())


def run_one(sim_cfg, policy: dict, seed: int):
    return simulate(sim_cfg, {"batching": make_policy("batching", policy)}, seed)


def with_workload(sim_cfg, **changes):
    return dataclasses.replace(sim_cfg, workload=dataclasses.replace(sim_cfg.workload, **changes))


@experiment(within={"min_keep_up": "[0, 1]"})
def run(exp: Experiment) -> dict:
    p, seed, base = exp.p, exp.seed, exp.sim
    trace = base.workload.trace
    knee_t = knee(base, p, seed)
    if base.workload.arrival == "poisson":  # the knee is a claim below saturation: the engine keeps up
        for r in knee_t.itertuples():
            exp.regime(f"chunk {r.chunk_size}", "completions / arrivals per second", r.rps / base.workload.rate,
                       lo=float(p.min_keep_up))
    long_t = None
    if not trace and p.get("long_prompt"):
        mu = float(p.long_prompt)
        long_cfg = with_workload(base, prompt=LengthConfig(dist="gamma", mean=mu, cv=0.5, max=int(8 * mu)),
                                 rate=base.workload.rate * base.workload.prompt.mean / mu)
        long_t = knee(long_cfg, p, seed)
    tail = fcfs_tail(base, p, seed)
    lengths = [] if trace else length_effects(base, p, seed)
    cadence = fixed_vs_dynamic(base, p, seed)
    md = [knee_t.to_markdown(index=False)]
    if long_t is not None:
        md.append(f"\n### knee with {float(p.long_prompt):.0f}-token prompts (same prompt-token load)\n\n"
                  + long_t.assign(ttft_vs_largest=long_t.ttft_mean / long_t.ttft_mean.iloc[-1]).to_markdown(index=False))
    for title, rows in (("FCFS tail vs prefill-first", tail), ("length effects", lengths),
                        ("fixed vs dynamic batching", cadence)):
        if rows:
            md.append(f"\n### {title}\n\n" + pd.DataFrame(rows).to_markdown(index=False))
    exp.table(knee_t, "\n".join(md))
    rel = {f"{name} / largest chunk": (knee_t[col] / knee_t[col].iloc[-1]).tolist()
           for name, col in (("mean TTFT", "ttft_mean"), ("decode stall", "decode_stall_s"),
                             ("throughput", "throughput"))}
    if long_t is not None:
        rel[f"mean TTFT / largest, {float(p.long_prompt):.0f}-token prompts"] = (
            long_t.ttft_mean / long_t.ttft_mean.iloc[-1]).tolist()
    plots.lines(knee_t.chunk_size.tolist(), rel, f"chunk size (K = {int(p.K)})", "relative to the largest chunk",
                exp.figure("chunk_knee.png"))
    t = pd.DataFrame(tail)
    plots.lines(t.rho.tolist(), {"fcfs p99 TTFT": t.fcfs_ttft_p99.tolist(),
                                 "prefill_first p99 TTFT": t.prefill_first_ttft_p99.tolist()},
                "load (fraction of FCFS capacity)", "p99 TTFT (s)", exp.figure("fcfs_tail.png"))
    return {"chunk_size": knee_t.chunk_size.tolist(), "ttft_mean": knee_t.ttft_mean.tolist(),
            "throughput": knee_t.throughput.tolist(), "decode_stall_s": knee_t.decode_stall_s.tolist(),
            "K": int(p.K), "fcfs_tail": tail, "length_effects": lengths, "fixed_vs_dynamic": cadence,
            "knee_long_prompt": None if long_t is None else long_t.to_dict(orient="records")}


def knee(base, p, seed: int) -> pd.DataFrame:
    """Chunked prefill at each chunk size under budget K: TTFT, throughput, decode stall."""
    rows = []
    for cs in tqdm(list(p.chunk_sizes), desc="chunk sizes"):
        res = run_one(base, {"name": "chunked", "chunk_size": int(cs), "K": int(p.K)}, seed)
        m = res.summary()
        rows.append({"chunk_size": int(cs), "rps": m["rps"], "ttft_mean": m["ttft_mean"], "ttft_p99": m["ttft_p99"],
                     "throughput": m["throughput_tok_s"], "decode_stall_s": decode_stall_s(res),
                     "tpot_mean": m["tpot_mean"]})
    return pd.DataFrame(rows)


def fcfs_tail(base, p, seed: int) -> list[dict]:
    """p99 TTFT of FCFS and prefill-first at fractions of FCFS's capacity (one client alone = its service rate)."""
    one = with_workload(base, arrival="closed", concurrency=1, num_requests=int(p.tail_requests) // 4)
    cap = run_one(one, {"name": "fcfs"}, seed).summary()["rps"]
    rows = []
    for rho in tqdm(list(p.tail_loads), desc="FCFS tail"):
        sim_cfg = with_workload(base, arrival="poisson", rate=float(rho) * cap, num_requests=int(p.tail_requests))
        row = {"rho": float(rho), "rate": float(rho) * cap}
        for pol in ("fcfs", "prefill_first"):
            row[f"{pol}_ttft_p99"] = run_one(sim_cfg, {"name": pol}, seed).summary()["ttft_p99"]
        rows.append(row)
    return rows


def length_effects(base, p, seed: int) -> list[dict]:
    """Mean TTFT and TPOT of chunked prefill (chunk K) when the mean prompt, then the mean output, grows."""
    rows = []
    pol = {"name": "chunked", "chunk_size": int(p.K), "K": int(p.K)}
    wl = base.workload
    for what, values in (("prompt", p.prompt_means), ("output", p.output_means)):
        for v in values:
            v = float(v)
            if what == "prompt":
                sim_cfg = with_workload(base, prompt=LengthConfig(dist="gamma", mean=v, cv=0.5, max=int(8 * v)))
            else:
                sim_cfg = with_workload(base, output=LengthConfig(dist="geometric", mean=v, max=int(20 * v)))
            m = run_one(sim_cfg, pol, seed).summary()
            rows.append({"varied": what, "mean": v, "ttft_mean": m["ttft_mean"], "tpot_mean": m["tpot_mean"],
                         "base_prompt": wl.prompt.mean, "base_output": wl.output.mean})
    return rows


def token_gaps(res) -> np.ndarray:
    """Every output token's gap since the request's previous token, from the decode iterations of a
    one-unit engine: each decode iteration gives each running request a token, so its gap since the
    previous decode iteration counts once per request it served."""
    s = res.steps
    d = s[(s.kind == PassKind.COLOCATED) & (s.reqs > 0)]
    ends = (d.t + d.dur).to_numpy()
    return np.repeat(np.diff(ends), d.reqs.to_numpy()[1:].astype(int))


def fixed_vs_dynamic(base, p, seed: int) -> list[dict]:
    """Token cadence (spread of the per-token gaps) and completion time of fixed vs dynamic batching,
    at each arrival rate of `cadence_rates` (null: the scenario's)."""
    rows = []
    specs = [{"name": "fixed", "b": int(b), "timeout_s": float(p.fixed_timeout_s)} for b in p.fixed_b]
    specs.append({"name": "dynamic"})
    rates = [float(r) for r in p.get("cadence_rates") or [base.workload.rate]]
    for rate, spec in tqdm([(r, s) for r in rates for s in specs], desc="fixed vs dynamic"):
        res = run_one(with_workload(base, rate=rate), spec, seed)
        r = res.requests[res.requests.status == "finished"]
        g = token_gaps(res)
        label = spec["name"] + (f"(b={spec['b']})" if "b" in spec else "")
        rows.append({"rate": rate, "policy": label, "tbt_mean": float(g.mean()), "tbt_p50": float(np.median(g)),
                     "tbt_p95": float(np.percentile(g, 95)), "tbt_cv": float(g.std() / g.mean()),
                     "ttft_mean": float(r.ttft.mean()), "e2e_mean": float(r.e2e.mean()),
                     "e2e_p50": float(r.e2e.median()), "e2e_p95": float(r.e2e.quantile(0.95)),
                     "throughput": res.summary()["throughput_tok_s"]})
    return rows
