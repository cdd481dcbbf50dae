"""Colocated EB+ against disaggregated P:D ratios on the same GPUs (ALGORITHMS.md s5, DESIGN.md s2).

Every setup (a pd_ratio_* scenario: colocated engines or P prefill + D decode instances, one GPU
each) serves every length mix in a closed loop with the same clients per GPU. Throughput is
compared per GPU, so 1P+1D (2 GPUs) ranks with the 4-GPU ratios; EB+ is compared with the best
ratio on the colocated setup of the same GPU count.

decode_kv_exhausted counts, per setup (colocated ones with their policy) and mix, the KV-exhaustion events: requests rejected with
`kv_exhausted` plus preemptions (a decode worker, or a colocated unit, whose KV would overflow
sends its youngest request back to recompute). With workload.trace=PATH the trace's lengths
replace the mixes (one mix, "trace").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import SimResult, Simulator
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.config import LengthConfig
from pdgym.envs.sim.safe_files import save_figure
from tqdm import tqdm

from .harness import Experiment, experiment

KV_EXHAUSTED = R.reason_code("kv_exhausted")


def label(scenario: str) -> str:
    """pd_ratio_3p1d -> 3P+1D; pd_ratio_coloc4 -> coloc4."""
    tail = scenario.removeprefix("pd_ratio_")
    return tail if tail.startswith("coloc") else tail.upper().replace("P", "P+")


def mix_config(scenario: str, gpus: int, mix: dict | None, p, trace: str | None):
    """The scenario's simulator config with the mix's lengths and the study's per-GPU load."""
    ov = [f"workload.num_requests={int(p.requests_per_gpu) * gpus}",
          f"workload.concurrency={int(p.clients_per_gpu) * gpus}", *p.get("overrides", [])]
    if trace:
        ov.append(f"workload.trace={trace}")
    cfg = load_scenario(scenario, ov).sim
    if mix is None:
        return cfg
    wl = dataclasses.replace(cfg.workload, trace=None, prompt=LengthConfig(**dict(mix["prompt"])),
                             output=LengthConfig(**dict(mix["output"])))
    return dataclasses.replace(cfg, workload=wl)


def run_setup(sim_cfg, policy: str | None, seed: int) -> tuple[dict, Simulator]:
    policies = {"batching": make_policy("batching", policy)} if policy else {}
    sim = Simulator(sim_cfg, policies, seed)
    sim.run()
    return SimResult(sim).summary(), sim


def study(p, seed: int, trace: str | None = None, progress: bool = True) -> pd.DataFrame:
    """One row per (mix, setup, policy): rps, rps per GPU, TTFT, TPOT, KV-exhaustion events."""
    mixes = [None] if trace else list(p.mixes)
    setups = ([(s, g, list(p.colocated_policies)) for s, g in p.colocated.items()]
              + [(s, g, [None]) for s, g in p.disaggregated.items()])
    jobs = [(m, s, g, pol) for m in mixes for s, g, pols in setups for pol in pols]
    rows = []
    for mix, scn, gpus, pol in tqdm(jobs, desc="P:D ratio", disable=not progress):
        summary, sim = run_setup(mix_config(scn, int(gpus), mix, p, trace), pol, seed)
        req = sim.req
        rows.append({"mix": mix["label"] if mix else "trace", "setup": label(scn), "scenario": scn,
                     "policy": pol or "disaggregated", "gpus": int(gpus), "rps": summary["rps"],
                     "rps_per_gpu": summary["rps"] / int(gpus), "ttft_mean": summary["ttft_mean"],
                     "tpot_mean": summary["tpot_mean"], "preemptions": int(req.preemptions.sum()),
                     "kv_rejected": int((req.reason == KV_EXHAUSTED).sum()),
                     "eb_plus_mode": getattr(sim.policies["batching"], "mode", "") if pol == "eb_plus" else ""})
    t = pd.DataFrame(rows)
    t["kv_exhausted"] = t.preemptions + t.kv_rejected
    t.insert(0, "name", t.setup + t.policy.map({"eb_plus": " EB+", "mb": " MB"}).fillna(""))
    return t


