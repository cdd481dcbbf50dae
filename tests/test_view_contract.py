"""The view a policy is handed (envs/sim/view.py, facades.py) is read-only and leads nowhere into the engine.

Every public attribute path from `sim.view` (bounded depth; zero-argument queries called; containers
entered) is walked on running engines of each topology. The walk fails if it reaches an object the
engine owns (the engine itself, an instance, the request table, a buffer / pool dict, a cache, the
config, ...), a writable array that is not a fresh result, an array whose flag can be reopened or whose
`.base` chain holds a writable array, a method bound to an engine object, a private attribute that answers,
or an object that accepts a write (setattr or object.__setattr__).
Then a decode router from outside tries issue 44's tampers inside route(), on a run beside a clean one: each
is refused, and the run's summary is the clean run's (what Python still allows: docs/architecture.md, "What a
policy cannot do").
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
from collections import deque
from types import MappingProxyType

import numpy as np
import pytest
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim import PolicyError, SimResult, Simulator, simulate
from pdgym.envs.sim.policy import LeastLoadedAdmission, RoundRobinDispatch

ACTIONS = {"dispatch", "reject", "set_timer", "admit", "pause"}  # the view's actions: not called by the walk
LEAVES = (int, float, bool, str, bytes, type(None), np.generic, type, range)
MUTABLE = (list, dict, set, deque, bytearray)
DEPTH = 6

# (scenario, overrides, simulated seconds to run before walking): each topology, and both prefix-cache kinds
ENGINES = {
    "decode_tier": ("decode_tier_n8", ["workload.num_requests=300", "workload.rate=400"], 0.5),
    "prefill_prefix_keys": ("ds_v3_h800_3p1d", ["workload.num_requests=200", "cluster.prefill.prefix_cache_entries=8"],
                            1.0),
    "prefill_block_cache": ("prefix_mooncake", ["workload.num_requests=150", "workload.trace_offset=4000",
                                                "workload.rate=8.5"], 3.0),
    "colocated": ("coloc_h100_qwen3_8b", ["workload.num_requests=120", "workload.concurrency=32"], 2.0),
}


TIGHT_KV = ("decode_tier_n8", ["workload.num_requests=300", "workload.rate=400", "cluster.decode.kv_capacity_tokens=16000"], 0.1)


def engine(name: str) -> Simulator:
    scen, overrides, until = TIGHT_KV if name == "tight_kv" else ENGINES[name]
    sim = Simulator(load_scenario(scen, overrides).sim, None, seed=0)
    sim.run(until=until)
    return sim


def engine_objects(sim: Simulator) -> dict[int, object]:
    """Every mutable object the engine reaches (private attributes included), the view and the policies excluded."""
    skip = {id(sim.view), id(sim.policies), id(sim.rng)}
    seen: dict[int, object] = {}
    todo = [(sim, 0)]
    while todo:
        obj, depth = todo.pop()
        if (isinstance(obj, LEAVES) or id(obj) in skip or id(obj) in seen
                or callable(obj) and not hasattr(obj, "__dict__")):
            continue
        frozen = dataclasses.is_dataclass(obj) and type(obj).__dataclass_params__.frozen
        if not isinstance(obj, (tuple, frozenset)) and not frozen:  # immutable containers are entered, not owned
            seen[id(obj)] = obj
        if depth >= 8 or isinstance(obj, np.ndarray):
            continue
        if isinstance(obj, dict):
            items = list(obj.values())[:50]
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            items = list(obj)[:50]
        else:
            items = [getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
            items += list(getattr(obj, "__dict__", {}).values())
        todo.extend((x, depth + 1) for x in items)
    return seen


def public(obj) -> list[str]:
    return [n for n in dir(obj) if not n.startswith("_")]


def walk_view(sim: Simulator, owned: dict[int, object]):
    """(path, object, how it was reached: 'attr' | 'item' | 'call') for every public path from the view (not
    entering what the engine owns: reaching it is the failure)."""
    out, todo, seen = [], [("view", sim.view, "attr", 0)], set()
    while todo:
        path, obj, how, depth = todo.pop()
        out.append((path, obj, how))
        if isinstance(obj, (*LEAVES, np.ndarray, np.random.Generator)) or id(obj) in seen or id(obj) in owned:
            continue
        seen.add(id(obj))
        if depth >= DEPTH:
            continue
        inner = "call" if how == "call" else None  # what a query returned is the caller's own, all the way down
        if isinstance(obj, (tuple, list, frozenset)) or type(obj).__name__ in ("SeqView", "SetView", "Completed"):
            todo.extend((f"{path}[{k}]", x, inner or "item", depth + 1) for k, x in enumerate(list(obj)[:8]))
            continue
        if isinstance(obj, (MappingProxyType, dict)):
            todo.extend((f"{path}[{k!r}]", v, inner or "item", depth + 1) for k, v in list(obj.items())[:8])
            continue
        for name in public(obj):
            try:
                val = getattr(obj, name)
            except Exception:  # noqa: BLE001  (an oracle-only field, a property without state yet)
                continue
            if inspect.ismethod(val) or inspect.isbuiltin(val) or inspect.isfunction(val):
                if name in ACTIONS:
                    continue
                try:
                    required = [p for p in inspect.signature(val).parameters.values()
                                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                except (TypeError, ValueError):
                    continue
                if not required and not isinstance(obj, np.random.Generator):
                    try:
                        todo.append((f"{path}.{name}()", val(), "call", depth + 1))
                    except Exception:  # noqa: BLE001  (a query that needs state the run has not reached)
                        continue
                continue
            todo.append((f"{path}.{name}", val, inner or "attr", depth + 1))
    return out


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_no_public_path_from_the_view_reaches_the_engine_or_writes(name):
    sim = engine(name)
    owned = engine_objects(sim)
    assert sim.view.cfg is not sim.cfg and sim.view.cfg == sim.cfg  # a copy: equal, not the engine's
    paths = walk_view(sim, owned)
    assert len(paths) > 100, "the walk saw too little of the view"
    bad = []
    for path, obj, how in paths:
        if isinstance(obj, (*LEAVES, np.random.Generator)):  # rng: the policies' own stream
            continue
        if id(obj) in owned:
            bad.append(f"{path}: reaches the engine's {type(obj).__name__}")
        elif isinstance(obj, np.ndarray):
            fresh = how == "call" and (obj.base is None or id(obj.base) not in owned)
            if not fresh:
                bad += [f"{path}: {why}" for why in array_tampers(obj)]
        elif path.startswith(OWN) or how == "call":  # the view's own copies, a query's fresh results
            continue
        elif isinstance(obj, MUTABLE):
            bad.append(f"{path}: a mutable {type(obj).__name__}")
        elif not isinstance(obj, (tuple, frozenset, MappingProxyType, MUTABLE)):
            for attr in public(obj):
                try:
                    val = getattr(obj, attr)
                except Exception:  # noqa: BLE001
                    continue
                for write in (setattr, object.__setattr__):
                    try:
                        write(obj, attr, val)
                    except (AttributeError, TypeError):
                        continue
                    bad.append(f"{path}.{attr}: accepts {write.__name__}")
            for attr in PRIVATE:
                if hasattr(obj, attr):
                    bad.append(f"{path}.{attr}: a private attribute answers")
            for attr in public(obj):
                try:
                    owner = getattr(getattr(obj, attr), "__self__", None)
                except Exception:  # noqa: BLE001  (an oracle-only field)
                    continue
                if owner is not None and owner is not obj and id(owner) in owned:
                    bad.append(f"{path}.{attr}: a method bound to the engine's {type(owner).__name__}")
    assert not bad, "\n".join(sorted(set(bad))[:30])


OWN = ("view.cfg", "view.classes")  # copies this view alone holds (the engine's are checked not to be reached)
PRIVATE = ("_engine", "_i", "_c", "_s", "_proxies", "_output", "_log", "_ids")  # issue 44's back doors


def array_tampers(a: np.ndarray) -> list[str]:
    """What a policy could do to write array `a` or what lies under it: each one that works."""
    out = []
    try:
        a.flags.writeable = True
        out.append("flags.writeable = True succeeds")
    except ValueError:
        pass
    base, depth = a.base, 0
    while base is not None and depth < 8:
        if isinstance(base, np.ndarray) and base.flags.writeable:
            out.append(f"a writable array at .base depth {depth + 1}")
        try:
            if np.asarray(base).flags.writeable:
                out.append(f"np.asarray(.base) at depth {depth + 1} is writable")
        except (TypeError, ValueError):
            pass
        if isinstance(base, memoryview) and (not base.readonly or isinstance(base.obj, np.ndarray)):
            out.append(f"a memoryview at .base depth {depth + 1} leads to the array")
        base, depth = getattr(base, "base", None), depth + 1
    return out


def test_the_view_names_no_engine_back_reference():
    sim = engine("decode_tier")
    v = sim.view
    for obj in (v, v.decode[0], v.req, v.completed, v.decode[0].cost):
        assert not hasattr(obj, "sim") and not hasattr(obj, "engine")
    with pytest.raises(AttributeError, match="read-only"):
        v.decode[0].kv = np.zeros(8)
    with pytest.raises(ValueError):
        v.decode[0].kv[0] = 1
    with pytest.raises(AttributeError, match="read-only"):
        v.decode = ()
    with pytest.raises(AttributeError):
        v.completed.append(0)


def test_colocated_containers_are_read_only_and_follow_the_run():
    sim = engine("colocated")
    u, unit = sim.view.colocated[0].units[0], sim.colocated[0].units[0]
    assert list(u.waiting) == list(unit.waiting) and list(u.prefilling) == list(unit.prefilling)
    assert set(u.decoding) == unit.decoding and u.n_running == unit.n_running
    for name in ("append", "appendleft", "pop", "remove", "add", "clear"):
        assert not hasattr(u.waiting, name) and not hasattr(u.decoding, name)
    before = (len(unit.waiting), unit.n_running)
    sim.run(until=sim.now + 1.0)
    assert (len(u.waiting), u.n_running) == (len(unit.waiting), unit.n_running) != before or before == (0, 0)


def test_a_cost_query_leaves_the_cost_model_as_it_was():
    sim = engine("prefill_prefix_keys")
    model, q = sim.prefill[0].cost, sim.view.prefill[0].cost
    unit, idle = model.last_unit, model.last_idle_frac
    z = np.zeros(q.dp)
    t = q.pass_time(z + 4096, z + 4096 * 2048, z, z)
    assert t == model.pass_time(z + 4096, z + 4096 * 2048, z, z) > 0
    model.last_unit, model.last_idle_frac = unit, idle
    q.pass_time(z + 100, z + 5000, z, z)
    assert model.last_unit is unit and model.last_idle_frac == idle


def test_admission_is_the_one_rule_routers_and_masks_ask():
    """`fits(load)[w]` (what routers.feasible and the decode envs' masks read) is exactly whether the instance
    admits: on a refusal nothing changes, on the first allowed worker the request joins."""
    sim = engine("tight_kv")
    refused = admitted = 0
    for _ in range(40):
        sim.run(until=sim.now + 0.05)
        for rid in list(sim.pool)[:4]:
            load = sim.req.load(rid)
            for inst, d in enumerate(sim.decode):
                want = sim.view.decode[inst].fits(load)
                for w in range(d.dp):
                    before = (d.batch.copy(), d.kv.copy())
                    got = d.admit(rid, w)
                    assert got == bool(want[w]), (rid, inst, w)
                    if got:
                        del sim.pool[rid]
                        admitted += 1
                        break
                    refused += 1
                    assert (d.batch == before[0]).all() and (d.kv == before[1]).all()
                else:
                    continue
                break
    assert admitted >= 5 and refused >= 5


# --------------------------------------------------------------------------- issue 44's tampers, tried by a policy
def _tampers(v) -> dict[str, object]:
    """Each tamper a router from outside tried inside route() (issue 44), as a thunk: it must raise."""
    rid = next(iter(v.pool))
    arrays = {"req.prompt": v.req.prompt, "req.state": v.req.state, "req.work": v.req.work, "decode.kv": v.decode[0].kv,
              "decode.batch": v.decode[0].batch, "decode.kv_cap": v.decode[0].kv_cap,
              "prefill_healthy": v.prefill_healthy, "completed[:]": v.completed[:]}
    out: dict[str, object] = {}
    for name, a in arrays.items():
        out[f"{name}.flags.writeable = True"] = lambda a=a: setattr(a.flags, "writeable", True)
        out[f"{name}.setflags(write=True)"] = lambda a=a: a.setflags(write=True)
        out[f"{name}[:] = 0"] = lambda a=a: a.__setitem__(slice(None), 0)
        out[f"{name}.base written"] = lambda a=a: np.asarray(a.base).__setitem__(slice(None), 0)
        out[f"{name}: an array down its .base chain written"] = lambda a=a: _write_down(a)
        out[f"{name}: as_strided(writeable=True) written"] = lambda a=a: np.lib.stride_tricks.as_strided(
            a, writeable=True).__setitem__(slice(None), 0)
        out[f"{name}: np.frombuffer over it written"] = lambda a=a: np.frombuffer(a, a.dtype).__setitem__(0, 0)
    out["decode[0].kv.base: a new interface, written"] = lambda: (
        object.__setattr__(v.decode[0].kv.base, "_iface", v.decode[0].kv.base._iface),
        np.asarray(v.decode[0].kv.base).__setitem__(0, 0))
    for name in ("dispatch", "admit", "reject", "set_timer", "pause", "healthy_prefill", "fill_prefill"):
        out[f"view.{name}.__self__ is the engine"] = lambda name=name: _engine_or_raise(getattr(v, name).__self__)
    for obj_name, obj in (("view", v), ("view.decode[0]", v.decode[0]), ("view.req", v.req),
                          ("view.decode[0].cost", v.decode[0].cost), ("view.completed", v.completed),
                          ("view.decode[0].active[0]", v.decode[0].active[0])):
        for attr in PRIVATE:
            out[f"{obj_name}.{attr}"] = lambda obj=obj, attr=attr: getattr(obj, attr)
    for obj_name, obj, attr in (("view.decode[0]", v.decode[0], "kv"), ("view.decode[0]", v.decode[0], "batch_limit"),
                                ("view", v, "decode"), ("view", v, "req"), ("view.req", v.req, "prompt"),
                                ("view.decode[0].cost", v.decode[0].cost, "dp")):
        out[f"object.__setattr__({obj_name}, {attr!r})"] = lambda obj=obj, attr=attr: object.__setattr__(
            obj, attr, np.zeros(64, dtype=np.int64))
        out[f"{obj_name}.{attr} = ..."] = lambda obj=obj, attr=attr: setattr(obj, attr, np.zeros(64, dtype=np.int64))
    out["view.pool[rid] deleted"] = lambda: v.pool.__delitem__(rid)
    out["view.decode[0].active[0].add"] = lambda: v.decode[0].active[0].add(rid)
    out["view.req.output without oracle"] = lambda: v.req.output
    out["admit to a worker that does not exist"] = lambda: v.admit(rid, 0, 10**6)
    out["admit a request not in the pool"] = lambda: v.admit(-1, 0, 0)
    out["reject a request nobody holds"] = lambda: v.reject(-5, "policy")
    return out


def _write_down(a) -> None:
    """Write 0 through the first array down `a`'s .base chain that takes it (raise when none does)."""
    base = a.base
    while base is not None:
        try:
            np.asarray(base).reshape(-1)[:1] = 0
            return
        except (TypeError, ValueError):
            base = getattr(base, "base", None)
    raise ValueError("no array down the chain takes a write")


def _engine_or_raise(obj):
    if type(obj).__name__ in ("Simulator", "DecodeInstance", "PrefillInstance"):
        return obj  # reached: the tamper worked
    raise AttributeError(f"{type(obj).__name__}: not the engine")


class _TamperRouter(LeastLoadedAdmission):
    """LeastLoadedAdmission, after trying every tamper once (on its first route with a pool)."""

    name = "tamper"

    def __init__(self):
        self.worked: list[str] = []
        self.tried = 0

    def route(self, sim, inst):
        if not self.tried:
            for name, thunk in _tampers(sim).items():
                self.tried += 1
                try:
                    thunk()
                except Exception:  # noqa: BLE001  (refused: what every tamper must be)
                    continue
                self.worked.append(name)
            sim.cfg.cluster.decode.batch_limit = 1  # the view's own copy of the config: changes nothing
        super().route(sim, inst)


class _Spy(RoundRobinDispatch):
    """A prefill scheduler that keeps the view it is handed (to compare with the router's)."""

    def reset(self, sim):
        super().reset(sim)
        self.view = sim


def test_issue_44s_tampers_are_refused_and_change_nothing():
    scen, overrides, _ = ENGINES["decode_tier"]
    cfg = load_scenario(scen, overrides).sim
    clean = simulate(cfg, {"decode": LeastLoadedAdmission()}, seed=0)
    router, spy = _TamperRouter(), _Spy()
    sim = Simulator(cfg, {"decode": router, "prefill": spy}, seed=0)
    assert sim.run()
    assert router.tried > 120 and not router.worked, "tampers that worked:\n" + "\n".join(router.worked)
    got = SimResult(sim)  # every request's history and every pass: the clean run's
    assert got.requests.equals(clean.requests) and got.steps.equals(clean.steps)
    # each policy is handed a view of its own (its own config copy: the router's write above stayed in its own);
    # what the views share (facades, the request view) refused every write above
    views = {id(v) for v in sim.views.values()} | {id(sim.view)}
    assert len(views) == len(sim.views) + 1 and spy.view is sim.views["prefill"]
    assert sim.views["decode"].cfg.cluster.decode.batch_limit == 1 != spy.view.cfg.cluster.decode.batch_limit


class _GcTamper(LeastLoadedAdmission):
    """What a view cannot refuse: the engine found through gc, a request's prompt rewritten."""

    name = "gc_tamper"

    def route(self, sim, inst):
        engine = next(o for o in gc.get_objects() if type(o).__name__ == "Simulator" and o.views["decode"] is sim)
        engine.req.prompt[max(sim.pool)] += 1000  # a longer prompt: more KV, later finish
        super().route(sim, inst)


def test_the_tamper_check_stops_what_the_view_cannot_refuse_and_changes_nothing_else():
    scen, overrides, _ = ENGINES["decode_tier"]
    plain = load_scenario(scen, overrides).sim
    checked = load_scenario(scen, [*overrides, "check_policies=true"]).sim
    clean = simulate(plain, None, seed=0)
    assert simulate(plain, {"decode": _GcTamper()}, seed=0).requests.prompt.sum() > clean.requests.prompt.sum()
    with pytest.raises(PolicyError, match=r"^policy\.decode: _GcTamper\.route changed the engine's state outside its "
                       r"actions \(req\.prompt changed before admit\(\); check_policies: true\)$"):
        simulate(checked, {"decode": _GcTamper()}, seed=0)
    same = simulate(checked, None, seed=0)  # the check watches, it does not act
    assert same.requests.equals(clean.requests) and same.steps.equals(clean.steps)
