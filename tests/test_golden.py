"""Golden outputs: a fixed set of short runs whose results must not change by accident.

Each case is one seeded run; its metrics (minus wall time), requests.csv and steps.csv are
reduced to SHA-256 digests committed in tests/golden/digests.json. A refactor keeps every
digest; a commit that changes behaviour on purpose regenerates them and says why:

    PDGYM_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py

Every registered baseline runs at its decision point, plus disaggregated and colocated
runs with faults, a prefix cache and a tight KV budget.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from pdgym.baselines.registry import make_policy, registered
from pdgym.envs.scenario import load_scenario, merge_sim_config
from pdgym.envs.sim import simulate
from pdgym.envs.sim.metrics import PREFIX_KEYS
from pdgym.envs.sim.points import POINTS
from pdgym.envs.sim.slo import PER_CLASS, SLO_KEYS

GOLDEN = Path(__file__).parent / "golden" / "digests.json"
ENGINES = ["python"] + (["numba"] if importlib.util.find_spec("numba") else [])  # compiled: when numba is installed
UPDATE = os.environ.get("PDGYM_UPDATE_GOLDEN") == "1"

# Where each decision point's baselines run: a scenario small enough for the suite, one entry per point of
# envs/sim/points.py's POINTS in tests/golden/points.json (a point's golden case: docs/architecture.md, "Adding a
# decision point"; test_every_decision_point_has_a_golden_scenario names a point without one).
POINT_GOLDEN = Path(__file__).parent / "golden" / "points.json"


def point_scenarios(points=POINTS, table: Path = POINT_GOLDEN) -> dict[str, tuple[str, dict]]:
    """point -> (scenario, simulator-config overrides) for every decision point of `points` that has an entry."""
    data = json.loads(table.read_text())
    return {p: (data[p]["scenario"], data[p]["sim"]) for p in points if p in data}


POINT_SCENARIO = point_scenarios()

TIERS = [{"name": "chat", "share": 0.7, "ttft_s": 0.3, "tpot_s": 0.05, "weight": 2.0},
         {"name": "batch", "share": 0.3, "ttft_s": 5.0, "tpot_s": 0.2, "weight": 1.0}]

# Mechanics beyond the policies: faults, prefix caches, tight KV (both KV policies), scale events.
SPECIAL = {
    "faults_sbs": ("ds_v3_h800_3p1d", ("policy/prefill=sbs",), {
        "workload": {"num_requests": 300},
        "faults": {"drop_end_forward": 0.2, "detect_s": 0.5,
                   "down": [{"instance": 1, "at": 0.5, "until": 2.0}], "scale": [{"at": 1.0, "count": 2}]}}),
    "prefix_cache_pbaa": ("ds_v3_h800_3p1d", ("policy/prefill=sbs_cache",), {
        "workload": {"num_requests": 300, "prefix_groups": 8, "prefix_frac": 0.5},
        "cluster": {"prefill": {"prefix_cache_entries": 4}}}),
    "tight_kv_preempt": ("decode_tier_n8", (), {
        "workload": {"num_requests": 300},
        "cluster": {"decode": {"kv_capacity_tokens": 6000}, "kv_policy": "preempt"}}),
    "tight_kv_reject": ("decode_tier_n8", (), {
        "workload": {"num_requests": 300},
        "cluster": {"decode": {"kv_capacity_tokens": 6000}, "kv_policy": "reject"}}),
    "coloc_tight_kv": ("coloc_h100_qwen3_8b", ("policy/batching=eb_plus",), {
        "workload": {"num_requests": 200, "concurrency": 128},
        "cluster": {"colocated": {"kv_capacity_tokens": 20000}}}),
    "disagg_default": ("ds_v3_h800_3p1d", (), {"workload": {"num_requests": 300}}),
    # SLO tiers with a length predictor: priority order with preemption on a tight colocated KV, and SBS releasing
    # its buffer in EDF order behind Conductor's early rejection
    "slo_vllm_priority": ("coloc_h100_qwen3_8b", (), {
        "workload": {"num_requests": 200, "concurrency": 128, "classes": TIERS, "predictor": {"kind": "lognormal"}},
        "cluster": {"colocated": {"kv_capacity_tokens": 20000}}, "queue": {"order": "vllm_priority"}}),
    "slo_vllm_priority_pd": ("ds_v3_h800_3p1d", (), {
        "workload": {"num_requests": 300, "rate": 250.0, "classes": TIERS},
        "cluster": {"decode": {"kv_capacity_tokens": 6000, "batch_limit": 8}}, "queue": {"order": "vllm_priority"}}),
    "slo_sbs_edf_conductor": ("ds_v3_h800_3p1d", ("policy/prefill=conductor", "policy.prefill.base=sbs"), {
        "workload": {"num_requests": 300, "rate": 250.0, "classes": TIERS}, "queue": {"order": "edf"}}),
    # prefix-block caches on the Mooncake trace: a cache-aware SBS, and Conductor-style routing with a host tier
    "prefix_blocks_sbs_cache": ("prefix_mooncake", ("policy/prefill=sbs_cache",), {"workload": {"num_requests": 300}}),
    "prefix_blocks_cache_ttft_host": ("prefix_mooncake", ("policy/prefill=cache_ttft",), {
        "workload": {"num_requests": 300},
        "cluster": {"prefill": {"cache_tokens": 20480, "host_cache_tokens": 1000000, "cache_eviction": "fifo"}}}),
}


def configured(point: str, conf=None) -> list[str]:
    """Every policy file of a decision point (conf/policy/POINT/NAME.yaml; `conf`: another conf folder)."""
    root = (conf or importlib.resources.files("pdgym.conf")) / "policy" / point
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def cases(point_scenario=None, conf=None) -> dict[str, tuple[str, tuple[str, ...], dict]]:
    """name -> (scenario, Hydra overrides, simulator-config overrides)."""
    out = {}
    for point, (scen, over) in (POINT_SCENARIO if point_scenario is None else point_scenario).items():
        for name in configured(point, conf):
            extra = ("oracle=true",) if name.endswith("_oracle") else ()
            out[f"{point}-{name}"] = (scen, (f"policy/{point}={name}", *extra), over)
    out.update(SPECIAL)
    return out


# Floats are digested at 10 significant digits: NumPy's reductions (sums, dots, max over DP units) may round
# their last bits differently on another CPU's SIMD width (AVX2 / AVX-512), which is not a behaviour change;
# any change of a decision, an event order or a time model moves far more than that.
FLOAT = "%.10g"


def _rounded(metrics: dict) -> dict:
    return {k: float(FLOAT % v) if isinstance(v, float) else v for k, v in metrics.items()}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_case(scen: str, overrides: tuple[str, ...], over: dict, engine: str = "python") -> dict:
    """Digests of one run's metrics (minus wall time), request and step tables, on one engine."""
    sc = load_scenario(scen, overrides)
    cfg = merge_sim_config(sc.sim, {**over, "engine": engine})
    policies = {k: make_policy(k, v) for k, v in sc.policy.items() if v is not None}
    res = simulate(cfg, policies, seed=7)
    metrics = res.metrics()
    metrics.pop("wall_time_s")
    metrics.pop("goodput_per_gpu")  # came after the digests: goodput_rps (digested) / the configured GPUs (test_slo)
    # the prefix-cache metrics came after the other digests: a digest of their own where a run has a cache
    prefix = {k: metrics.pop(k) for k in PREFIX_KEYS}
    extra = {} if not any(prefix.values()) else {"prefix": _digest(json.dumps(_rounded(prefix), sort_keys=True))}
    # the SLO tiers and predictions came after too (envs/sim/slo.py): their metrics and request columns a digest
    # of their own where a run has classes or a predictor
    slo = {k: metrics.pop(k) for k in list(metrics) if k in SLO_KEYS or k.startswith(tuple(f"{p}_" for p in PER_CLASS))}
    slo_cols = [c for c in ("class", "predicted_output") if c in res.requests]
    if cfg.workload.classes or cfg.workload.predictor.kind != "none":
        slo["columns"] = _digest(res.requests[slo_cols].to_csv(index=False))
        extra["slo"] = _digest(json.dumps(_rounded(slo), sort_keys=True, default=str))
    conservation(res.requests, cfg.workload.num_requests, metrics)
    return {
        "metrics": _digest(json.dumps(_rounded(metrics), sort_keys=True, default=str)),
        "requests": _digest(res.requests.drop(columns=slo_cols).to_csv(index=False, float_format=FLOAT)),
        "steps": _digest(res.step_table().to_csv(index=False, float_format=FLOAT)),
        "finished": metrics["finished"],
        "rejected": metrics["rejected"],
        **extra,
    }


