"""EB* vs MB across hardware (ALGORITHMS.md s5): the gain of exclusive batching grows as bandwidth shrinks.

For each model and hardware, the scenario coloc_<hardware>_<model> (closed loop on Azure
conversation lengths, or workload.trace=PATH) runs MB, EB* and EB+; gain = rps(EB*) / rps(MB) - 1.
Also: the best fixed-theta EB (is a miss EB*'s controller or the cost model?); gains with a
hardware's mixed-batch interference changed (`interference_sensitivity`); TTFT / TPOT of both
at open-loop loads (Poisson at `loads` x MB's closed-loop rate) and in the closed loop; and the
gain against the decode ratio r = mu_O / (mu_L + mu_O) on synthetic lengths.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from pdgym.agents import plots
from pdgym.baselines import make_policy
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import simulate
from pdgym.envs.sim.config import LengthConfig
from pdgym.envs.sim.safe_files import save_figure
from tqdm import tqdm

from .harness import Experiment, experiment
from .measure import workload_lengths

POLICIES = ("mb", "eb_star", "eb_plus")


def overrides_from(cfg) -> list[str]:
    """Overrides every scenario of this study takes from the command line (trace, request count)."""
    ov = [f"workload.num_requests={int(cfg.repro.num_requests)}"]
    if cfg.workload.get("trace"):
        ov.append(f"workload.trace={cfg.workload.trace}")
    return ov


def run_set(sim_cfg, seed: int, policies=POLICIES) -> dict[str, dict]:
    return {p: simulate(sim_cfg, {"batching": make_policy("batching", p)}, seed).summary() for p in policies}


@experiment(within={"min_decode_ratio": "[0, 1]"})
def run(exp: Experiment) -> dict:
    p, cfg = exp.p, exp.cfg
    seed = exp.seed
    ov = overrides_from(cfg)
    rows, tradeoff = [], []
    prompts, outputs = workload_lengths(exp.sim, seed)
    exp.regime("workload", "decode ratio mu_O / (mu_L + mu_O)", outputs.mean() / (prompts.mean() + outputs.mean()),
               lo=float(p.min_decode_ratio))
    jobs = [(m, hw) for m in p.models for hw in p.hardware]
    for model, hw in tqdm(jobs, desc="hardware x model"):
        sim_cfg = load_scenario(f"coloc_{hw}_{model}", ov).sim
        res = run_set(sim_cfg, seed)
        row = gain_row(model, hw, res)
        if model == p.models[0]:
            row.update(best_fixed_eb(sim_cfg, seed, p.fixed_thetas, res))
            tradeoff += load_sweep(sim_cfg, seed, p.loads, hw, res)
        rows.append(row)
    for hw, itf in (p.get("interference_sensitivity") or {}).items():
        sim_cfg = load_scenario(f"coloc_{hw}_{p.models[0]}", ov).sim
        sim_cfg = dataclasses.replace(sim_cfg, hardware={**sim_cfg.hardware, "interference": float(itf)})
        rows.append(gain_row(p.models[0], f"{hw} (interference {float(itf):g})", run_set(sim_cfg, seed)))
    table = pd.DataFrame(rows)
    trade = pd.DataFrame(tradeoff)
    ratio = decode_ratio_sweep(cfg, seed)
    exp.csv(trade, "tradeoff.csv")
    exp.csv(ratio, "decode_ratio.csv")
    exp.table(table, "\n\n".join([
        table.to_markdown(index=False),
        "TTFT / TPOT of EB* and MB, open loop at fractions of MB's closed-loop rate (load 1 = the closed "
        "loop itself, saturated):\n\n" + trade.to_markdown(index=False),
        "Gain against decode ratio:\n\n" + ratio.to_markdown(index=False)]))
    main = table[(table.model == p.models[0]) & table.hardware.isin(list(p.hardware))]
    for model in p.models:
        t = table[table.model == model]
        plots.bars(dict(zip(t.hardware, 100 * t.gain)), f"EB* over MB, requests/s (%) — {model}",
                   exp.figure(f"gain_{model}.png"))
    tradeoff_plot(trade[trade.load == 1.0], exp.figure("ttft_tpot.png"))
    loads = sorted(trade.load.unique())
    plots.lines(loads, {hw: [float(trade[(trade.hardware == hw) & (trade.load == x)].tpot_ratio.iloc[0])
                             for x in loads] for hw in p.hardware},
                "load (fraction of MB's closed-loop rate; 1 = closed loop)", "mean TPOT, EB* / MB",
                exp.figure("tpot_ratio_vs_load.png"))
    plots.lines(ratio.decode_ratio.tolist(), {c.removeprefix("gain_"): (100 * ratio[c]).tolist()
                                              for c in ratio.columns if c.startswith("gain_")},
                "decode ratio mu_O / (mu_L + mu_O)", "EB* over MB (%)", exp.figure("gain_vs_decode_ratio.png"))
    gain_by_model = {m: dict(zip(g.hardware, g.gain)) for m, g in table.groupby("model", sort=False)}
    return {"gain": dict(zip(main.hardware, main.gain)), "model": str(p.models[0]),
            "gain_by_model": gain_by_model, "rows": rows, "tradeoff": tradeoff,
            "decode_ratio": ratio.to_dict(orient="records")}


def gain_row(model: str, hw: str, res: dict) -> dict:
    mb, star, plus = res["mb"], res["eb_star"], res["eb_plus"]
    return {"model": model, "hardware": hw, "rps_mb": mb["rps"], "rps_eb_star": star["rps"],
            "rps_eb_plus": plus["rps"], "gain": star["rps"] / mb["rps"] - 1,
            "eb_plus_frac_of_better": plus["rps"] / max(mb["rps"], star["rps"])}


def best_fixed_eb(sim_cfg, seed: int, thetas, res: dict) -> dict:
    """The best EB(theta) over a grid: separates EB*'s controller from the EB-vs-MB gap of the cost model."""
    rps = {float(t): simulate(sim_cfg, {"batching": make_policy("batching", {"name": "eb", "theta": float(t)})},
                              seed).summary()["rps"] for t in thetas}
    best = max(rps, key=rps.get)
    return {"best_fixed_theta": best, "rps_best_fixed_eb": rps[best], "gain_best_fixed_eb": rps[best] / res["mb"]["rps"] - 1,
            "eb_star_frac_of_best_fixed": res["eb_star"]["rps"] / rps[best]}


