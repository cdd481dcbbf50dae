"""Prefix caching on the Mooncake conversation trace: hit ratio and TTFT per router, against load and cache size.

Claims judged (docs/fidelity.md, conf/fidelity.yaml):
- SBS (arXiv 2512.16134, Alg. 2): cache-aware PBAA, Cap = C_avail(d) - (L(r) - L_hit(r, d)), raises
  prefix hits and cuts redundant prefill against basic PBAA at equal throughput.
- SGLang router (cache_aware): more hits and throughput than round robin.
- Mooncake (FAST'25, s5): routing by estimated TTFT over cached prefixes cuts TTFT against cache-blind
  load balancing.

Regime: the load is the offered rate over the saturated rate of a cache-blind dispatcher (least_tokens,
a burst of `capacity_requests` rows at 20x the scenario rate: its finished requests per second of prefill
makespan), checked in [load_lo, load_hi]; cache pressure is the blocks evicted per block inserted
(0: the cache never filled, so no rule or router decision about it matters), checked >= min_pressure at
the headline load. Every comparison uses the same rows and seeds for every router (paired).
"""

from __future__ import annotations

import dataclasses

import pandas as pd
from pdgym.agents import plots
from pdgym.baselines import make_policies
from pdgym.envs.sim import simulate
from pdgym.envs.sim.engine import Simulator
from pdgym.envs.sim.metrics import SimResult
from tqdm import tqdm

from .harness import Experiment, experiment

CACHE_BLIND = ("round_robin", "jsq", "least_tokens")


def _with(sim_cfg, rate: float | None = None, n: int | None = None, cache_tokens: int | None | str = "keep"):
    wl = sim_cfg.workload
    wl = dataclasses.replace(wl, rate=wl.rate if rate is None else float(rate),
                             num_requests=wl.num_requests if n is None else int(n))
    cl = sim_cfg.cluster
    if cache_tokens != "keep":
        cl = dataclasses.replace(cl, prefill=dataclasses.replace(cl.prefill, cache_tokens=cache_tokens))
    return dataclasses.replace(sim_cfg, workload=wl, cluster=cl)


def capacity_rps(sim_cfg, n: int, seed: int) -> float:
    """Requests per second a cache-blind dispatcher finishes in a burst: the denominator of every load."""
    res = simulate(_with(sim_cfg, rate=20 * float(sim_cfg.workload.rate), n=n), make_policies({"prefill": "least_tokens"}),
                   seed=seed)
    r = res.requests[res.requests.status == "finished"]
    return len(r) / float(r.first_token.max() - r.arrival.min())


def run_one(sim_cfg, policy, seed: int) -> dict:
    """One run's summary plus its cache pressure (evicted / inserted blocks over every unit)."""
    sim = Simulator(sim_cfg, make_policies({"prefill": policy}), seed=seed)
    sim.run()
    res = SimResult(sim)
    s = res.summary()
    units = [c for p in sim.prefill for c in (p.bcaches or ())]
    inserted = sum(c.inserted for c in units)
    s["pressure"] = (s["cache_evictions"] / inserted) if inserted else 0.0
    return s


def _label(spec) -> str:
    return spec if isinstance(spec, str) else spec.get("label", spec["name"])


def _policy(spec):
    if isinstance(spec, str):
        return spec
    return {k: v for k, v in spec.items() if k != "label"}


@experiment(within={"loads": "(0, 2)", "load": "(0, 2)", "cache_scales": "[0, 100]", "load_lo": "(0, 1)",
                    "load_hi": "(0, 2)", "min_pressure": "[0, 1]"})
