"""The zoo (agents/zoo, agents/learned/zoo_store.py): every shipped agent re-scores to the per-seed values committed in
its index entry, the zoo stays under 5 MB, a name is checked before it touches a path, an unknown one is one line
listing the available ones, a changed archive is refused, and the add tool writes an entry that re-scores."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.runner import run_one
from pdgym.agents.learned import zoo_store as zoo
from pdgym.agents.learned.model_store import ModelFileError
from pdgym.agents.zoo import curate
from pdgym.envs.sim.config import ConfigError

ENV_VARS = dict(os.environ, WANDB_MODE="disabled")
SHIPPED = {"prefix_mooncake", "prefill_ds_v3_h800"}  # issue 27's entries trained so far (decode_ht_n16: its own)
ENTRIES = zoo.names()


def cli(module: str, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=ENV_VARS)


def test_the_zoo_ships_its_entries_under_5_mb_with_matching_digests():
    assert set(ENTRIES) >= SHIPPED, ENTRIES
    files = sorted(p for p in zoo.ROOT.iterdir() if p.suffix in (".zip", ".json"))
    assert {p.stem for p in files if p.suffix == ".zip"} == set(ENTRIES)  # no archive without its entry
    assert sum(p.stat().st_size for p in files) < 5 * 10**6
    for name, ent in zoo.read_index().items():
        data = zoo.archive(name).read_bytes()
        assert len(data) == ent["bytes"] and hashlib.sha256(data).hexdigest() == ent["sha256"]
        r = ent["rescore"]
        assert len(r["seeds"]) == 2 and ent["trained"]["command"].startswith("pdgym-train ")
        primary = ent["agent"]["primary"]
        assert len(r["per_seed"][primary]) == 2 and all(v is not None for v in r["per_seed"][primary])


@pytest.mark.parametrize("name", ENTRIES)
def test_each_shipped_agent_rescores_to_its_committed_values(name):
    ent = zoo.entry(name)
    got = curate.rescore(name)
    assert curate.mismatches(ent["rescore"]["per_seed"], got) == []
    assert all(f == f and f > 0 for f in got["finished"])  # it serves requests: a stalled agent would read 0


def test_the_learned_prefill_agents_hold_their_claims_on_the_rescore_seeds():
    """The committed reference values say what docs/results.md says: the release composition beats SBS on mean
    TTFT, the cache-aware router is cache_ttft's twin (the same TTFT on every seed)."""
    comp = zoo.entry("prefill_ds_v3_h800")
    assert comp["reference"]["policy"] == "sbs"
    agent, ref = comp["rescore"]["per_seed"]["ttft_mean"], comp["reference"]["per_seed"]["ttft_mean"]
    assert all(a < r for a, r in zip(agent, ref))
    route = zoo.entry("prefix_mooncake")
    assert route["reference"]["policy"] == "cache_ttft"
    assert route["rescore"]["per_seed"]["ttft_mean"] == route["reference"]["per_seed"]["ttft_mean"]


