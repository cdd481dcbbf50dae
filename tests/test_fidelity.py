"""`make fidelity`'s code path at tiny sizes (every reproduction, the report), and the verdict rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from pdgym.agents.apps import fidelity
from pdgym.agents.experiments.harness import Experiment


def test_lookup_and_judge_follow_the_band_rules():
    s = {"r": [0.6, 0.7, 1.2], "long": {"r": [0.9]}, "by": {"5120": {"g": {"off": 0.2}}}, "lo": [0.5, 0.6, 0.5]}
    assert fidelity.lookup(s, "r[0:2]") == [0.6, 0.7] and fidelity.lookup(s, "r[-1]") == 1.2
    assert fidelity.lookup(s, "by.5120.g.off") == 0.2 and fidelity.lookup(s, "by.5120.g") == [0.2]
    assert fidelity.judge({"value": "r[0:2]", "band": [0.55, 0.75]}, s)[1] == "pass"
    assert fidelity.judge({"value": "r", "band": [0.55, 0.75]}, s)[1] == "FAIL"  # 1.2 is out
    assert fidelity.judge({"value": "r", "band": [None, None], "check": "increasing"}, s)[1] == "pass"
    assert fidelity.judge({"value": "lo", "band": [None, None], "check": "increasing"}, s)[1] == "FAIL"
    assert fidelity.judge({"value": "r", "band": ["lo", 1.5]}, s)[1] == "pass"  # element-wise path bound
    assert fidelity.judge({"value": "r[0]", "per": "r[1]", "band": [0.8, 0.9]}, s)[1] == "pass"  # 0.857


def test_an_effect_at_named_points_judges_those_points_and_their_flags_only():
    """BalanceRoute's Table 2 tiers are N = 4, 8, 16; br_imbalance also runs N = 32. `at` judges the paper's
    points (values, path bounds and regime flags); a run without every listed point has not measured the effect."""
    s = {"N": [4, 8, 16, 32], "r": [0.2, 0.3, 0.4, 0.6], "o": [0.1, 0.1, 0.1, 0.9],
         "ht": {"N": [4, 8, 16, 32], "g": [0.05, 0.06, 0.07, 0.01]},
         "regime": {"out_of_regime": ["workload N=32 br0: share of decode steps with an empty pool"]}}
    at = {"at": {"N": [4, 8, 16]}, "regime": "workload"}
    assert fidelity.judged({**at, "value": "r", "band": [0.0, 0.5]}, s) == ([0.2, 0.3, 0.4], "pass")
    assert fidelity.judged({"value": "r", "band": [0.0, 0.5], "regime": "workload"}, s)[1] == "FAIL (out of regime)"
    assert fidelity.judge({**at, "value": "r", "band": ["o", 1.0]}, s)[1] == "pass"  # bound at the same points
    assert fidelity.judge({**at, "value": "ht.g", "band": [0.0, 1.0], "check": "increasing"}, s)[1] == "pass"
    assert fidelity.judge({"value": "ht.g", "band": [0.0, 1.0], "check": "increasing"}, s)[1] == "FAIL"
    assert not fidelity.out_of_regime({**at, "regime": "workload"}, s)
    assert fidelity.out_of_regime({"at": {"N": [32]}, "regime": "workload"}, s)
    assert fidelity.judge({**at, "value": "r", "band": [0.0, 0.5]}, {"N": [8], "r": [0.3]})[1] == "not measured"
    assert fidelity.judge({**at, "value": "r", "per": "o", "band": [2.0, 4.0]}, s)[0] == pytest.approx([2, 3, 4])
    assert fidelity.judge({**at, "value": "r", "per": "r[0]", "band": [1.0, 2.0]}, s)[0] == pytest.approx([1, 1.5, 2])


def test_an_effect_is_out_of_regime_only_by_its_own_points():
    s = {"regime": {"out_of_regime": ["ascend_910c N=16 br0: share of decode steps with an empty pool"]}}
    assert fidelity.out_of_regime({"regime": "ascend_910c"}, s)
    assert not fidelity.out_of_regime({"regime": "workload"}, s)
    assert fidelity.out_of_regime({}, s)  # no tag: every flagged point of the reproduction counts
    s = {"ttft_ratio": [0.8, 1.04], "regime": {"out_of_regime": ["peak, short prompts: peak / saturated"]}}
    low, peak = {"regime": "short prompts"}, {"regime": ["short prompts", "peak, short prompts"]}
    assert not fidelity.out_of_regime(low, s) and fidelity.out_of_regime(peak, s)  # the 100% point's flag only
    assert fidelity.judged({**low, "value": "ttft_ratio[0]", "band": [0, 0.999]}, s)[1] == "pass"
    assert fidelity.judged({**peak, "value": "ttft_ratio[1]", "band": [0, 0.999]}, s)[1] == "FAIL (out of regime)"
    assert fidelity.judged({**peak, "value": "ttft_ratio[3]", "band": [0, 0.999]}, s)[1] == "not measured"


def test_every_effect_names_a_reproduction_and_every_reproduction_has_tiny_sizes():
    from pdgym.agents.apps.repro import available

    cfg = fidelity.spec()
    names = set(available())
    assert {e["repro"] for e in cfg["effects"]} <= names
    assert names <= set(cfg["tiny"]), "a reproduction without tiny overrides is not covered by CI"


def test_regime_check_flags_points_outside_their_band(tmp_path, capsys):
    cfg = OmegaConf.create({"seed": 0, "repro": {"runner": "pdgym.agents.experiments.x:run"}})
    exp = Experiment(cfg, tmp_path)
    assert exp.regime("N=8", "pool occupancy", 0.5, lo=0.2)
    assert not exp.regime("N=32", "pool occupancy", 0.01, lo=0.2)
    assert not exp.regime("N=64", "pool occupancy", float("nan"), lo=0.2)
    s = exp.finish({"x": 1})
    assert s["x"] == 1 and not s["regime"]["in_regime"]
    assert s["regime"]["out_of_regime"] == ["N=32: pool occupancy", "N=64: pool occupancy"]
    assert "OUT OF REGIME at N=32" in capsys.readouterr().out


def test_make_fidelity_runs_every_reproduction_at_tiny_sizes(tmp_path):
    doc = tmp_path / "fidelity.md"
    out = fidelity.run(None, True, tmp_path / "runs", doc, [])
    assert not [e for e in out["effects"] if e["verdict"] == "not run"], out["effects"]
    text = doc.read_text()
    assert "tiny sizes" in text and "| reproduction | effect |" in text
    data = json.loads((tmp_path / "runs" / "fidelity.json").read_text())
    assert set(data["wall_s"]) == {e["repro"] for e in fidelity.spec()["effects"]}
    for name in data["wall_s"]:
        s = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
        assert "regime" in s and s["figures"], name
        for f in s["figures"]:
            assert (tmp_path / "runs" / name / f).stat().st_size > 0, (name, f)
    # --rejudge runs nothing and writes the same verdicts from the run records (a report assembled from runs
    # made one at a time); the record names the commit and the sizes
    rec = json.loads((tmp_path / "runs" / "md1_check" / fidelity.RUN_RECORD).read_text())
    assert rec["tiny"] and rec["error"] is None and rec["overrides"] and rec["wall_s"] > 0
    again = fidelity.run(None, False, tmp_path / "runs", tmp_path / "again.md", [], rejudge=True)
    assert again["effects"] == out["effects"] and again["tiny"]
    assert "tiny sizes" in (tmp_path / "again.md").read_text()
    # the evidence beside the report: every judged run's summary, record and figures (JSON and PNG only), the
    # table's figure links resolve, and judging the published copy gives the same verdicts
    ev = tmp_path / "fidelity"
    assert {f.suffix for f in ev.rglob("*") if f.is_file()} == {".json", ".png"}
    links = re.findall(r"\]\((fidelity/[^)]+\.png)\)", text)
    assert links and all((tmp_path / link).is_file() for link in links)
    again = fidelity.run(None, False, ev, tmp_path / "from_docs.md", [], rejudge=True)
    assert again["effects"] == out["effects"]


def test_rejudge_without_runs_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        fidelity.run(None, False, tmp_path / "none", tmp_path / "doc.md", [], rejudge=True)
    assert e.value.code == 2 and not (tmp_path / "doc.md").exists()
    assert "--rejudge: no completed reproduction" in capsys.readouterr().err


def test_batch_means_standard_error_sees_correlation():
    """md1_check's sampling error: i.i.d. waits give the textbook sigma / sqrt(n); correlated ones (an AR(1)
    series like a queue's successive waits near saturation) a much larger one, as batch means must."""
    from pdgym.agents.experiments.md1_check import batch_means_se

    rng = np.random.default_rng(0)
    iid = rng.normal(size=40_000)
    assert batch_means_se(iid) == pytest.approx(1 / np.sqrt(len(iid)), rel=0.4)
    ar = np.empty_like(iid)
    ar[0] = 0.0
    for i in range(1, len(ar)):
        ar[i] = 0.99 * ar[i - 1] + iid[i]
    naive = ar.std() / np.sqrt(len(ar))
    assert batch_means_se(ar) > 5 * naive  # (1 + 0.99) / (1 - 0.99) ~ 199x the variance: ~14x the error


