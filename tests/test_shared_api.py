"""The envs use the baselines' shared machinery only through its read API (baselines/shared.py), never by
subclassing a baseline; each env's observation is declared once and its docstring table is that declaration."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import gymnasium as gym
import numpy as np
import pdgym.envs  # noqa: F401  (registers the envs)
import pytest
from pdgym.baselines import shared
from pdgym.baselines.balance_route import BRH
from pdgym.baselines.cache_routing import UnitDispatch
from pdgym.baselines.exclusive_batching import EB
from pdgym.baselines.length_classes import LengthClasses
from pdgym.baselines.pbaa import PBAA, CapacityModel
from pdgym.baselines.predictors import make_predictor
from pdgym.baselines.sbs import SBS
from pdgym.envs import decode_routing, phase_batching, prefill_dispatch
from pdgym.envs.features import Feature, Layout, parse_table, table
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import Simulator
from pdgym.envs.sim.points import POINTS

ENVS_DIR = Path(prefill_dispatch.__file__).parent
ENV_MODULES = tuple(importlib.import_module(f"pdgym.envs.{p.stem}") for p in sorted(ENVS_DIR.glob("*.py"))
                    if p.stem != "__init__")  # every env module, found (a listed one was missed once)
# the names under which the envs hold each part -> the protocol that lists what they may use of it
PARTS = {"cap": shared.Capacity, "pbaa": shared.Allocator, "sbs": shared.Releaser, "classes": shared.LengthSplit,
         "eb": shared.PhaseMachine, "projector": shared.Projector, "forecaster": shared.Forecaster,
         "conductor": shared.PassEstimates}


def members(proto: type) -> set[str]:
    names = set(getattr(proto, "__annotations__", {}))
    names |= {k for k in vars(proto) if not k.startswith("_")}
    return names


@pytest.mark.parametrize("mod", ENV_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_env_class_subclasses_a_baseline(mod):
    for _, cls in inspect.getmembers(mod, inspect.isclass):
        if cls.__module__ != mod.__name__:
            continue
        bad = [b.__qualname__ for b in cls.__mro__ if b.__module__.startswith("pdgym.baselines")]
        assert not bad, f"{cls.__qualname__} subclasses baseline class(es) {bad}"


def test_envs_touch_the_shared_parts_only_through_their_read_api():
    """Every `<...>.cap.X`, `cap.X`, `self.eb.X`, ... in the envs' code names a member of the part's protocol."""
    used = {}
    for path in sorted(ENVS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else None
            if name in PARTS:
                used.setdefault(name, set()).add((node.attr, f"{path.name}:{node.lineno}"))
    assert set(PARTS) <= set(used)  # the scan sees the envs' parts
    for part, uses in used.items():
        allowed = members(PARTS[part])
        bad = sorted(f"{where} {part}.{attr}" for attr, where in uses if attr not in allowed)
        assert not bad, f"outside baselines/shared.py's {PARTS[part].__name__}: {bad}"


def test_the_parts_implement_their_protocols():
    sim_cfg = load_scenario("ds_v3_h800_3p1d", ["workload.num_requests=20"]).sim
    sbs = SBS()
    sim = Simulator(sim_cfg, {"prefill": sbs}, seed=0)
    sbs.reset(sim.view)
    cap = CapacityModel()
    cap.reset(sim.view)
    for obj, proto in ((cap, shared.Capacity), (PBAA(), shared.Allocator), (sbs, shared.Releaser),
                       (LengthClasses(), shared.LengthSplit), (EB(), shared.PhaseMachine),
                       (BRH(predictor="oracle"), shared.Projector),
                       (make_predictor("survival", "workload", None, 20000, 3), shared.Forecaster),
                       (UnitDispatch(), shared.PassEstimates)):
        assert isinstance(obj, proto), f"{type(obj).__name__} does not implement {proto.__name__}"
        missing = [m for m in members(proto) if not hasattr(obj, m)]
        assert not missing, (type(obj).__name__, missing)
    # the read API returns read-only views: reading never changes the model
    before = cap.reported().copy()
    for view in (cap.reported(), cap.last_forward()):  # read-only views: a write fails loudly, state unchanged
        with pytest.raises(ValueError, match="read-only"):
            view[:] = 7
    assert (cap.reported() == before).all() and np.isnan(cap.last_forward()).all()


def test_sbs_release_hook_keeps_the_timing_and_hands_over_the_release():
    """With a hook, SBS calls it where it would release (the buffer stays until the hook sends it); a hook that
    releases the whole buffer at once gives SBS's own run."""
    sim_cfg = load_scenario("ds_v3_h800_3p1d", ["workload.num_requests=200"]).sim

    def run(hooked: bool):
        sbs = SBS()
        calls = []
        if hooked:
            def hook(sim, target):
                calls.append((sim.now, target, len(sim.buffer)))
                sbs.release(sim, target)
            sbs.hook_release(hook)
        sim = Simulator(sim_cfg, {"prefill": sbs}, seed=0)
        sim.run()
        return sim.req.first_token.copy(), sbs.stats["releases"], calls

    own, n_own, _ = run(False)
    hooked, n_hooked, calls = run(True)
    assert np.array_equal(own, hooked, equal_nan=True) and n_own == n_hooked == len(calls) > 0
    assert all(n > 0 for _, _, n in calls)  # SBS asks only with something buffered


CORES = {"prefill": (prefill_dispatch, "pdgym/PrefillDispatch-v0"),
         "decode": (decode_routing, "pdgym/DecodeRouting-v0"),
         "batching": (phase_batching, "pdgym/PhaseBatching-v0")}