def test_pdgym_eval_on_zoo_name_gives_the_committed_values(tmp_path):
    name = "prefill_ds_v3_h800"
    ent = zoo.entry(name)
    r = ent["rescore"]
    out = tmp_path / "ev"
    p = cli("pdgym.agents.evaluation.evaluate", f"policy=zoo:{name}", f"scenario={ent['scenario']}",
            *curate.merged(ent["overrides"], r["overrides"]), f"split={r['split']}",
            f"seeds=[{','.join(map(str, r['seeds']))}]", "progress=false", f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["policy"] == f"zoo:{name}" and doc["kind"] == "agent"
    got = {m: doc["metrics"][m]["per_seed"] for m in r["per_seed"]}
    assert curate.mismatches(r["per_seed"], got) == []


def test_an_unknown_zoo_name_is_one_line_listing_the_entries_and_exit_2(tmp_path):
    out = tmp_path / "ev"
    p = cli("pdgym.agents.evaluation.evaluate", "policy=zoo:unknown", "scenario=prefix_mooncake", f"hydra.run.dir={out}")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert all(f"zoo:{n}" in p.stderr for n in ENTRIES) and not out.exists()


@pytest.mark.parametrize("spec", ["zoo:../../etc/passwd", "zoo:Prefix", "zoo:a.zip", "zoo:"])
def test_a_zoo_name_is_checked_before_it_becomes_a_path(spec):
    with pytest.raises(ConfigError, match="is not allowed"):
        candidates.resolve(spec)


def test_the_leaderboard_and_enjoy_take_zoo_names(tmp_path):
    from pdgym.agents.evaluation.leaderboard_run import agent_point

    assert agent_point("zoo:prefix_mooncake") == "prefill"
    with pytest.raises(ConfigError, match="available: zoo:"):
        agent_point("zoo:unknown")
    p = cli("pdgym.agents.apps.leaderboard", "preset=tiny", "agents=[{label: z, path: 'zoo:unknown'}]",
            f"out_dir={tmp_path / 'board'}")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "agents.z.path" in p.stderr
    assert not (tmp_path / "board").exists()
    out = tmp_path / "enjoy"
    p = cli("pdgym.agents.apps.enjoy", "policy=zoo:prefix_mooncake", "scenario=prefix_mooncake",
            "workload.num_requests=12", "every=6", "max_frames=2", f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["policy"] == "zoo:prefix_mooncake" and s["requests_resolved"] == s["requests"] == 12


def test_an_agent_on_another_cluster_shape_is_one_line():
    """The route agent observes 8 instances x DP 8 (773 values); SBS's cluster (3 x DP 8) is refused at its first
    decision, not with a reshape traceback from inside the network."""
    from pdgym.envs.scenario import load_scenario

    raw = load_scenario("ds_v3_h800_3p1d", ["workload.num_requests=20"]).raw
    cand = candidates.resolve("zoo:prefix_mooncake")
    with pytest.raises(ConfigError, match="agent takes observations of 773 values and this scenario gives 293"
                                          ".*scenario=prefix_mooncake: add it"):
        run_one(raw, raw["policy"], cand, None, 0)


@pytest.fixture()
def zoo_copy(tmp_path) -> Path:
    root = tmp_path / "zoo"
    root.mkdir()
    for p in zoo.ROOT.iterdir():
        if p.suffix in (".zip", ".json"):
            shutil.copy(p, root / p.name)
    return root


def test_a_tampered_archive_is_refused(zoo_copy):
    path = zoo.archive("prefix_mooncake", zoo_copy)
    candidates.zoo_agent("prefix_mooncake", zoo_copy)  # the copy loads as shipped
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside the weights: still a readable zip, a different network
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="sha256"):
        candidates.zoo_agent("prefix_mooncake", zoo_copy)


def test_the_index_is_data_checked_key_by_key(zoo_copy):
    idx = zoo_copy / zoo.INDEX
    doc = json.loads(idx.read_text())
    doc["entries"]["prefix_mooncake"]["agent"].pop("env_id")
    idx.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="prefix_mooncake.agent.env_id"):
        zoo.read_index(zoo_copy)
    doc["entries"] = {"../evil": {}}
    idx.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="not allowed"):
        zoo.read_index(zoo_copy)