def test_the_report_replaces_only_its_marked_block(tmp_path):
    """docs/fidelity.md (and the bench table in docs/performance.md) keep the prose written around the
    generated block: a regenerated report must not wipe the reading of its verdicts."""
    from pdgym.agents.experiments.harness import write_marked

    doc = tmp_path / "doc.md"
    write_marked(doc, "fidelity", "table v1")
    doc.write_text(doc.read_text() + "\n## Reading the verdicts\nhand-written\n")
    write_marked(doc, "fidelity", "table v2")
    text = doc.read_text()
    assert "table v2" in text and "table v1" not in text and text.endswith("hand-written\n")
    assert text.count("<!-- fidelity:begin -->") == 1


def test_peak_rate_searches_below_a_floor_that_already_misses_the_target():
    """A workload heavier than the one `lo` was set for (another trace) must not report `lo` as its peak."""
    from pdgym.agents.experiments.measure import bracketed, peak_rate
    from pdgym.envs.scenario import load_scenario

    sim = load_scenario("ds_v3_h800_3p1d", ["workload.num_requests=150"]).sim
    spec = {"name": "round_robin"}
    top = peak_rate(sim, spec, 0.4, 150, [0], lo=50.0, hi=100.0, iters=3)  # 0.31 s at 100 req/s, 0.51 at 200
    assert bracketed(top, 100.0) and 100.0 <= top < 200.0
    low = peak_rate(sim, spec, 0.4, 150, [0], lo=400.0, hi=800.0, iters=3)  # 400 req/s misses it: search down
    assert bracketed(low, 800.0) and 100.0 <= low < 200.0
    none = peak_rate(sim, spec, 1e-4, 150, [0], lo=50.0, hi=100.0, iters=2, max_doublings=2)
    assert none == 0.0 and not bracketed(none, 100.0)  # nothing meets a 0.1 ms TTFT: flagged