def run(exp: Experiment) -> dict:
    p = exp.p
    base = exp.sim
    cap = capacity_rps(base, int(p.capacity_requests), exp.seeds[0])
    routers = [exp.spec(r) for r in p.routers]
    n = int(p.num_requests)
    rows = []
    jobs = [(float(load), None, r) for load in p.loads for r in routers]
    cache_routers = [r for r in routers if _label(r) in list(p.cache_routers)]
    jobs += [(float(p.load), float(sc), r) for sc in p.cache_scales for r in cache_routers]
    default_cache = Simulator(_with(base, n=n), {}, seed=0).cache_capacity_tokens
    for load, scale, spec in tqdm(jobs, desc="prefix_cache runs"):
        ct = "keep" if scale is None else int(scale * default_cache)
        cfg = _with(base, rate=load * cap, n=n, cache_tokens=ct)
        for seed in exp.seeds:
            s = run_one(cfg, _policy(spec), seed)
            rows.append({"router": _label(spec), "load": load, "cache_scale": 1.0 if scale is None else scale,
                         "sweep": "load" if scale is None else "cache", "seed": seed, **s})
    df = pd.DataFrame(rows)
    exp.csv(df, "runs.csv")
    keys = ["ttft_mean", "ttft_p99", "prefix_hit_ratio", "recomputed_tokens", "throughput_tok_s", "rps", "pressure",
            "rejected"]
    table = df.groupby(["sweep", "load", "cache_scale", "router"], sort=False)[keys].mean().reset_index()
    exp.table(table)

    headline = float(p.load)
    for load in sorted(set(df.load)):
        tag = "headline" if load == headline else "sweep"
        exp.regime(f"{tag} load {load}", "offered rate / cache-blind saturated rate", load,
                   lo=float(p.load_lo), hi=float(p.load_hi))
    head = df[(df.sweep == "load") & (df.load == headline)]
    exp.regime("headline", "cache pressure (evicted / inserted blocks)", head.pressure.mean(), lo=float(p.min_pressure))
    exp.regime("headline", "requests rejected (flow control)", head.rejected.sum(), hi=0.0,
               note="(an overloaded SBS sheds load: its throughput is not comparable)")

    def paired(metric: str, a: str, b: str) -> float:
        """Mean over seeds of metric(a) / metric(b) at the headline load (same rows and seeds)."""
        ga = head[head.router == a].set_index("seed")[metric]
        gb = head[head.router == b].set_index("seed")[metric]
        return float((ga / gb).mean())

    blind = {r: float(head[head.router == r].ttft_mean.mean()) for r in CACHE_BLIND if r in set(head.router)}
    best_blind = min(blind, key=blind.get)
    summary = {
        "capacity_rps": cap, "rates": {str(ld): ld * cap for ld in sorted(set(df.load))},
        "default_cache_tokens": int(default_cache), "num_requests": n, "seeds": list(exp.seeds),
        "best_cache_blind": best_blind,
        "ttft_ratio_cache_ttft_blind": paired("ttft_mean", "cache_ttft", best_blind),
        "hit_ratio_cache_ttft": float(head[head.router == "cache_ttft"].prefix_hit_ratio.mean()),
        "hit_ratio_best_blind": float(head[head.router == best_blind].prefix_hit_ratio.mean()),
        "hit_gain_sbs_cache": paired("prefix_hit_ratio", "sbs_cache", "sbs"),
        "recomputed_ratio_sbs_cache": paired("recomputed_tokens", "sbs_cache", "sbs"),
        "throughput_ratio_sbs_cache": paired("throughput_tok_s", "sbs_cache", "sbs"),
        "hit_gain_sglang_rr": paired("prefix_hit_ratio", "sglang_cache", "round_robin"),
        "throughput_ratio_sglang_rr": paired("throughput_tok_s", "sglang_cache", "round_robin"),
        "ttft_ratio_sglang_rr": paired("ttft_mean", "sglang_cache", "round_robin"),
    }
    _figures(exp, table, headline)
    return summary


def _figures(exp: Experiment, table: pd.DataFrame, headline: float) -> None:
    lt = table[table.sweep == "load"]
    loads = sorted(set(lt.load))
    for metric, name, ylabel in (("ttft_mean", "ttft_vs_load.png", "mean TTFT (s)"),
                                 ("prefix_hit_ratio", "hits_vs_load.png", "prefix hit ratio (tokens)")):
        series = {r: [float(g[g.load == ld][metric].iloc[0]) for ld in loads] for r, g in lt.groupby("router", sort=False)}
        plots.lines(loads, series, "load (offered / cache-blind saturated rate)", ylabel, exp.figure(name),
                    marks={"headline": headline})
    ct = table[table.sweep == "cache"]
    if len(ct):
        scales = sorted(set(ct.cache_scale))
        series = {r: [float(g[g.cache_scale == sc].prefix_hit_ratio.iloc[0]) for sc in scales]
                  for r, g in ct.groupby("router", sort=False)}
        plots.lines(scales, series, "cache capacity (x HBM-derived default)", "prefix hit ratio (tokens)",
                    exp.figure("hits_vs_capacity.png"))