def test_add_copies_a_run_scores_it_and_writes_the_index(tmp_path):
    """A run folder as pdgym-train leaves it (model + agent.json), added to an empty zoo: the archive is the
    run's bytes, the committed values are what a re-score of the new entry measures, and the reference was
    scored on the same seeds (the route agent ties cache_ttft on every request)."""
    ent = zoo.entry("prefix_mooncake")
    run = tmp_path / "runs" / "train" / "x" / "route"
    run.mkdir(parents=True)
    shutil.copy(zoo.archive("prefix_mooncake"), run / "best_model.zip")
    (run / "agent.json").write_text(json.dumps({**ent["agent"], "scenario": ent["scenario"],
                                                "overrides": ent["overrides"]}))
    root = tmp_path / "zoo"
    new = curate.add("route_copy", run, "pdgym-train experiment=prefix_route_bc_ppo", commit="abc1234",
                     reference="cache_ttft", seeds=[3], rescore_overrides=["workload.num_requests=40"], root=root)
    assert new["sha256"] == ent["sha256"] and new["trained"]["run"] == "runs/train/x/route"
    assert zoo.names(root) == ["route_copy"] and zoo.archive("route_copy", root).read_bytes() == \
        zoo.archive("prefix_mooncake").read_bytes()
    assert new["rescore"]["per_seed"]["finished"] == [40.0]
    assert curate.mismatches(new["rescore"]["per_seed"], curate.rescore("route_copy", root)) == []
    assert new["reference"]["per_seed"]["ttft_mean"] == new["rescore"]["per_seed"]["ttft_mean"]
    assert "policy=zoo:route_copy" in new["rescore"]["command"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary left behind
    p = cli("pdgym.agents.zoo", "add", "Bad/Name", str(run), "--command", "x", "--zoo", str(root))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "not allowed" in p.stderr


# --------------------------------------------------------------------------- where an entry belongs
def test_a_zoo_agent_on_another_scenario_warns_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pdgym.agents.evaluation.evaluate", "policy=zoo:decode_ht_n16",
                        "scenario=decode_tier_n8", "workload.num_requests=60", "seeds=[0]", "progress=false",
                        "hydra.run.dir=out"], capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path,
                       env=ENV_VARS)
    assert r.returncode == 0, r.stderr[-2000:]
    warn = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert len(warn) == 1 and "trained on decode_tier_ht_n16" in warn[0] and "decode_tier_n8 is a transfer" in warn[0]
    p = cli("pdgym.agents.apps.enjoy", "policy=zoo:decode_ht_n16", "scenario=decode_tier_n8", "workload.num_requests=12",
            "every=6", "max_frames=1", f"hydra.run.dir={tmp_path / 'enjoy'}")  # pdgym-enjoy says it as well
    assert p.returncode == 0, p.stderr[-2000:]
    warn = [ln for ln in p.stderr.splitlines() if "warning" in ln]
    assert len(warn) == 1 and warn[0].startswith("pdgym-enjoy: warning: zoo:decode_ht_n16 was trained on")


def test_a_zoo_entrys_training_overrides_apply_on_its_own_scenario_unless_given():
    from pdgym.agents.evaluation import transfer
    from pdgym.envs.scenario import load_scenario

    cand = candidates.resolve("zoo:decode_ht_n16")
    rate = next(float(o.split("=")[1]) for o in zoo.entry("decode_ht_n16")["overrides"] if o.startswith("workload.rate="))
    default = load_scenario("decode_tier_ht_n16").raw
    assert default["workload"]["rate"] != rate
    data, applied = transfer.with_training_traffic(dict(default, scenario_name="decode_tier_ht_n16"), cand, default)
    assert data["workload"]["rate"] == rate and "workload.rate=269.6" in applied
    assert default["workload"]["rate"] != rate  # the scenario's own dict is untouched
    given = load_scenario("decode_tier_ht_n16", ["workload.rate=100"]).raw  # the command line wins
    data, applied = transfer.with_training_traffic(dict(given, scenario_name="decode_tier_ht_n16"), cand, default)
    assert data["workload"]["rate"] == 100 and not any(o.startswith("workload.rate") for o in applied)
    other = load_scenario("decode_tier_n8").raw  # elsewhere nothing is applied (the warning says it is a transfer)
    assert transfer.with_training_traffic(dict(other, scenario_name="decode_tier_n8"), cand, other)[1] == []


def test_pdgym_zoo_list_shows_training_overrides_and_the_rescore_command(capsys):
    from pdgym.envs.sim.shell import runnable

    assert curate.main(["list"]) == 0
    out = capsys.readouterr().out
    for ent in zoo.read_index().values():
        assert f"re-score: {runnable(ent['rescore']['command'])}" in out  # as it runs from this shell
        assert f"trained on {ent['scenario']} {' '.join(ent['overrides'])}" in out