def load_sweep(sim_cfg, seed: int, loads, hw: str, closed: dict) -> list[dict]:
    """TTFT / TPOT of MB and EB* in open loop (Poisson at each load x MB's closed-loop rate), and in
    the closed loop itself (load 1): EB's lower TPOT is a property of the saturated engine."""
    rows = []
    for load in [float(x) for x in loads] + [1.0]:
        if load < 1.0:
            wl = dataclasses.replace(sim_cfg.workload, arrival="poisson", rate=load * closed["mb"]["rps"], phases=None)
            res = run_set(dataclasses.replace(sim_cfg, workload=wl), seed, ("mb", "eb_star"))
        else:
            res = closed
        mb, star = res["mb"], res["eb_star"]
        rows.append({"hardware": hw, "load": load, "ttft_mb": mb["ttft_mean"], "ttft_eb_star": star["ttft_mean"],
                     "tpot_mb": mb["tpot_mean"], "tpot_eb_star": star["tpot_mean"],
                     "ttft_ratio": star["ttft_mean"] / mb["ttft_mean"], "tpot_ratio": star["tpot_mean"] / mb["tpot_mean"]})
    return rows


def decode_ratio_sweep(cfg, seed: int) -> pd.DataFrame:
    """EB* over MB against r = mu_O / (mu_L + mu_O): gamma prompts of mean mu_L, geometric outputs.

    With `ratio_alt_bound` also EB* with that memory-safe bound (column gain_<hw>_<bound>): at high r
    on a small KV the probabilistic bound's headroom nu ln(1/eps) (nu = mu_O^2 / mu_L) nears the
    whole capacity and caps N at a few requests.
    """
    p = cfg.repro
    alt = p.get("ratio_alt_bound")
    mu_l = float(p.ratio_prompt)
    rows = {float(r): {"decode_ratio": float(r), "mu_o": round(float(r) / (1 - float(r)) * mu_l)} for r in p.ratios}
    for hw in tqdm(p.ratio_hardware, desc="decode-ratio sweep"):
        base = load_scenario(f"coloc_{hw}_{p.models[0]}", [f"workload.num_requests={int(p.ratio_requests)}"]).sim
        for row in rows.values():
            wl = dataclasses.replace(base.workload, trace=None,
                                     prompt=LengthConfig(dist="gamma", mean=mu_l, cv=0.5, max=int(8 * mu_l)),
                                     output=LengthConfig(dist="geometric", mean=row["mu_o"], max=20 * row["mu_o"]))
            sim_cfg = dataclasses.replace(base, workload=wl)
            res = run_set(sim_cfg, seed, ("mb", "eb_star"))
            row[f"gain_{hw}"] = res["eb_star"]["rps"] / res["mb"]["rps"] - 1
            if alt:
                s = simulate(sim_cfg, {"batching": make_policy("batching", {"name": "eb_star", "bound": alt})}, seed)
                row[f"gain_{hw}_{alt}"] = s.summary()["rps"] / res["mb"]["rps"] - 1
    return pd.DataFrame(list(rows.values()))


def tradeoff_plot(trade: pd.DataFrame, path: Path) -> None:
    """Mean TTFT against mean TPOT, one MB and one EB* point per hardware (rows of `trade`)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for pol, marker in (("mb", "o"), ("eb_star", "s")):
        ax.scatter(trade[f"tpot_{pol}"], trade[f"ttft_{pol}"], marker=marker, label=pol)
        for _, r in trade.iterrows():
            ax.annotate(r.hardware, (r[f"tpot_{pol}"], r[f"ttft_{pol}"]), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean TPOT (s)")
    ax.set_ylabel("mean TTFT (s)")
    ax.set_title("closed loop (saturated)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
