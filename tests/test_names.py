"""One set of policy names: every registered class and configured preset (conf/policy/POINT/NAME.yaml) is taken
wherever a policy is named (make_policies, pdgym-sim's compare, pdgym-eval's policy=, a board's baselines);
make_policies takes policy objects and classes; an ambiguous or mistyped name says what to write."""

from __future__ import annotations

import dataclasses

import pytest
from pdgym.agents.evaluation import candidates
from pdgym.baselines import make_policies, registered
from pdgym.baselines.registry import names, presets
from pdgym.envs.sim import DecodeRouter
from pdgym.envs.sim.config import ConfigError

SCENARIO = {"prefill": "ds_v3_h800_3p1d", "decode": "decode_tier_n16", "batching": "coloc_h200_qwen3_8b"}


def _compose(scenario: str):
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("pdgym.conf", version_base=None):
        return compose("config", overrides=[f"scenario={scenario}", "workload.num_requests=20"])


@pytest.mark.parametrize("point", list(SCENARIO))
def test_every_name_of_a_point_passes_through_compare(point):
    from omegaconf import OmegaConf, open_dict
    from pdgym.agents.apps import sim

    every = names(point)
    assert set(registered(point)) <= set(every) and set(presets(point)) <= set(every)
    cfg = _compose(SCENARIO[point])
    with open_dict(cfg):
        cfg.compare = OmegaConf.create([{"label": f"s{i}", point: n} for i, n in enumerate(every)])
    sets = sim.policy_sets(cfg)
    assert [s[point] for _, s in sets] == every
    for (_, spec), name in zip(sets, every):  # what validate builds for each set of the compare list
        built = make_policies(spec)[point]
        want = candidates.resolve(name, point).spec["name"]  # a preset builds its registered class
        assert type(built).name == want


def test_sbs_cache_in_compare_is_the_preset_with_its_parameters():
    from omegaconf import OmegaConf, open_dict
    from pdgym.agents.apps import sim

    cfg = _compose("ds_v3_h800_3p1d")
    with open_dict(cfg):
        cfg.compare = OmegaConf.create([{"label": "a", "prefill": "sbs"}, {"label": "b", "prefill": "sbs_cache"}])
    _, _, _, sets = sim.validate(cfg)
    (_, _, a), (_, _, b) = sets
    assert type(a["prefill"]) is type(b["prefill"])
    assert b["prefill"].allocation == "pbaa_cache" and a["prefill"].allocation != "pbaa_cache"


def test_make_policies_takes_objects_and_classes():
    obj = FewestRunning()
    built = make_policies({"prefill": "round_robin", "decode": obj})
    assert built["decode"] is obj
    fresh = make_policies({"decode": FewestRunning})["decode"]
    assert isinstance(fresh, FewestRunning) and fresh is not obj
    with pytest.raises(ConfigError, match="does not subclass"):
        make_policies({"prefill": FewestRunning})
    with pytest.raises(ConfigError, match=r"policy\.decode: got int"):
        make_policies({"decode": 3})


def test_simulate_takes_a_policy_class_as_make_policies_does():
    from pdgym.envs.scenario import load_scenario
    from pdgym.envs.sim import simulate

    sc = load_scenario("decode_tier_n8", ["workload.num_requests=40"])
    by_class = simulate(sc.sim, {"decode": FewestRunning}, seed=0).requests
    by_object = simulate(sc.sim, {"decode": FewestRunning()}, seed=0).requests
    assert by_class.equals(by_object) and (by_class.status == "finished").all()
    with pytest.raises(ConfigError, match=r"policies\.prefill: class FewestRunning is not a PrefillScheduler"):
        simulate(sc.sim, {"prefill": FewestRunning}, seed=0)


def test_an_ambiguous_name_says_which_point_to_set():
    with pytest.raises(ConfigError) as exc:
        candidates.resolve("jsq")
    msg = str(exc.value)
    assert "set point=prefill|decode" in msg and "JoinShortestQueue" in msg and "least_kv" not in msg
    assert candidates.resolve("jsq", "decode").point == "decode"


def test_a_mistyped_name_gets_did_you_mean():
    with pytest.raises(ConfigError, match="did you mean 'least_kv'"):
        candidates.resolve("least_kvv")
    with pytest.raises(ConfigError, match="did you mean 'sbs_cache'"):
        make_policies({"prefill": "sbs_cach"})


def test_a_policy_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "br0").mkdir()  # e.g. pdgym-eval policy=br0 hydra.run.dir=br0 created it
    assert candidates.resolve("br0").kind == "baseline"


class FewestRunning(DecodeRouter):
    """A user's router (the first-week trial's): each pooled request to the worker with the fewest requests."""

    def route(self, sim, inst):
        d = sim.decode[inst]
        for rid in list(sim.pool):
            free = d.batch < d.batch_limit
            if not free.any():
                return
            sim.admit(rid, inst, int(min(range(len(d.batch)), key=lambda w: (not free[w], d.batch[w]))))


def test_a_board_takes_every_prefill_name_as_a_baseline():
    from pdgym.agents.apps import leaderboard as L
    from pdgym.agents.evaluation.leaderboard_run import board_scenarios

    (sc,) = board_scenarios({"p": {"scenario": "ds_v3_h800_3p1d", "point": "prefill", "primary": "ttft_mean",
                                   "baselines": names("prefill")}})
    L.check_candidates(sc)  # raises on a name the board could not run
    with pytest.raises(ConfigError, match="did you mean 'sbs_cache'"):
        L.check_candidates(dataclasses.replace(sc, baselines=["sbs_cach"]))


@pytest.mark.parametrize("typo, options, expected", [
    ("brO", ["brh", "br0"], "br0"),  # a letter O for the digit: difflib ranked brh and br0 equal and said brh
    ("LEAST_KV", ["least_kv", "jsq"], "least_kv"),  # case
    ("jsq_typo", ["jsq", "random"], "jsq"),  # a registered name with something after it: difflib's ratio is 0.55
    ("imbalance_meen", ["imbalance_mean", "ttft_mean"], "imbalance_mean"),
    ("bogus", ["python", "numba"], None),  # nothing close: no suggestion rather than a wrong one
])
def test_did_you_mean_finds_look_alikes_and_prefixes_but_invents_nothing(typo, options, expected):
    from pdgym.envs.sim.validation import did_you_mean

    assert did_you_mean(typo, options) == (f"did you mean {expected!r}? " if expected else "")


def test_make_policies_suggests_the_registered_name_a_typo_came_from():
    with pytest.raises(ConfigError, match="did you mean 'jsq'"):
        make_policies({"decode": "jsq_typo"})
    with pytest.raises(ConfigError, match="did you mean 'br0'"):
        make_policies({"decode": "brO"})