def test_prefill_capacity_is_the_full_chunk_rate_and_a_rate_above_it_has_no_steady_state():
    """The saturated throughput is what full-chunk passes give (the cost model's own figure, within the short
    prompts' cheaper attention), and a rate 4% above it keeps building a backlog: the last quarter of the run
    waits far longer than the first, which a finite run's mean TTFT hides (why sbs_ttft caps its peak)."""
    from pdgym.agents.experiments.measure import at_rate, full_chunk_rate, prefill_capacity
    from pdgym.baselines import make_policy
    from pdgym.envs.scenario import load_scenario
    from pdgym.envs.sim import simulate

    sim = load_scenario("ds_v3_h800_3p1d").sim
    cap = prefill_capacity(sim, "round_robin", 3000, [0])
    full = full_chunk_rate(sim)
    assert 0.98 < cap / full < 1.05, (cap, full)

    def quarters(load: float) -> list[float]:
        res = simulate(at_rate(sim, load * cap, 6000), {"prefill": make_policy("prefill", "round_robin")}, 0)
        ttft = res.requests.sort_values("arrival").ttft.to_numpy()
        return [float(np.mean(q)) for q in np.array_split(ttft, 4)]

    # 6,000 arrivals over about 28 s: a 4% excess leaves about 1.1 s more backlog by the end (0.7-1.1 s on
    # seeds 0-2); at 70% load the last quarter waits like the first (within 0.03 s on seeds 0-2)
    over, under = quarters(1.04), quarters(0.7)
    assert over[3] - over[0] > 0.5, over
    assert abs(under[3] - under[0]) < 0.1, under