@pytest.mark.parametrize("point", sorted(CORES))
def test_docstring_table_is_the_declaration(point):
    mod, env_id = CORES[point]
    env_cls = gym.spec(env_id).entry_point
    env_cls = getattr(mod, env_cls.rsplit(":", 1)[1])
    rows = parse_table(env_cls.__doc__)
    want = [(f.width, (f"(`{f.when}`) " if f.when else "") + f.meaning, float(f.low), float(f.high))
            for f in (*mod.GLOBAL, *mod.ROW)]
    assert rows == want


OPTIONS = {"prefill": [{}, {"mode": "allocation", "cache_aware": True}, {"mode": "composition", "obs_requests": 4}],
           "decode": [{}, {"horizon_features": "memo", "max_workers": 12}, {"action": "pick"}],
           "batching": [{}, {"mode": "threshold"}]}
SCENARIO = {"prefill": {"overrides": ["workload.num_requests=120", "workload.rate=150"]},
            "decode": {"scenario": "decode_tier_n8", "overrides": ["workload.num_requests=120", "workload.rate=400"]},
            "batching": {"overrides": ["workload.num_requests=40", "workload.concurrency=16"]}}


@pytest.mark.parametrize("point", sorted(CORES))
def test_observations_lie_in_the_declared_bounds(point):
    """The declared bounds are true: a random agent's observations need no clipping to lie in the Box they build
    (Layout.build clips, so the test reads what it clipped), and the layout's parts add up to the vector."""
    mod, env_id = CORES[point]
    for opts in OPTIONS[point]:
        env = gym.make(env_id, disable_env_checker=True, **SCENARIO[point], **opts).unwrapped
        space = env.observation_space
        lay = env.obs_layout
        assert space.shape == (lay["global_dim"] + lay["n_slots"] * lay["per_slot_dim"],)
        assert len(env.core.layout.names) == space.shape[0]
        clipped = env.core.layout.clipped = []
        rng = np.random.default_rng(1)
        obs, _ = env.reset(seed=0)
        for _ in range(150):
            assert space.contains(obs), (opts, np.flatnonzero((obs < space.low) | (obs > space.high)))
            assert not clipped, (opts, sorted(set(clipped))[:10])
            m = env.action_masks()
            obs, _, term, trunc, _ = env.step(int(rng.choice(np.flatnonzero(m))))
            if term or trunc:
                obs, _ = env.reset()
        env.close()


def test_architecture_doc_says_which_baselines_modules_register_policies():
    """docs/architecture.md lists every baselines module once, as shared machinery (registers nothing) or as
    policies (registers each name it lists)."""
    import importlib
    import re

    from pdgym.baselines.registry import _REGISTRY, registered

    doc = (ENVS_DIR.parent / "docs" / "architecture.md").read_text()
    block = doc[doc.index("  shared machinery ("):doc.index("agents/   ")]
    machinery = block[:block.index("  policies (")]
    policies = block[block.index("  policies ("):]
    listed = re.findall(r"^ {4}(\w+)\.py", block, re.M)
    mods = sorted(p.stem for p in (ENVS_DIR.parent / "baselines").glob("*.py")
                  if p.stem not in ("__init__", "registry", "shared"))
    assert sorted(listed) == mods
    for k in POINTS:
        registered(k)  # imports every baselines module
    by_module = {}
    for names in _REGISTRY.values():
        for name, cls in names.items():
            by_module.setdefault(cls.__module__.rsplit(".", 1)[-1], set()).add(name)
    for mod in re.findall(r"^ {4}(\w+)\.py", machinery, re.M):
        importlib.import_module(f"pdgym.baselines.{mod}")
        assert mod not in by_module, f"{mod} registers {by_module.get(mod)} but is listed as shared machinery"
    for line in re.findall(r"^ {4}(\w+)\.py +\w+: ([^(\n]+)", policies, re.M):
        mod, names = line
        assert {n.strip() for n in names.split(",")} <= by_module.get(mod, set()), mod


def test_appending_a_feature_extends_vector_bounds_layout_and_table():
    """What the lead's next features need: one more Feature entry moves nothing before it."""
    class Core:
        extra = True

    glob = [Feature("a", lambda o: 0.5, 0, 1, "a"), Feature("b", lambda o: np.arange(4.0), 0, 9, "b", width="2 N")]
    row = [Feature("r", lambda o: o["r"], -1, 1, "r")]
    base = Layout(glob, row, Core(), {"N": 2}, 3)
    more = Layout([*glob, Feature("c", lambda o: [7.0, 8.0], 0, 7.5, "c", width="N", when="extra")],
                  [*row, Feature("s", lambda o: o["s"], 0, 2, "s", width="N")], Core(), {"N": 2}, 3)
    ctx = {"r": np.array([-3.0, 0.5]), "s": np.array([[1.0, 3.0], [0.5, 0.25]])}
    v0, v1 = base.build(ctx, 2), more.build(ctx, 2)
    assert (base.global_dim, base.slot_dim, more.global_dim, more.slot_dim) == (5, 1, 7, 3)
    assert v0.tolist() == [0.5, 0, 1, 2, 3, -1, 0.5, 0]  # clipped to [-1, 1]; the third row is padding
    assert v1.tolist() == [0.5, 0, 1, 2, 3, 7, 7.5, -1, 1, 2, 0.5, 0.5, 0.25, 0, 0, 0]
    assert more.obs_layout == {"n_slots": 3, "per_slot_dim": 3, "global_dim": 7, "slots_first": False,
                               "mask_index": 0}
    assert more.box().low.tolist()[5:10] == [0, 0, -1, 0, 0]
    doc = table([*glob, Feature("c", None, 0, 7.5, "c", width="N", when="extra")], row)
    assert "| 1 + 2 N | N | (`extra`) c | 0 | 7.5 |" in doc
    assert parse_table(doc)[-1] == ("1", "r", -1.0, 1.0)
