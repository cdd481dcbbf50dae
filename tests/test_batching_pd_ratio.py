"""The P:D-ratio study (agents/experiments/pd_ratio.py) on a small case: direction only.

The full study (pdgym-repro pd_ratio) runs 1000 requests per GPU with each GPU's whole KV; here
150 requests per GPU, 120k KV tokens per GPU and kv_policy=reject (an exhausted request is
rejected, not recomputed) keep it to seconds while the decode side still runs out of KV.
"""

from __future__ import annotations

import importlib.resources

import numpy as np
import pytest
from omegaconf import OmegaConf
from pdgym.agents.experiments.pd_ratio import label, study, summarise
from pdgym.envs.scenario import load_scenario


def small_study():
    p = OmegaConf.load(importlib.resources.files("pdgym.conf") / "repro" / "pd_ratio.yaml").repro
    p.requests_per_gpu, p.clients_per_gpu = 150, 128
    p.colocated, p.colocated_policies = {"pd_ratio_coloc4": 4}, ["eb_plus"]
    p.disaggregated = {"pd_ratio_1p3d": 4, "pd_ratio_3p1d": 4}
    p.mixes = [m for m in p.mixes if m.label != "balanced"]
    p.overrides = ["cluster.decode.kv_capacity_tokens=120000", "cluster.colocated.kv_capacity_tokens=120000",
                   "cluster.kv_policy=reject"]
    return summarise(study(p, seed=0, progress=False))


def test_best_ratio_follows_the_mix_and_decode_side_runs_out_of_kv():
    s = small_study()
    assert s["mixes"] == ["prefill_heavy", "decode_heavy"]
    assert s["best_pd"] == {"prefill_heavy": "3P+1D", "decode_heavy": "1P+3D"}
    kv = s["decode_kv_exhausted"]
    assert kv["3P+1D"]["decode_heavy"] > 100 and kv["3P+1D"]["prefill_heavy"] == 0
    assert kv["coloc4 EB+"]["decode_heavy"] <= 0.05 * kv["3P+1D"]["decode_heavy"]
    assert all(v > 0 for v in s["eb_plus_vs_best_pd"].values())


@pytest.mark.parametrize("name,gpus", [("pd_ratio_coloc2", 2), ("pd_ratio_coloc4", 4), ("pd_ratio_1p1d", 2),
                                       ("pd_ratio_1p3d", 4), ("pd_ratio_2p2d", 4), ("pd_ratio_3p1d", 4)])
def test_setups_use_the_same_gpus_model_and_load_per_gpu(name, gpus):
    sim = load_scenario(name).sim
    cl = sim.cluster
    used = cl.colocated.count if cl.topology == "colocated" else cl.prefill.count + cl.decode.count
    assert used == gpus and sim.hardware["name"] == "rtx_pro_6000" and sim.model["name"] == "qwen3_8b"
    assert sim.workload.concurrency == 256 * gpus
    assert label(name) in ("coloc2", "coloc4", "1P+1D", "1P+3D", "2P+2D", "3P+1D")


def test_the_fluid_ceiling_is_the_worst_integer_split_found_by_search():
    """pd_ratio's upper band end, 1 / (G - 1), against a brute-force search over prefill shares f and splits p
    (an independent computation of the same bound)."""
    from pdgym.agents.experiments.pd_ratio import fluid_ceiling

    fs = np.linspace(1e-4, 1 - 1e-4, 4001)
    for g in (2, 3, 4, 8):
        served = [max(min(p / f, (g - p) / (1 - f)) / g for p in range(1, g)) for f in fs]
        assert fluid_ceiling(g) == pytest.approx(1 / min(served) - 1, rel=1e-3)