def test_br_imbalance_reports_seed_means_and_brs_ratio_seed_by_seed():
    """Every router replays each seed; the summary's ratios are of seed means, with the per-seed spread beside."""
    import pandas as pd
    from pdgym.agents.experiments import br_imbalance as B

    rows = [{"workload": "w", "N": 8, "router": r, "seed": s, "imbalance": imb, "tput": tput, "tpot_p95": 1.0,
             "capacity_per_worker": 3.0, "prefill_instances": 4, "decode_tp": 1, "overflow_per_pick": 5.0,
             "pool_mean": 10.0, "empty_pool_frac": 0.0, "slot_occupancy": 1.0, "route_ms": 0.1 + s, "step_ms": 10.0}
            for r, s, imb, tput in [("least_kv", 0, 100.0, 1.0), ("least_kv", 1, 300.0, 1.0),
                                    ("random", 0, 150.0, 1.0), ("random", 1, 150.0, 1.0),
                                    ("br0", 0, 50.0, 1.1), ("br0", 1, 60.0, 1.3)]]
    table = pd.DataFrame(rows)
    means = B.seed_means(table)
    assert len(means) == 3 and means.set_index("router").imbalance["least_kv"] == 200.0
    p = OmegaConf.create({"classic": ["least_kv", "random"]})
    fields = B.summarise(means, p)
    assert fields["best_classic"] == ["random"]  # 150 < least_kv's mean 200 (least_kv's seed 0 alone is lower)
    assert fields["imb_ratio_br0"] == [pytest.approx(55.0 / 150.0)]
    assert fields["imb_ratio_brh_oracle"] == [None]  # no BR-H rows: None, not a KeyError
    spread = B.per_seed(table, fields)
    assert spread["seeds"] == [0, 1]
    assert spread["imb_ratio_br0_seeds"] == [[round(50 / 150, 4), round(60 / 150, 4)]]
    assert spread["tput_gain_br0_seeds"] == [[0.1, 0.3]]
    assert fields["route_ms_br_max"] == [pytest.approx(0.6)] and fields["step_ms_br0"] == [10.0]  # seed means


def test_timing_the_router_changes_nothing_it_decides():
    """br_imbalance's dispatch cost comes from wrapping the router (measure.TimedRouter): the same seed gives
    the same run with and without the wrapper, and every decode step's decision is timed."""
    from pdgym.agents.experiments.measure import TimedRouter, tier
    from pdgym.baselines import make_policy
    from pdgym.envs.scenario import load_scenario
    from pdgym.envs.sim import SimResult, Simulator
    from pdgym.envs.sim.events import PassKind

    cfg = tier(load_scenario("decode_tier_n16").sim, n=4, num_requests=300)
    runs = []
    for wrap in (False, True):
        router = make_policy("decode", {"name": "br0"})
        sim = Simulator(cfg, {"decode": TimedRouter(router) if wrap else router}, 0)
        sim.run()
        runs.append((sim, SimResult(sim).steps))
    (plain, steps), (timed, _) = runs
    assert np.array_equal(plain.req.finish, timed.req.finish) and np.array_equal(plain.req.worker, timed.req.worker)
    calls = np.asarray(timed.policies["decode"].calls)
    assert 0 < len(calls) <= (steps.kind == PassKind.DECODE).sum()  # one per step with a pool and a free slot
    assert (calls[:, 1] > 0).all() and (np.diff(calls[:, 0]) >= 0).all()


def test_a_tier_too_small_for_the_model_gets_the_smallest_worker_that_holds_it():
    """BalanceRoute's N = 4 tier on the Ascend 910C: DeepSeek-V3 at EP 4 needs 181 GB per device of 115 usable,
    so each worker spans 2 NPUs (EP 8); from N = 8 a worker is one NPU. A tier that fits keeps its scenario's tp."""
    from pdgym.agents.experiments.measure import holding_worker, tier
    from pdgym.envs.scenario import load_scenario
    from pdgym.envs.sim import Simulator

    paper = load_scenario("decode_tier_ds_v3_910c_n16").sim
    assert [holding_worker(paper, n) for n in (4, 8, 16, 32)] == [2, 1, 1, 1]
    small = tier(paper, n=4, num_requests=50)
    assert (small.cluster.decode.dp, small.cluster.decode.tp, small.cluster.decode.ep) == (4, 2, 8)
    assert Simulator(small, None, 0).decode[0].dp == 4  # the engine accepts it (it refused EP 4 at tp 1)
    h800 = load_scenario("decode_tier_n16").sim
    assert tier(h800, n=4).cluster.decode.tp == 1