def conservation(req: pd.DataFrame, n: int, metrics: dict) -> None:
    """The simulator's conservation law (docs/architecture.md, request life cycle): each of the n requests ends
    finished or rejected, a rejected one with a reason and a finished one without, a finished one after its first
    token; the summary counts the same requests."""
    assert len(req) == n and req.id.tolist() == list(range(n))
    status = req.status.value_counts().to_dict()
    assert set(status) <= {"finished", "rejected"}, f"requests left in flight: {status}"
    fin, rej = req[req.status == "finished"], req[req.status == "rejected"]
    assert (rej.reason != "").all() and (fin.reason == "").all()
    assert (fin.first_token >= fin.arrival).all() and (fin.finish >= fin.first_token).all()
    assert (metrics["finished"], metrics["rejected"]) == (len(fin), len(rej))


# The digest-file helpers below are shared with tests/test_env_golden.py.
def load(path: Path) -> dict:
    """The digest file `path` as {case: digests} (empty when it does not exist yet)."""
    return json.loads(path.read_text()) if path.exists() else {}


def record(path: Path, case: str, got: dict) -> None:
    """Write `got` as `case`'s entry of the digest file `path` (atomically, keys sorted)."""
    data = load(path)
    data[case] = got
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
    tmp.replace(path)


def match_or_record(path: Path, case: str, got: dict, changed: str) -> None:
    """With PDGYM_UPDATE_GOLDEN=1 store `got` as `case`'s digests; otherwise they must equal the stored ones
    (`changed`: what the failure says moved)."""
    if UPDATE:
        record(path, case, got)
        return
    want = load(path).get(case)
    assert want is not None, f"no golden entry for {case}"
    assert got == want, f"{case}: {changed}"


