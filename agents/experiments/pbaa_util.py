"""Batching + PBAA on vs off (ALGORITHMS.md s2; SBS Table 1) at a fixed mean-TTFT target, chunk 3K and 5K.

"on" is SBS with PBAA; the headline "off" is the paper's Table 1 "Off": immediate dispatch (the
engine default, each arrival sent at once to the instances in turn). The ablations keep SBS's
staggered batching and switch only PBAA off: the released batch spread over the target's DP units
first fit (arrival order, first unit whose C_avail fits, never holding back) or round robin (no
capacity model). For each scenario (chunk size, with its own TTFT target: 0.8 s at 3K, 1.0 s at 5K
as in the paper) and variant, bisect for the largest Poisson rate whose seed-mean TTFT stays within
the target (every request served: flow control throttles instead of rejecting), then record the
prefill chunk utilisation (prefill tokens per pass / (DP units x chunk), mean over passes) there.

Regime: a max-QPS point is in regime when its rejections stay under 1% (the bisection's own rule), the
bisection bracketed the rate, and the rate lies below the variant's saturated throughput
(`capacity_requests` at 1.5 x the full-chunk rate; the max QPS is capped there and flagged, since a
finite run can meet the target above it). A scenario is in regime when at most `max_over_chunk` of its
prompts are longer than its chunk (the paper's prompts are 0-3K, so none is): a longer prompt runs on as
a continuation pass with one DP unit busy and the rest idle, which lowers both variants' utilisation for
a reason that is not the dispatch (sbs_ttft checks the same).

Pass-time sensitivity (`pass_time_mfu`): the headline on/off pair again on the first scenario with the
hardware's achievable FLOP fraction (`hardware.mfu`) lowered, so that a full-chunk pass takes a larger
share of the TTFT target. The paper's gain needs immediate dispatch to miss the target while its passes
are still far from full; when a full pass is short against the target, immediate dispatch keeps the
target up to near saturation, where its passes are full too (the reason, not a tuning: the headline
stays at the hardware's committed mfu). `pass_time_measured` adds the point at the mfu that real kernels
reach on this very pass: one device's share of a full-chunk pass timed on a Hopper GPU
(calibration.implied_mfu; data/calibration/h200_ds_v3_prefill_slice.csv).

Summary: chunk_util_off, chunk_util_on, qps_gain (max QPS on / immediate - 1) for the first scenario
(+ by_chunk: every variant per scenario, with utilisation of all at immediate's max QPS; pass_time: per mfu,
its source (hardware profile, assumed, measured), full_pass_s, full_pass_over_target and the headline three).
"""

from __future__ import annotations

import pandas as pd
from pdgym.agents import plots
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError
from pdgym.envs.sim.hardware import load_hardware
from tqdm import tqdm

from .calibration import implied_mfu
from .harness import Experiment, experiment, rising
from .measure import at_rate, bracketed, full_pass_s, over_chunk, peak_rate, prefill_capacity, run_point


def max_qps(exp: Experiment, point: str, sim_cfg, spec, target: float, rate_lo: float) -> float:
    """The largest rate whose seed-mean TTFT meets `target` (bisection), capped at the variant's saturated
    throughput (`prefill_capacity`): above it the run meets the target only because it ends before its backlog
    is seen. Checked: the bisection bracketed the rate and did not reach the cap (a capped max QPS is the
    cluster's capacity, not the TTFT-limited rate the paper compares)."""
    p = exp.p
    qps = peak_rate(sim_cfg, spec, target, int(p.num_requests), exp.seeds, rate_lo, float(p.rate_hi),
                    iters=int(p.iters))
    exp.regime(point, "max QPS bracketed by the bisection", bracketed(qps, float(p.rate_hi)), lo=1)
    cap = prefill_capacity(sim_cfg, spec, int(p.capacity_requests), exp.seeds)
    exp.regime(point, "max QPS (bisection) / saturated throughput", qps / cap, hi=1.0)
    return min(qps, cap)


def checks(p) -> None:
    """Search bounds in order; and a measured pass for `pass_time_measured` (it failed only after every bisection
    had run, with a scenario whose chunk was not measured)."""
    rising(("rate_lo", "rate_hi"))(p)
    if p.get("pass_time_measured"):
        scen = str(p.scenarios[0])
        try:
            implied_mfu(load_scenario(scen, []).sim)
        except ConfigError as e:
            raise ConfigError(f"repro.pass_time_measured: the first scenario, {scen}, has no measured pass: {e}; "
                              "set it false or measure one (data/calibration/SOURCES.md)") from None