def test_decode_tier_calibration_reaches_a_full_tier():
    """br_imbalance's calibration: one burst with the Ascend 910C tier's scaled prefill (8 instances at N = 32)
    cannot keep the decode slots full, so it reads the capacity low and the tier, run at 1.2 x that, keeps up
    with its arrivals (the pool empty on every loaded step: out of regime). The fixed point grows the prefill
    and measures again until the burst fills the tier; then the same load leaves a pool to route from."""
    from pdgym.agents.experiments.measure import fed, run_router, saturated, tier, tier_capacity
    from pdgym.envs.scenario import load_scenario

    cfg = tier(load_scenario("decode_tier_ds_v3_910c_n16").sim, n=32, num_requests=10000, scale_prefill=True)
    one = tier_capacity(cfg, 0)
    assert one.full_share < 0.1  # prefill-bound burst: never 90% of the slots busy
    naive = fed(tier(cfg, rate=1.2 * one.decode_rps), 1.2 * one.decode_rps, one.prefill_rps, 1.25)
    assert run_router(naive, "least_kv", 0, 0.5)["empty_pool_frac"] > 0.9
    sat, cap = saturated(cfg, 1.2, 1.25, 0)
    assert cap.full_share > 0.5 and sat.cluster.prefill.count > naive.cluster.prefill.count
    assert cap.decode_rps > 1.3 * one.decode_rps and sat.workload.rate == pytest.approx(1.2 * cap.decode_rps)
    r = run_router(sat, "least_kv", 0, 0.5)
    assert r["empty_pool_frac"] < 0.05 and r["slot_occupancy"] > 0.95


def test_decode_tier_calibration_runs_to_its_fixed_point_or_says_it_did_not():
    """A tier far from its fixed point needs many bursts (each grows the prefill by at most load x margin): the
    Azure code trace's H800 tier at N = 16 needs 8. Stopped at 5 bursts (the loop's old limit) the last burst
    never filled the slots and the calibration says it did not converge; run to the fixed point, it did and
    the burst filled the tier."""
    from pdgym.agents.experiments.measure import saturated, tier
    from pdgym.envs.scenario import load_scenario

    cfg = tier(load_scenario("decode_tier_n16", ["workload.trace=azure_code"]).sim, n=16, num_requests=5291,
               scale_prefill=True)
    short, five = saturated(cfg, 1.2, 1.25, 0, rounds=5)
    assert (five.bursts, five.converged) == (5, False) and five.full_share < 0.1
    sat, cap = saturated(cfg, 1.2, 1.25, 0)
    assert cap.converged and 5 < cap.bursts < 12 and cap.full_share > 0.5
    assert sat.cluster.prefill.count > short.cluster.prefill.count
    assert cap.decode_rps > 1.2 * five.decode_rps and sat.workload.rate == pytest.approx(1.2 * cap.decode_rps)


@pytest.mark.parametrize("report", ["fidelity", "fidelity_azure_code"])
def test_committed_report_is_its_committed_evidence_judged(report, tmp_path):
    """docs/REPORT.md's table is what judging docs/REPORT/ (the runs' summaries) gives today: a hand edit of
    the table, a band changed in conf/fidelity.yaml or a judge rule changed without re-judging fails here.
    Judging leaves what it reads untouched (it wrote fidelity.json into --out, so the README's check dirtied
    docs/fidelity/)."""
    import shutil
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    shutil.copytree(docs / report, tmp_path / "runs")
    fidelity.run(None, False, tmp_path / "runs", tmp_path / "out" / f"{report}.md", [], rejudge=True)

    def rows(text: str) -> list[str]:
        block = text.split("<!-- fidelity:begin -->", 1)[1].split("<!-- fidelity:end -->", 1)[0]
        return [ln for ln in block.splitlines() if ln.startswith("| ") or ln.startswith("**")]

    before = {f: f.read_bytes() for f in (docs / report).rglob("*") if f.is_file()}
    fidelity.run(None, False, docs / report, tmp_path / "check.md", [], rejudge=True)
    assert {f: f.read_bytes() for f in (docs / report).rglob("*") if f.is_file()} == before
    committed = rows((docs / f"{report}.md").read_text())
    assert len(committed) > 20
    assert rows((tmp_path / "out" / f"{report}.md").read_text()) == committed