ALL = cases()


def test_every_case_has_a_golden_entry():
    """A new baseline or case needs its digests committed (and a stale entry means a case was dropped)."""
    if UPDATE:
        pytest.skip("updating")
    assert sorted(load(GOLDEN)) == sorted(ALL), "regenerate: PDGYM_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py"


def test_every_decision_point_has_a_golden_scenario():
    """Each point of POINTS runs its baselines here: a new point without an entry in tests/golden/points.json
    would have no golden case."""
    assert sorted(POINT_SCENARIO) == sorted(POINTS), f"add a golden scenario per point to {POINT_GOLDEN}"


def test_every_registered_baseline_is_covered():
    for point, (scen, _) in POINT_SCENARIO.items():
        names = {load_scenario(scen, (f"policy/{point}={n}",)).policy[point]["name"] for n in configured(point)}
        assert set(registered(point)) <= names, f"{point}: baselines without a config file"


@pytest.mark.parametrize("case", sorted(ALL))
@pytest.mark.parametrize("engine", ENGINES)
def test_golden(case, engine):
    """Every engine gives the digests: the compiled kernels are the Python path's twins (issue 36 item 1)."""
    if UPDATE and engine != "python":
        pytest.skip("the digests are recorded from engine=python")
    got = run_case(*ALL[case], engine=engine)  # asserts the conservation law on the run
    match_or_record(GOLDEN, case, got, f"outputs changed on engine={engine} (behaviour change? regenerate and say "
                    "why in the commit; a compiled kernel that differs from its Python twin)")