def fluid_ceiling(gpus: int) -> float:
    """The most a fluid colocated engine (each GPU splits its time between the phases at will, no interference)
    gains per GPU over the best integer P:D split of the same `gpus`, over every length mix: with f the mix's
    prefill share of GPU time, the best split serves max_p min(p / f, (G - p) / (1 - f)) / G of the fluid rate,
    lowest as f -> 0 or 1 (one GPU must serve the phase with no work): (G - 1) / G, a gain of 1 / (G - 1)."""
    return 1.0 / (int(gpus) - 1)


def summarise(t: pd.DataFrame) -> dict:
    """best_pd, eb_plus_vs_best_pd (with the fluid ceiling of its GPU count) and decode_kv_exhausted."""
    mixes = list(dict.fromkeys(t.mix))
    dis = t[t.policy == "disaggregated"]
    best_pd, vs_best, ceiling = {}, {}, {}
    for mix in mixes:
        d = dis[dis.mix == mix]
        best = d.loc[d.rps_per_gpu.idxmax()]
        best_pd[mix] = best.setup
        plus = t[(t.mix == mix) & (t.policy == "eb_plus") & (t.gpus == best.gpus)]
        vs_best[mix] = float(plus.rps_per_gpu.iloc[0] / best.rps_per_gpu - 1) if len(plus) else float("nan")
        ceiling[mix] = fluid_ceiling(best.gpus)
    exhausted = {n: {m: int(g[g.mix == m].kv_exhausted.sum()) for m in mixes} for n, g in t.groupby("name", sort=False)}
    return {"mixes": mixes, "best_pd": best_pd, "eb_plus_vs_best_pd": vs_best, "fluid_ceiling": ceiling,
            "decode_kv_exhausted": exhausted}


@experiment
def run(exp: Experiment) -> dict:
    t = study(exp.p, exp.seed, exp.trace)
    summary = summarise(t)
    order = list(dict.fromkeys(t.name))
    wide = t.pivot(index="name", columns="mix", values="rps_per_gpu").loc[order, summary["mixes"]]
    kvw = t.pivot(index="name", columns="mix", values="kv_exhausted").loc[order, summary["mixes"]]
    exp.table(t, "\n\n".join([
        "requests/s per GPU:\n\n" + wide.to_markdown(floatfmt=".3f"),
        "KV-exhaustion events (preemptions + kv_exhausted rejections):\n\n" + kvw.to_markdown(),
        "best P:D per mix: " + ", ".join(f"{m}: {s}" for m, s in summary["best_pd"].items()),
        "EB+ vs the best P:D (same GPUs, requests/s): " + ", ".join(
            f"{m}: {v:+.1%} (fluid ceiling {summary['fluid_ceiling'][m]:+.0%})"
            for m, v in summary["eb_plus_vs_best_pd"].items()),
        "all runs:\n\n" + t.to_markdown(index=False)]))
    grouped_bars(wide, "requests/s per GPU", exp.figure("rps_per_gpu.png"), best=summary["best_pd"])
    grouped_bars(kvw, "KV-exhaustion events", exp.figure("kv_exhausted.png"))
    summary["rows"] = t.to_dict(orient="records")
    return summary


def grouped_bars(wide: pd.DataFrame, ylabel: str, path: Path, best: dict | None = None) -> Path:
    """Bars grouped by mix (columns of `wide`), one bar per setup (rows); the best P:D per mix starred."""
    mixes, setups = list(wide.columns), list(wide.index)
    x = np.arange(len(mixes))
    w = 0.8 / len(setups)
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(mixes) + 2), 4))
    for i, s in enumerate(setups):
        vals = wide.loc[s].to_numpy(dtype=float)
        bars = ax.bar(x + (i - (len(setups) - 1) / 2) * w, vals, w, label=s)
        for j, m in enumerate(mixes):
            if best and best.get(m) == s:
                ax.annotate("*", (bars[j].get_x() + w / 2, vals[j]), ha="center", va="bottom", fontsize=12)
    ax.set_xticks(x, mixes)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path