def test_an_effect_calibrated_to_its_own_source_is_never_a_pass():
    """conf/fidelity.yaml's `calibrated`: in band it says "calibrated" (agreeing with the figure a parameter was
    fitted to is no evidence), out of band it still fails; the report lists why each is calibrated."""
    s = {"g": 0.1}
    eff = {"repro": "x", "effect": "e", "paper": "p", "value": "g", "band": [0.0, 0.2], "calibrated": "set from it"}
    assert fidelity.judged(eff, s) == ([0.1], "calibrated")
    assert fidelity.judged({**eff, "band": [0.5, 1.0]}, s)[1] == "FAIL"
    assert fidelity.judged({k: v for k, v in eff.items() if k != "calibrated"}, s)[1] == "pass"
    flagged = {**s, "regime": {"out_of_regime": ["headline: load"]}}
    assert fidelity.judged(eff, flagged)[1] == "out of regime"  # in band at a flagged point: no test either way
    assert fidelity.judged({**eff, "band": [0.5, 1.0]}, flagged)[1] == "FAIL (out of regime)"
    rows = [{**eff, "values": [0.1], "verdict": "calibrated"}]
    results = {"x": {"summary": {"regime_causes": {"w N=32": "trace too short: ..."}}, "wall_s": 1.0, "error": None}}
    text = fidelity.render(rows, results, False, Path("/nonexistent"), Path("/nonexistent"), [])
    assert "**0 of 1 effects pass**; 1 calibrated to their own source" in text
    assert "- x, e: set from it" in text and "- x, w N=32: trace too short" in text


def test_the_calibrated_effects_are_the_ones_whose_source_set_a_parameter():
    """eb_hardware's RTX PRO 6000 and H200 gains: their interference values were set from the EB study's
    crossovers on those GPUs (envs/sim/cost.py); L40S's comes from the bandwidth rule, out of sample."""
    cal = {(e["repro"], e["value"]) for e in fidelity.spec()["effects"] if e.get("calibrated")}
    assert cal == {("eb_hardware", "gain.rtx_pro_6000"), ("eb_hardware", "gain.h200")}


def test_iqr_band_conclusion_follows_the_numbers():
    """iqr_band's closing note is computed: which side of each reference IQR's band and throughput fall on."""
    import pandas as pd
    from pdgym.agents.experiments.iqr_band import conclusion

    def table(iqr_band, fresh_band, fresh_tput):
        return pd.DataFrame({"router": ["iqr", "least_kv", "immediate_r1", "immediate_r4"],
                             "band_tokens": [iqr_band, fresh_band, 10.0, 20.0], "tput": [1.0, fresh_tput, 1.0, 0.9],
                             "step_ms": [10.0] * 4}).set_index("router")

    stale_only = conclusion(table(15.0, 5.0, 1.0), 4, [1, 4])
    assert "from report_every=4 on (40 ms" in stale_only and "an effect against stale load reports" in stale_only
    assert "report_every=1: a band 1.50x the reference's (wider)" in stale_only
    better = conclusion(table(4.0, 5.0, 0.9), 4, [1, 4])
    assert "from report_every=1 on" in better and "also beats the router with exact, current KV" in better


def test_br_imbalance_names_what_keeps_a_point_out_of_regime():
    """regime_cause: a prefill calibration short of its fixed point is "prefill bound"; a pool that empties at a
    rate above capacity with the prefill at its fixed point (or a burst that never filled the tier) is "trace too
    short", with the rows, their arrival span and the slots; an in-regime point has no cause."""
    from types import SimpleNamespace as NS

    import pandas as pd
    from pdgym.agents.experiments.br_imbalance import regime_cause
    from pdgym.agents.experiments.measure import TierCapacity

    cfg = NS(cluster=NS(decode=NS(count=1, dp=16, batch_limit=64), prefill=NS(count=28)),
             workload=NS(num_requests=5291))
    p = NS(load=1.2, regime_max_empty_pool=0.2)

    def means(empty):
        return pd.DataFrame({"router": ["br0", "least_kv"], "empty_pool_frac": [empty, empty]})

    full = TierCapacity(decode_rps=2730.0, prefill_rps=100.0, full_share=0.6, bursts=8, converged=True)
    assert regime_cause(cfg, full, means(0.05), p) == ""
    short = regime_cause(cfg, full, means(0.9), p)
    assert short.startswith("trace too short: 5291 rows arrive in 1.6 s at 3276 req/s for 1024 decode slots")
    assert "90% of BR-0's loaded steps" in short
    unfilled = regime_cause(cfg, TierCapacity(2730.0, 100.0, 0.02, 3, True), means(0.9), p)
    assert unfilled.startswith("trace too short") and "full on 2% of the burst's steps" in unfilled
    bound = regime_cause(cfg, TierCapacity(2730.0, 100.0, 0.6, 12, False), means(0.9), p)
    assert bound.startswith("prefill bound at 28 instances") and "after 12 bursts" in bound
    below = regime_cause(cfg, full, means(0.9), NS(load=0.8, regime_max_empty_pool=0.2))
    assert below.startswith("load 0.8 x capacity leaves the pool empty on 90%")