@experiment(may_be_empty=("ablations", "pass_time_mfu"), check=checks, within={"max_over_chunk": "[0, 1]"})
def run(exp: Experiment) -> dict:
    p = exp.p
    seeds = exp.seeds
    base = exp.spec(p.sbs)
    variants = {"on": {**base, "allocation": "pbaa"}, "off": exp.spec(p.immediate),
                **{f"sbs_{a}": {**base, "allocation": a} for a in p.ablations}}
    targets = {str(k): float(v) for k, v in p.ttft_target_s.items()}
    missing = [s for s in p.scenarios if s not in targets]
    if missing:
        raise ConfigError(f"repro.ttft_target_s: no target for scenario(s) {', '.join(missing)}; "
                          f"give one per entry of repro.scenarios (has: {', '.join(targets)})")
    for scen in p.scenarios:  # the run's own requests: num_requests of the scenario's workload
        sim_cfg = exp.scenario(scen)
        exp.regime(f"{scen} prompts", *over_chunk(at_rate(sim_cfg, sim_cfg.workload.rate, int(p.num_requests)),
                                                  exp.seed), hi=float(p.max_over_chunk))
    rows = []
    jobs = [(s, v) for s in p.scenarios for v in variants]
    for scen, label in tqdm(jobs, desc="pbaa_util"):
        sim_cfg = exp.scenario(scen)
        qps = max_qps(exp, f"{scen} {label}", sim_cfg, variants[label], targets[scen], float(p.rate_lo))
        m = run_point(sim_cfg, variants[label], qps, int(p.num_requests), seeds)
        exp.regime(f"{scen} {label}", "rejected share at max QPS", m["rejected"] / int(p.num_requests), hi=0.01)
        rows.append({"scenario": scen, "chunk": sim_cfg.cluster.prefill.chunk_tokens, "variant": label,
                     "ttft_target_s": targets[scen], "max_qps": qps, **m})
    table = pd.DataFrame(rows)
    # Every variant at immediate dispatch's max QPS too (same load, same traffic).
    same = []
    for scen in p.scenarios:
        sim_cfg = exp.scenario(scen)
        q = float(table[(table.scenario == scen) & (table.variant == "off")].max_qps.iloc[0])
        for label in variants:
            m = run_point(sim_cfg, variants[label], q, int(p.num_requests), seeds)
            same.append({"scenario": scen, "variant": label, "rate": q, "chunk_util_mean": m["chunk_util_mean"],
                         "ttft_mean": m["ttft_mean"]})
    same = pd.DataFrame(same)
    exp.table(table,
              "Max QPS with mean TTFT <= the target (3K: 0.8 s, 5K: 1.0 s), and the chunk utilisation there "
              "(off = immediate dispatch; sbs_* = SBS with PBAA switched off):\n\n"
              + table.round(4).to_markdown(index=False)
              + "\n\nAt the same rate (immediate dispatch's max QPS):\n\n" + same.round(4).to_markdown(index=False))
    util = {f"{r.chunk // 1024}K {r.variant}": r.chunk_util_mean for r in table.itertuples()}
    plots.bars(util, "prefill chunk utilisation at max QPS", exp.figure("chunk_util.png"))
    plots.bars({f"{r.chunk // 1024}K {r.variant}": r.max_qps for r in table.itertuples()},
               "max QPS (mean TTFT <= target)", exp.figure("max_qps.png"))

    def get(scen, label, key, t=table):
        return float(t[(t.scenario == scen) & (t.variant == label)][key].iloc[0])

    by_chunk = {}
    for scen in p.scenarios:
        chunk = int(table[table.scenario == scen].chunk.iloc[0])
        by_chunk[str(chunk)] = {
            "scenario": scen, "ttft_target_s": targets[scen],
            "max_qps": {v: get(scen, v, "max_qps") for v in variants},
            "chunk_util": {v: get(scen, v, "chunk_util_mean") for v in variants},
            "qps_gain": {v: get(scen, "on", "max_qps") / get(scen, v, "max_qps") - 1 for v in variants if v != "on"},
            "chunk_util_same_rate": {v: get(scen, v, "chunk_util_mean", same) for v in variants},
        }
    s0 = p.scenarios[0]
    pass_time = [{"mfu": load_hardware(exp.scenario(s0).hardware).mfu, "source": "hardware profile",
                  "full_pass_s": full_pass_s(exp.scenario(s0)),
                  "chunk_util_off": get(s0, "off", "chunk_util_mean"), "chunk_util_on": get(s0, "on", "chunk_util_mean"),
                  "qps_gain": get(s0, "on", "max_qps") / get(s0, "off", "max_qps") - 1}]
    mfus = [(float(m), "assumed") for m in p.get("pass_time_mfu") or []]
    if p.get("pass_time_measured"):
        mfus.append((implied_mfu(exp.scenario(s0)), "measured"))
    for mfu, source in tqdm(sorted(mfus, reverse=True), desc="pbaa_util pass time"):
        sim_cfg = exp.scenario(s0, (f"hardware.mfu={mfu}",))
        point = {"mfu": mfu, "source": source, "full_pass_s": full_pass_s(sim_cfg)}
        qps = {}
        for label in ("off", "on"):
            qps[label] = max_qps(exp, f"mfu {mfu:.3g} {label}", sim_cfg, variants[label], targets[s0], 1.0)
            point[f"chunk_util_{label}"] = run_point(sim_cfg, variants[label], qps[label], int(p.num_requests),
                                                     seeds)["chunk_util_mean"]
        point["qps_gain"] = qps["on"] / qps["off"] - 1 if qps["off"] > 0 else float("nan")
        pass_time.append(point)
    for point in pass_time:
        point["full_pass_over_target"] = point["full_pass_s"] / targets[s0]
    if len(pass_time) > 1:
        x = [pt["full_pass_over_target"] for pt in pass_time]
        plots.lines(x, {"utilisation off (immediate)": [pt["chunk_util_off"] for pt in pass_time],
                        "utilisation on (SBS + PBAA)": [pt["chunk_util_on"] for pt in pass_time],
                        "max QPS gain": [pt["qps_gain"] for pt in pass_time]},
                    f"full-chunk pass time / TTFT target ({targets[s0]} s)", "at max QPS",
                    exp.figure("pass_time_sensitivity.png"),
                    marks={f"{pt['source']}, mfu {pt['mfu']:.2f}": pt["full_pass_over_target"] for pt in pass_time
                           if pt["source"] != "assumed"})
    return {"chunk_util_off": get(s0, "off", "chunk_util_mean"), "chunk_util_on": get(s0, "on", "chunk_util_mean"),
            "qps_gain": get(s0, "on", "max_qps") / get(s0, "off", "max_qps") - 1, "off": "immediate dispatch",
            "by_chunk": by_chunk, "pass_time": pass_time}
