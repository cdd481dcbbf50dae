"""PBAA on vs off inside SBS (ALGORITHMS.md s2) at a fixed mean-TTFT target, chunk 3K and 5K.

For each scenario (chunk size) and allocation ("on": PBAA; "off": SBS with PBAA switched off,
the released batch spread over the target's DP units round robin or first fit), bisect for
the largest Poisson rate whose seed-mean TTFT stays within `ttft_target_s` (every request
served: flow control throttles instead of rejecting), then record the prefill chunk
utilisation (prefill tokens per pass / (DP units x chunk), mean over passes) at that rate.

Summary: chunk_util_off, chunk_util_on, qps_gain (max QPS on / off - 1), for the first
scenario and the `off` allocation (+ by_chunk: the same per scenario and per off variant,
and max_qps, and utilisation of both at the off variant's max QPS).
"""

from __future__ import annotations

import pandas as pd
from pdgym.agents import plots
from pdgym.agents.common import sim_config_from
from pdgym.envs.scenario import load_scenario
from tqdm import tqdm

from .harness import Experiment, experiment
from .measure import peak_rate, run_point


@experiment
def run(exp: Experiment) -> dict:
    p, cfg = exp.p, exp.cfg
    seeds = exp.seeds
    base = exp.spec(p.sbs)
    variants = {"on": "pbaa", **{f"off_{a}": a for a in p.pbaa_off}}
    rows = []
    jobs = [(s, v) for s in p.scenarios for v in variants]
    for scen, label in tqdm(jobs, desc="pbaa_util"):
        sim_cfg = sim_config_from(load_scenario(scen).raw) if scen != cfg.scenario_name else sim_config_from(cfg)
        spec = {**base, "allocation": variants[label]}
        qps = peak_rate(sim_cfg, spec, float(p.ttft_target_s), int(p.num_requests), seeds, float(p.rate_lo),
                        float(p.rate_hi), iters=int(p.iters))
        m = run_point(sim_cfg, spec, qps, int(p.num_requests), seeds)
        rows.append({"scenario": scen, "chunk": sim_cfg.cluster.prefill.chunk_tokens, "pbaa": label,
                     "max_qps": qps, **m})
    table = pd.DataFrame(rows)
    # Utilisation of every variant at the first off variant's max QPS too (same load, same traffic).
    off0 = f"off_{p.pbaa_off[0]}"
    same = []
    for scen in p.scenarios:
        sim_cfg = sim_config_from(load_scenario(scen).raw) if scen != cfg.scenario_name else sim_config_from(cfg)
        q = float(table[(table.scenario == scen) & (table.pbaa == off0)].max_qps.iloc[0])
        for label in ("on", off0):
            m = run_point(sim_cfg, {**base, "allocation": variants[label]}, q, int(p.num_requests), seeds)
            same.append({"scenario": scen, "pbaa": label, "rate": q, "chunk_util_mean": m["chunk_util_mean"],
                         "ttft_mean": m["ttft_mean"]})
    same = pd.DataFrame(same)
    exp.table(table,
        f"Max QPS with mean TTFT <= {p.ttft_target_s} s, and the chunk utilisation there:\n\n"
        + table.round(4).to_markdown(index=False)
        + f"\n\nAt the same rate ({off0}'s max QPS):\n\n" + same.round(4).to_markdown(index=False))
    util = {f"{r.chunk // 1024}K {r.pbaa}": r.chunk_util_mean for r in table.itertuples()}
    plots.bars(util, "prefill chunk utilisation at max QPS", exp.figure("chunk_util.png"))
    plots.bars({f"{r.chunk // 1024}K {r.pbaa}": r.max_qps for r in table.itertuples()},
               f"max QPS (mean TTFT <= {p.ttft_target_s} s)", exp.figure("max_qps.png"))

    def get(scen, label, key, t=table):
        return float(t[(t.scenario == scen) & (t.pbaa == label)][key].iloc[0])

    by_chunk = {}
    for scen in p.scenarios:
        chunk = int(table[table.scenario == scen].chunk.iloc[0])
        by_chunk[str(chunk)] = {
            "scenario": scen,
            "max_qps": {v: get(scen, v, "max_qps") for v in variants},
            "chunk_util": {v: get(scen, v, "chunk_util_mean") for v in variants},
            "qps_gain": {v: get(scen, "on", "max_qps") / get(scen, v, "max_qps") - 1 for v in variants if v != "on"},
            "chunk_util_same_rate": {v: get(scen, v, "chunk_util_mean", same) for v in ("on", off0)},
        }
    s0 = p.scenarios[0]
    return {"chunk_util_off": get(s0, off0, "chunk_util_mean"), "chunk_util_on": get(s0, "on", "chunk_util_mean"),
            "qps_gain": get(s0, "on", "max_qps") / get(s0, off0, "max_qps") - 1, "off": off0,
            "ttft_target_s": float(p.ttft_target_s), "by_chunk": by_chunk}
