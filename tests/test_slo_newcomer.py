"""The SLO newcomer path (issue 45): what the README and docs/concepts.md show runs as shown (the scenario's
policies kept, queue orders inside compare, a custom admission gate and queue order from outside the tree), the
tables show SLO and per-class rows, hindsight runs say so, printed commands run as printed, banners state what ran,
md1_check sizes each load for its precision, and the docs' counts and lists match the code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pdgym.baselines import ArrivalGate, make_policies, make_policy
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, Simulator, simulate
from pdgym.envs.sim.ordering import ORDERS

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
README = (ROOT / "README.md").read_text()
CONCEPTS = (ROOT / "docs" / "concepts.md").read_text()


def _block(text: str, head: str) -> str:
    blocks = re.findall(r"```python\n(# " + re.escape(head) + r".*?)```", text, flags=re.S)
    assert len(blocks) == 1, f"one python block starting '# {head}'"
    return blocks[0]


def _cli(app: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / app), *args], capture_output=True, text=True, cwd=cwd, timeout=600,
                          check=False, env={"WANDB_MODE": "disabled", "PATH": str(BIN)})


@pytest.fixture
def gate_folder(tmp_path, monkeypatch):
    """An empty folder outside the tree holding concepts.md's my_gate.py and README's my_admission.py."""
    (tmp_path / "my_gate.py").write_text(_block(CONCEPTS, "my_gate.py"))
    (tmp_path / "my_admission.py").write_text(_block(README, "my_admission.py"))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for mod in ("my_gate", "my_admission"):
        sys.modules.pop(mod, None)


# ------------------------------------------------------------------ the scenario's policies and its queue order
def test_load_scenario_keeps_every_simulator_key_queue_order_included():
    assert load_scenario("slo_pd_tiers", ["queue.order=edf"]).sim.queue.order == "edf"
    assert load_scenario("slo_pd_tiers", ["queue.order=ltr", "queue.starve_s=2"]).sim.queue.starve_s == 2.0


def test_a_partial_policy_dict_keeps_the_scenarios_other_policies():
    sc = load_scenario("slo_pd_tiers", ["workload.num_requests=300"])
    merged = sc.policies({"decode": "least_kv"})
    assert type(merged["prefill"]).__name__ == "SBS" and set(merged) == {"prefill", "decode", "batching"}
    assert "prefill" not in make_policies({"decode": "least_kv"})  # make_policies alone builds what it is given
    a = simulate(sc.sim, merged, seed=0).requests
    b = simulate(sc.sim, make_policies({**sc.policy, "decode": "least_kv"}), seed=0).requests
    assert a.equals(b)
    with pytest.raises(ConfigError, match="policy.decod: unknown decision point"):
        sc.policies({"decod": "least_kv"})


def test_the_readme_python_snippet_runs_with_the_scenarios_dispatcher(monkeypatch):
    block = re.search(r"### From Python\n\n```python\n(.*?)```", README, flags=re.S).group(1)
    block = block.replace("workload.num_requests=2000", "workload.num_requests=300")
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 (the README's own snippet)
    sc = ns["sc"]
    assert sc.sim.queue.order == "edf" and sc.policy["prefill"]["name"] == "sbs"
    want = simulate(sc.sim, make_policies({**sc.policy, "decode": "least_kv"}), seed=0)
    assert ns["result"].requests.equals(want.requests)


# ------------------------------------------------------------------ admission: ArrivalGate, conductor's base
def test_conductors_default_base_is_sbs_on_a_pd_cluster_and_least_tokens_colocated():
    for scen, base in (("slo_pd_tiers", "sbs"), ("slo_coloc_tiers", "round_robin")):
        sc = load_scenario(scen, ["workload.num_requests=300", "queue.order=edf"])
        auto = simulate(sc.sim, sc.policies({"prefill": "conductor"}), seed=1).requests
        named = simulate(sc.sim, sc.policies({"prefill": {"name": "conductor", "base": base}}), seed=1).requests
        assert auto.equals(named), scen
    assert isinstance(make_policy("prefill", "conductor"), ArrivalGate)


def test_an_immediate_dispatcher_leaves_the_queue_order_nothing_to_sort_on_a_pd_cluster():
    """Why conductor's base is SBS on P/D: the order sorts the scheduler's buffer, which only SBS keeps. Behind
    least_tokens every arrival is dispatched at once, so EDF and FCFS give every request the same TTFT (the order
    still sorts the decode pool, which moves TPOT); behind SBS they do not."""
    runs = {}
    for base in ("least_tokens", "sbs"):
        for order in ("fcfs", "edf"):
            sc = load_scenario("slo_pd_tiers", ["workload.num_requests=600", f"queue.order={order}"])
            runs[base, order] = simulate(sc.sim, sc.policies({"prefill": base}), seed=0).requests
    assert runs["least_tokens", "fcfs"].ttft.equals(runs["least_tokens", "edf"].ttft)
    assert (runs["least_tokens", "fcfs"].sched_queue == 0).all()
    assert not runs["sbs", "fcfs"].ttft.equals(runs["sbs", "edf"].ttft)


def test_the_readme_gate_rejects_only_what_it_says(gate_folder):
    sc = load_scenario("slo_pd_tiers", ["workload.num_requests=1500", "queue.order=edf"])
    pols = sc.policies({"prefill": {"name": "my_admission:ShedWhenBacklogged", "backlog": 16}})
    assert isinstance(pols["prefill"], ArrivalGate)
    res = simulate(sc.sim, pols, seed=0)
    r = res.requests
    shed = r[r.reason == "slo"]
    assert len(shed) == res.metrics()["early_rejections"] > 0
    assert (shed["class"] == "chat").all()  # the first class only
    assert shed.dispatch.isna().all()  # rejected at arrival, never dispatched


def test_a_custom_queue_order_runs_on_the_read_only_view_and_a_stored_file_cannot_name_one(gate_folder):
    from pdgym.envs.sim.external import named_by_stored_file
    from pdgym.envs.sim.ordering import QueueOrder
    from pdgym.envs.sim.view import OracleError

    sc = load_scenario("slo_coloc_tiers", ["workload.num_requests=300", "queue.order=my_gate:ShortestPromptFirst"])
    r = simulate(sc.sim, sc.policies(), seed=0).requests
    assert (r.status == "finished").all()
    fcfs = simulate(load_scenario("slo_coloc_tiers", ["workload.num_requests=300"]).sim, sc.policies(), seed=0)
    assert not r.equals(fcfs.requests)  # the order acted

    class ReadsTheFuture(QueueOrder):
        def key(self, rid):
            return int(self.req.output[rid]), rid

    gate_folder.joinpath("peek.py").write_text("")
    sys.modules["peek"] = type(sys)("peek")
    sys.modules["peek"].ReadsTheFuture = ReadsTheFuture
    try:
        with pytest.raises(OracleError):
            simulate(load_scenario("slo_coloc_tiers", ["workload.num_requests=50", "queue.order=peek:ReadsTheFuture"]
                                   ).sim, sc.policies(), seed=0)
    finally:
        sys.modules.pop("peek", None)
    sys.modules.pop("my_gate", None)
    with named_by_stored_file("runs/x/agent.json"), pytest.raises(ConfigError, match="never because a stored file"):
        Simulator(sc.sim, sc.policies(), seed=0)
    assert "my_gate" not in sys.modules  # refused, not imported
    with pytest.raises(ConfigError, match="queue.order: module 'my_gate' has no class 'Nope'; its queue order "
                                          "classes: ShortestPromptFirst"):
        Simulator(load_scenario("slo_coloc_tiers", ["queue.order=my_gate:Nope"]).sim, sc.policies(), seed=0)


def test_the_documented_comparison_and_gate_run_from_the_command_line(gate_folder):
    """docs/concepts.md's commands (600 requests here): queue orders and the gate inside compare, one SLO table
    with the per-class rows; pdgym-eval of the gate, and an oracle run recorded as hindsight."""
    p = _cli("pdgym-sim", "scenario=slo_pd_tiers", "workload.num_requests=600", "plots=false", "hydra.run.dir=sim",
             "compare=[{label: sbs_edf, queue: edf}, {label: gate_edf, prefill: \"my_gate:ShedWhenBacklogged\", "
             "queue: edf}, {label: short_first, queue: \"my_gate:ShortestPromptFirst\"}, {label: hindsight, prefill: "
             "{name: slo_hindsight, base: conductor, passes: 1}, queue: edf, oracle: true}]", cwd=gate_folder)
    assert p.returncode == 0, p.stderr
    for row in ("slo_attainment ", "early_rejections", "slo_attainment_chat", "ttft_p99_batch", "hindsight (hindsight)"):
        assert row in p.stdout, row
    rows = {r.split(",")[0]: r for r in (gate_folder / "sim" / "compare.csv").read_text().splitlines()[1:]}
    assert set(rows) == {"sbs_edf", "gate_edf", "short_first", "hindsight"}
    p = _cli("pdgym-eval", "policy=my_gate:ShedWhenBacklogged", "scenario=slo_pd_tiers", "queue.order=edf",
             "oracle=true", "workload.num_requests=300", "seeds=[0]", "progress=false", "hydra.run.dir=ev",
             cwd=gate_folder)
    assert p.returncode == 0, p.stderr
    m = json.loads((gate_folder / "ev" / "metrics.json").read_text())
    assert m["kind"] == "hindsight" and m["oracle"] is True
    assert "slo_attainment_chat" in p.stdout and "early_rejections" in p.stdout
    assert "seeds [0] of the test split, 300 requests each" in p.stdout


def test_a_bad_compare_queue_names_its_entry():
    from omegaconf import OmegaConf, open_dict
    from pdgym.agents.apps import sim
    from pdgym.envs.scenario import _compose

    cfg = OmegaConf.create(_compose("slo_pd_tiers", ("workload.num_requests=50",)))
    for entry, says in (({"label": "a", "queue": "edff"}, "compare[0].queue.order: got 'edff'"),
                        ({"label": "a", "queue": 3}, "compare[0].queue: got 3"),
                        ({"label": "a", "oracle": "yes"}, "compare[0].oracle: got 'yes'"),
                        ({"label": "a", "queue": "sjf_oracle"}, "compare[0]: queue.order: sjf_oracle")):
        with open_dict(cfg):
            cfg.compare = OmegaConf.create([entry])
        with pytest.raises(ConfigError, match=re.escape(says)):
            sim.validate(cfg)
    with open_dict(cfg):
        cfg.compare = OmegaConf.create([{"label": "a"}, {"label": "b", "queue": {"order": "ltr", "starve_s": 2},
                                                         "oracle": True}])
    _, _, base, sets = sim.validate(cfg)
    (_, a_cfg, _), (_, b_cfg, _) = sets
    assert a_cfg is base and (b_cfg.queue.order, b_cfg.queue.starve_s, b_cfg.oracle) == ("ltr", 2.0, True)


def test_the_sim_table_adds_slo_and_class_rows_only_with_several_classes():
    from pdgym.agents.apps.sim import shown_keys

    one = shown_keys({"a": {}}, ["default"])
    two = shown_keys({"a": {}}, ["chat", "batch"])
    assert "slo_attainment" not in one and "early_rejections" not in one
    assert {"slo_attainment", "early_rejections", "slo_attainment_chat", "ttft_p99_batch"} <= set(two)


# ------------------------------------------------------------------ printed commands, banners, the kept model
def test_printed_commands_name_an_executable_that_runs(tmp_path, monkeypatch):
    from pdgym.envs.sim.shell import app_command, python_command, runnable

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv's bin not on PATH, as after `make`
    cmd = app_command("pdgym-eval")
    assert cmd != "pdgym-eval" and Path(cmd).is_file() and os.access(cmd, os.X_OK)
    assert runnable("pdgym-eval policy=zoo:x 'seeds=[0]'") == f"{cmd} policy=zoo:x 'seeds=[0]'"
    assert runnable("make test") == "make test"
    assert Path(python_command()).is_file()
    monkeypatch.setenv("PATH", f"{BIN}:/usr/bin:/bin")
    assert app_command("pdgym-eval") == "pdgym-eval"
    train = (ROOT / "agents" / "training" / "train.py").read_text()
    assert "evaluate it: pdgym-eval" not in train and "app_command('pdgym-eval')" in train


def test_pdgym_train_says_when_it_kept_the_clone():
    from pdgym.agents.training.train import kept_line

    base = {"primary": "imbalance_mean", "objective": 11222.3, "timesteps": 2048, "bc": {"teacher": "br0"}}
    assert kept_line({**base, "best_timesteps": 0}).startswith(
        "best model: the behaviour-cloned policy (step 0, a clone of br0): the 2048 RL steps never beat it")
    assert kept_line({**base, "best_timesteps": 2048}) == "best model: step 2048 of 2048 (imbalance_mean 11222.3 " \
                                                           "on validation)"


def test_board_banners_state_the_seeds_and_sizes_that_ran():
    from pdgym.agents.apps.leaderboard import effective_banner
    from pdgym.agents.evaluation.leaderboard_run import board_scenarios
    from pdgym.envs.scenario import _compose

    for preset in (ROOT / "conf" / "preset").glob("*.yaml"):  # a banner that states sizes goes stale on an override
        banner = re.findall(r"^banner: (.*)$", preset.read_text(), flags=re.M)
        assert not banner or not re.search(r"\d+ (seeds?|requests)", banner[0]), preset.name
    scs = board_scenarios({"slo_pd_tiers": {"scenario": "slo_pd_tiers", "point": "prefill",
                                            "primary": "slo_attainment", "overrides": ["workload.num_requests=1500"]}})
    line = effective_banner("SLO-tier boards (preset=slo)", [0, 1], {}, scs)
    assert line == "SLO-tier boards (preset=slo) [this run: 2 seeds [0, 1]; requests a run: slo_pd_tiers 1,500]"
    assert "+ seeds [5]" in effective_banner("B", [0], {"slo_pd_tiers": [5]}, scs)
    assert effective_banner("", [0], {}, scs) == ""
    assert _compose  # the scenarios composed through the same cache as the board


# ------------------------------------------------------------------ md1_check sized for its precision
def test_md1_check_grows_a_point_to_the_length_its_precision_needs_and_stays_honest(tmp_path):
    from pdgym.agents.apps import repro
    from pdgym.agents.experiments.md1_check import GROWTH_MARGIN, needed_requests

    assert needed_requests(200_000, 0.0164, 0.015, 1_000_000) == int(-(-200_000 * (0.0164 / 0.015) ** 2
                                                                       * GROWTH_MARGIN // 1))
    assert needed_requests(200_000, 0.012, 0.015, 1_000_000) == 200_000  # precise enough: no second run
    assert needed_requests(200_000, 0.05, 0.015, 300_000) == 300_000  # capped
    s = repro.run("md1_check", ["repro.num_requests=1500", "repro.max_requests=12000", "repro.rhos=[0.5]",
                                "repro.rho=0.5", "repro.max_rel_se=0.03"], tmp_path)
    first_len = 1500
    assert s["num_requests"] > first_len  # 1,500 requests cannot reach 3% at rho 0.5 (measured rel_se ~ 6%)
    flagged = not s["regime"]["in_regime"]
    assert flagged == (s["rel_se"] > 0.03)  # judged on the run it reports, flagged iff still too imprecise


# ------------------------------------------------------------------ the docs' lists and counts
def test_readme_lists_the_slo_metrics_and_every_admission_policy_and_queue_order():
    from pdgym.baselines import registered
    from pdgym.envs.sim.slo import SLO_KEYS

    metrics = README.split("### Metrics")[1].split("###")[0]
    for k in (*SLO_KEYS, "goodput_per_gpu", "slo_attainment_<class>"):
        assert f"`{k}`" in metrics, k
    table = README.split("### Baselines")[1].split("###")[0]
    for name in registered("prefill"):
        assert f"`{name}`" in table, name
    for name in ORDERS.names():
        assert f"`{name}`" in table, name
    assert "`queue.order`" in table


def test_the_docs_count_the_board_and_no_longer_say_slo_tiers_were_not_tried():
    import yaml

    board = yaml.safe_load((ROOT / "conf" / "leaderboard.yaml").read_text())
    agents_md = (ROOT / "docs" / "agents.md").read_text()
    full = re.search(r"the full board: (\d+) scenarios", agents_md)
    assert full and int(full.group(1)) == len(board["scenarios"])
    quick = yaml.safe_load((ROOT / "conf" / "preset" / "quick.yaml").read_text())
    line = next(x for x in agents_md.splitlines() if x.startswith("pdgym-leaderboard preset=quick"))
    assert quick["train"] == [] and "router" not in line
    results = (ROOT / "docs" / "results.md").read_text()
    assert "were not tried: the simulator has one SLO per scenario" not in results
    assert "## SLO tiers" in results


def test_board_tables_of_a_tiered_scenario_add_each_class_attainment():
    import pandas as pd
    from pdgym.agents.evaluation.leaderboard_render import scenario_frame
    from pdgym.agents.evaluation.leaderboard_run import BoardScenario
    from pdgym.agents.evaluation.leaderboard_stats import class_attainment, summarise

    runs = pd.DataFrame([
        {"scenario": "tiers", "policy": p, "kind": "baseline", "seed": s, "slo_attainment": v,
         "slo_attainment_chat": v - 0.1, "slo_attainment_batch": 1.0, "ttft_mean": 0.4}
        for p, v in (("edf", 0.85), ("fcfs", 0.82)) for s in (0, 1)] + [
        {"scenario": "one", "policy": "jsq", "kind": "baseline", "seed": 0, "slo_attainment": 1.0, "ttft_mean": 0.3}])
    assert class_attainment(runs[runs.scenario == "tiers"]) == ["slo_attainment_chat", "slo_attainment_batch"]
    assert class_attainment(runs[runs.scenario == "one"]) == []
    scs = [BoardScenario("tiers", "slo_pd_tiers", "prefill", "slo_attainment"),
           BoardScenario("one", "ds_v3_h800_3p1d", "prefill", "slo_attainment")]
    table = summarise(runs, scs, ["ttft_mean"])
    frame, _ = scenario_frame(table, scs[0], ["ttft_mean"])
    assert {"slo_attainment_chat (fraction)", "slo_attainment_batch (fraction)"} <= set(frame.columns)
    assert list(frame.policy) == ["edf", "fcfs"]
    assert not any("chat" in c for c in scenario_frame(table, scs[1], ["ttft_mean"])[0].columns)
