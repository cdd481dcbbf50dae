"""engine=numba (issue 36 item 1): compiled kernels with the Python path's results, a one-line refusal of an
unknown engine, and a one-line fallback where numba cannot be used. The golden digests run on both engines
(tests/test_golden.py); here each kernel is compared with its Python twin bit for bit on random inputs."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from pdgym.envs.sim import ConfigError, Simulator, compiled
from pdgym.envs.sim.config import InstanceConfig, sim_config
from pdgym.envs.sim.cost import RooflineCost, build_cost_model
from pdgym.envs.sim.hardware import load_hardware
from pdgym.envs.sim.models import load_model
from pdgym.envs.sim.notices import EngineWarning

SMALL = {"hardware": "h800", "model": "deepseek_v3",
         "cluster": {"topology": "disaggregated", "prefill": {"count": 1, "dp": 8, "tp": 2, "ep": 16},
                     "decode": {"count": 2, "dp": 16, "ep": 16, "batch_limit": 32}},
         "workload": {"num_requests": 150, "arrival": "poisson", "rate": 20.0}}


def test_unknown_engine_is_one_line():
    with pytest.raises(ConfigError) as e:
        sim_config({**SMALL, "engine": "bogus"})
    assert str(e.value) == "engine: got 'bogus'; allowed: python, numba"


def test_python_engine_binds_no_kernel():
    sim = Simulator(SMALL, None, seed=0)
    assert all(d.cost.decode_kernel is None for d in sim.decode)


@pytest.mark.parametrize(("hw", "model", "shape"), [
    ("h800", "deepseek_v3", {"dp": 32, "ep": 32}),  # experts shared over the EP group (the bench's decode tier)
    ("h800", "deepseek_v3", {"dp": 4, "ep": 16, "tp": 2}),  # with TP and its all-reduce
    ("a100_80g", "llama3_1_8b", {"dp": 4}),  # dense
    ("h200", "qwen3_8b", {"dp": 3, "tp": 2}),  # dense, GQA KV sharded by TP
])
def test_decode_kernel_is_pass_times_twin(hw, model, shape):
    pytest.importorskip("numba")
    inst = InstanceConfig(**shape, batch_limit=256)
    cost_cfg = sim_config({}).cost
    py = build_cost_model(cost_cfg, load_hardware(hw), load_model(model), inst)
    nb = build_cost_model(cost_cfg, load_hardware(hw), load_model(model), inst, "numba")
    assert py.decode_kernel is None and nb.decode_kernel is not None and nb.prefill_kernel is not None
    rng = np.random.default_rng(0)
    dp, z = inst.dp, np.zeros(inst.dp)
    for trial in range(400):
        batch = rng.integers(0, 257, dp)
        if trial % 7 == 0:
            batch[rng.random(dp) < 0.5] = 0  # idle units; and all idle below
        if trial % 50 == 0:
            batch[:] = 0
        kv = batch * rng.integers(1, 9000, dp)
        want = py.pass_time(z, z, batch, kv)
        got = nb.decode_kernel(batch, kv)
        assert got == want  # bit for bit, not approximately
        assert nb.last_idle_frac == py.last_idle_frac
        assert np.array_equal(nb.last_unit, py.last_unit)
        cap = kv + batch + rng.integers(-3, 4, dp)  # some workers would overflow this step
        assert nb.decode_kernel(batch, kv, cap) == ((kv + batch > cap).any(), want, int(kv.max()), int(kv.min()))
        tokens = np.where(batch > 128, 0, rng.integers(1, 8193, dp)).astype(float)  # a prefill pass, some units idle
        attn = tokens * (rng.integers(0, 60000, dp) + tokens / 2)
        assert nb.prefill_kernel(tokens, attn) == py.pass_time(tokens, attn, z, z)
        assert nb.last_idle_frac == py.last_idle_frac and np.array_equal(nb.last_unit, py.last_unit)
        ends = np.where(tokens > 0, rng.integers(0, 3, dp), 0).astype(float)  # prompts ending here: their LM head
        assert nb.prefill_kernel(tokens, attn, ends) == py.pass_time(tokens, attn, z, z, ends)
        assert nb.last_idle_frac == py.last_idle_frac and np.array_equal(nb.last_unit, py.last_unit)


def test_moe_held_per_unit_keeps_the_python_path():
    """Experts held on every unit (ep <= tp) use a vector expm1 in pass_time: no twin, so no kernel."""
    pytest.importorskip("numba")
    cost = RooflineCost(load_hardware("h800"), load_model("deepseek_v3"), InstanceConfig(dp=2, tp=8, ep=8))
    assert cost.decode_coef() is None
    assert compiled.decode_time(cost, "numba") is None and compiled.prefill_time(cost, "numba") is None


def test_runs_equal_on_both_engines():
    pytest.importorskip("numba")
    a = Simulator(SMALL, None, seed=2)
    a.run()
    b = Simulator({**SMALL, "engine": "numba"}, None, seed=2)
    assert all(d.cost.decode_kernel is not None for d in b.decode)
    assert all(p.cost.prefill_kernel is not None for p in b.prefill)
    b.run()
    assert a.n_events == b.n_events
    assert np.array_equal(a.req.finish, b.req.finish, equal_nan=True)
    assert a.steps.frame().equals(b.steps.frame())
    assert compiled.compile_seconds["numba"] >= 0


def test_without_numba_one_warning_and_the_python_path():
    """numba not importable: the run warns once, in one line naming why, and gives the Python path's results."""
    code = (
        "import sys, warnings; sys.modules['numba'] = None\n"
        "from pdgym.envs.sim import Simulator\n"
        f"cfg = {SMALL!r}\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    s = Simulator({**cfg, 'engine': 'numba'}, None, seed=1); s.run()\n"
        "    Simulator({**cfg, 'engine': 'numba'}, None, seed=1)\n"
        "p = Simulator(cfg, None, seed=1); p.run()\n"
        "print(len(w)); print(w[0].category.__name__); print(str(w[0].message))\n"
        "print(all(d.cost.decode_kernel is None for d in s.decode), (s.req.finish == p.req.finish).all())\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.splitlines()
    assert out[0] == "1" and out[1] == "EngineWarning"
    assert out[2].startswith("engine=numba unavailable (ModuleNotFoundError: ") and out[2].endswith("running engine=python")
    assert "\n" not in out[2] and out[3] == "True True"


def test_warning_category_prints_one_line():
    with warnings.catch_warnings(record=True):
        text = warnings.formatwarning("engine=numba unavailable (x); running engine=python", EngineWarning, "f", 1)
    assert text == "pdgym: EngineWarning: engine=numba unavailable (x); running engine=python\n"


# A decode tier that overloads: a pool of hundreds (the round reads it in growing chunks), KV tight enough that
# requests fit nowhere (the round's too-big skip) and running ones are preempted.
TIGHT = {**SMALL, "cluster": {**SMALL["cluster"], "decode": {"count": 2, "dp": 8, "ep": 8, "batch_limit": 16,
                                                             "kv_capacity_tokens": 8000}},
         "workload": {"num_requests": 600, "arrival": "poisson", "rate": 400.0,
                      "prompt": {"dist": "uniform", "low": 200, "high": 3000},
                      "output": {"dist": "geometric", "mean": 150, "max": 1500}}}


def _same_runs(a: Simulator, b: Simulator) -> None:
    assert a.n_events == b.n_events
    for col in ("finish", "first_token", "decode_admit", "itl_max", "last_tok"):
        assert np.array_equal(getattr(a.req, col), getattr(b.req, col), equal_nan=True), col
    for col in ("worker", "decode_inst", "preemptions", "state", "reason", "done"):
        assert np.array_equal(getattr(a.req, col), getattr(b.req, col)), col
    assert a.steps.frame().equals(b.steps.frame())


def _counted(sim: Simulator) -> list[int]:
    """Wrap the decode instances' compiled round: [rounds it ran, rounds it handed to the router, largest pool]."""
    calls = [0, 0, 0]
    inner = sim.decode[0].cost.route_kernel

    def route(d) -> bool:
        calls[2] = max(calls[2], len(d.sim.pool))
        done = inner(d)
        calls[0 if done else 1] += 1
        return done

    for d in sim.decode:
        d.cost.route_kernel = route
    return calls


@pytest.mark.parametrize("cfg", [SMALL, TIGHT], ids=["small", "overloaded"])
def test_the_compiled_least_kv_round_admits_as_the_router(cfg):
    """Issue 46: under engine=numba the engine's least-KV round and a decode step's finishes run compiled
    (policy.LeastLoadedAdmission.route's and DecodeInstance.end_step's twins): every admission, preemption, finish
    and inter-token gap the same, request for request."""
    pytest.importorskip("numba")
    a, b = Simulator(cfg, None, seed=4), Simulator({**cfg, "engine": "numba"}, None, seed=4)
    calls = _counted(b)
    a.run()
    b.run()
    _same_runs(a, b)
    assert calls[0] > 50 and calls[1] == 0
    if cfg is TIGHT:  # the regime the test is for: preemptions happened, and pools too large for one chunk
        assert a.req.preemptions.sum() > 0 and calls[2] > 64


def test_a_router_of_its_own_and_unequal_capacities_are_asked_not_compiled():
    """A subclass of the engine's router is the user's own policy (asked, even with the same decisions), and workers
    of unequal KV capacity take the router's sorted path: the compiled round hands both back, changing nothing."""
    pytest.importorskip("numba")
    from pdgym.envs.sim.policy import LeastLoadedAdmission

    class Mine(LeastLoadedAdmission):
        asked = 0

        def route(self, sim, inst):
            Mine.asked += 1
            super().route(sim, inst)

    a, b = Simulator(SMALL, {"decode": Mine()}, seed=1), Simulator({**SMALL, "engine": "numba"}, {"decode": Mine()}, seed=1)
    calls = _counted(b)
    a.run()
    asked = Mine.asked
    b.run()
    _same_runs(a, b)
    assert calls[0] == 0 and calls[1] > 0 and Mine.asked == 2 * asked > 0
    a, b = Simulator(TIGHT, None, seed=2), Simulator({**TIGHT, "engine": "numba"}, None, seed=2)
    for sim in (a, b):
        sim.decode[1].kv_cap[3] = 9000  # one worker of the second instance holds less
    calls = _counted(b)
    a.run()
    b.run()
    _same_runs(a, b)
    assert calls[0] > 0 and calls[1] > 0


def test_a_run_with_an_observer_finishes_through_the_python_loop():
    """An observer's on_finish reads the run between two finishes: with one attached, the step's finishes stay the
    Python loop (the compiled one settles a step's finishes together), and the run is the same."""
    pytest.importorskip("numba")
    from pdgym.envs.sim.observers import Observer

    class Seen(Observer):
        def __init__(self):
            self.batches = []

        def on_finish(self, sim, rid):
            d = sim.decode[int(sim.req.decode_inst[rid])]
            self.batches.append(int(d.batch.sum()))

    a, b = Simulator(TIGHT, None, seed=3), Simulator({**TIGHT, "engine": "numba"}, None, seed=3)
    seen = []
    for sim in (a, b):
        seen.append(Seen())
        sim.observe(seen[-1])
    a.run()
    b.run()
    _same_runs(a, b)
    assert seen[0].batches == seen[1].batches and len(seen[0].batches) == 600
