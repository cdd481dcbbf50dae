"""A policy from outside the tree (`module:Class`): docs/concepts.md's worked router, copied into an empty
folder, runs from the command line and from Python there; a bad module, class or base is one line, exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pdgym.baselines import make_policies, make_policy
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import ConfigError, DecodeRouter, simulate

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _worked_router() -> str:
    text = (ROOT / "docs" / "concepts.md").read_text()
    blocks = re.findall(r"```python\n(# my_router\.py.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/concepts.md holds one python block starting '# my_router.py'"
    return blocks[0]


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """An empty folder outside the tree holding my_router.py, as the working directory."""
    (tmp_path / "my_router.py").write_text(_worked_router() + "\n\nclass NotAPolicy:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("my_router", None)


def _cli(app: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / app), *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          check=False, env={"WANDB_MODE": "disabled", "PATH": str(BIN)})


def test_the_worked_router_from_python_makes_least_kvs_decisions(outside):
    sc = load_scenario("decode_tier_n8", ["workload.num_requests=200"])
    pols = make_policies({**sc.policy, "decode": "my_router:OldestToLeastKV"})
    assert isinstance(pols["decode"], DecodeRouter) and type(pols["decode"]).__module__ == "my_router"
    mine = simulate(sc.sim, pols, seed=3)
    ref = simulate(sc.sim, make_policies({**sc.policy, "decode": "least_kv"}), seed=3)
    assert mine.requests.equals(ref.requests) and (mine.requests.status == "finished").all()
    capped = make_policy("decode", {"name": "my_router:OldestToLeastKV", "max_per_step": 1})
    assert capped.max_per_step == 1


@pytest.mark.parametrize("name, says", [
    ("my_router:Nope", "module 'my_router' has no class 'Nope'; its policy classes: OldestToLeastKV"),
    ("my_router:NotAPolicy", "my_router:NotAPolicy does not subclass pdgym.envs.sim.policy.DecodeRouter"),
    ("no_such_module:X", "cannot import module 'no_such_module'"),
])
def test_a_bad_module_class_or_base_is_one_config_error(outside, name, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        make_policies({"decode": name})
    with pytest.raises(ConfigError, match="not a parameter of my_router:OldestToLeastKV"):
        make_policy("decode", {"name": "my_router:OldestToLeastKV", "bogus": 1})


def test_the_worked_router_from_the_command_line_outside_the_tree(outside):
    p = _cli("pdgym-sim", "scenario=decode_tier_n8", "workload.num_requests=200", "plots=false",
             "policy.decode.name=my_router:OldestToLeastKV", "hydra.run.dir=sim", cwd=outside)
    assert p.returncode == 0, p.stderr
    assert json.loads((outside / "sim" / "metrics.json").read_text())["finished"] == 200
    p = _cli("pdgym-eval", "policy=my_router:OldestToLeastKV", "scenario=decode_tier_n8", "workload.num_requests=200",
             "seeds=[0]", "progress=false", "hydra.run.dir=ev", cwd=outside)
    assert p.returncode == 0, p.stderr
    m = json.loads((outside / "ev" / "metrics.json").read_text())
    assert m["point"] == "decode" and m["metrics"]["finished"]["mean"] == 200
    p = _cli("pdgym-leaderboard", "preset=tiny", "scenarios.prefill_ds_v3_h800=null", "out_dir=board",
             'scenarios.decode_ht_n16.baselines=[least_kv, "my_router:OldestToLeastKV"]', cwd=outside)
    assert p.returncode == 0, p.stderr
    board = next((outside / "board").glob("*/leaderboard.csv")).read_text()
    assert "decode_ht_n16,my_router:OldestToLeastKV,baseline,imbalance_mean" in board
    for app, arg in (("pdgym-eval", "policy=my_router:NotAPolicy"), ("pdgym-sim", "policy.decode.name=my_router:Nope")):
        p = _cli(app, arg, "scenario=decode_tier_n8", "seeds=[0]" if app == "pdgym-eval" else "seed=0",
                 "hydra.run.dir=bad", cwd=outside)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "Traceback" not in p.stderr and not (outside / "bad").exists()


EVIL = '''import pathlib
pathlib.Path("IMPORTED").write_text("a stored file made pdgym import me")
from pdgym.envs.sim.policy import BatchingPolicy, PrefillScheduler


class EvilPrefill(PrefillScheduler):
    pass


class EvilBatching(BatchingPolicy):
    pass
'''


def test_a_module_class_named_by_a_stored_file_is_refused_not_imported(tmp_path, monkeypatch):
    """A run folder's agent.json (or a zoo entry) whose settings name `module:Class` policies: pdgym-enjoy and the
    Python loader refuse them in one line and never import the module; the same name given from Python imports it
    (the trap is live)."""
    import shutil

    from pdgym.agents.evaluation.candidates import LoadedAgent

    (tmp_path / "evilmod.py").write_text(EVIL)
    marker = tmp_path / "IMPORTED"
    run = tmp_path / "run"
    run.mkdir()
    index = json.loads((ROOT / "agents" / "zoo" / "index.json").read_text())["entries"]["decode_ht_n16"]
    shutil.copy(ROOT / "agents" / "zoo" / "decode_ht_n16.zip", run / "final_model.zip")
    meta = dict(index["agent"], env_kwargs=dict(index["agent"]["env_kwargs"], prefill="evilmod:EvilPrefill"))
    (run / "agent.json").write_text(json.dumps(meta))
    p = _cli("pdgym-enjoy", f"policy={run}", "scenario=decode_tier_ht_n16", "workload.num_requests=12", "every=6",
             "max_frames=2", f"hydra.run.dir={tmp_path / 'enjoy'}", cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
    assert "'evilmod:EvilPrefill' is named by" in p.stderr and "agent.json" in p.stderr
    assert not marker.exists() and not (tmp_path / "enjoy" / "summary.json").exists()

    monkeypatch.chdir(tmp_path)
    stored = {"point": "batching", "env_id": "pdgym/PhaseBatching-v0", "env_kwargs": {"fallback": "evilmod:EvilBatching"}}
    with pytest.raises(ConfigError, match="is named by runs/x/agent.json"):
        LoadedAgent(Path("x.zip"), stored, lambda obs, mask: 0, "runs/x/agent.json").policy()
    assert not marker.exists() and "evilmod" not in sys.modules
    try:
        assert type(make_policy("prefill", "evilmod:EvilPrefill")).__name__ == "EvilPrefill"  # named from Python
        assert marker.exists()
    finally:
        sys.modules.pop("evilmod", None)


def test_the_worked_prefill_dispatcher_runs_from_python_and_the_command_line(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "concepts.md").read_text()
    blocks = re.findall(r"```python\n(# my_dispatcher\.py.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/concepts.md holds one python block starting '# my_dispatcher.py'"
    (tmp_path / "my_dispatcher.py").write_text(blocks[0])
    monkeypatch.chdir(tmp_path)
    try:
        sc = load_scenario("ds_v3_h800_3p1d", ["workload.num_requests=300"])
        res = simulate(sc.sim, make_policies({**sc.policy, "prefill": "my_dispatcher:FewestTokens"}), seed=0)
    finally:
        sys.modules.pop("my_dispatcher", None)
    r = res.requests
    assert (r.status == "finished").all() and len(r) == 300
    # what it states: dispatched on arrival (nothing held), and the tokens spread over every prefill instance
    assert ((r.dispatch - r.arrival).abs() < 1e-9).all()
    assert r.prefill_inst.nunique() == sc.sim.cluster.prefill.count
    p = _cli("pdgym-eval", "policy=my_dispatcher:FewestTokens", "scenario=ds_v3_h800_3p1d", "workload.num_requests=300",
             "seeds=[0]", "progress=false", "hydra.run.dir=ev", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert m["point"] == "prefill" and m["metrics"]["finished"]["mean"] == 300
