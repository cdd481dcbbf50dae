"""Issue 13 item 4: is a compiled core worth it? A numba prototype of the decode tier's hot loop, measured
against the tuned Python engine on the same work, with the same decisions.

The prototype is the chain that dominates the engine's profile (decode step end -> finishes -> least-KV
admissions from the pool -> roofline step time -> next step), for one decode instance with lock-step
DP workers behind a barrier: step clock, finish times, pool in arrival order, least-KV routing (first
worker on ties, requests larger than one that fit nowhere passed over), the roofline decode pass time
from the engine's own coefficients (envs/sim/cost.RooflineCost). It replays the decode tier of a Python
run: requests enter the pool at the times and in the order the Python run's KV_READY events put them
there, so both see identical traffic, and the check is that every request finishes at the same time.

Figures: the Python engine's whole run and the seconds it spends in the decode chain (cProfile of the
two decode transitions), the prototype's seconds compiled (after its one-off JIT compile, which is also
reported) and as plain Python (the same code uncompiled), and the speed-ups. The chain's share comes
from a profiled run (cProfile inflates call-heavy code, so read it as approximate). Needs numba,
pdgym's optional `compiled` extra (`pip install 'pdgym[compiled]'`, installed by make; engine=numba uses it);
without it the module reports nothing.
The decision drawn from these figures is in docs/performance.md ("Compiled core").
"""

from __future__ import annotations

import cProfile
import math
import pstats
import time

import numpy as np

N_REQUESTS = 20_000
SCENARIO = ["scenario=decode_tier_n16", f"workload.num_requests={N_REQUESTS}"]


def decode_tier_loop(pool_t, prompt, output, dp, batch_limit, kv_cap, c_tok, m_tok, c_dk, m_dk, m_w, shared,
                     moe_local, exp_c, exp_read, exp_rate, comm, overhead, c_head, m_head):
    """Finish time of every request (NaN if never admitted) and the number of steps; see the module doc.

    pool_t: pool entry times in pool order. Plain loops over scalars: numba compiles them; run as Python
    they are the same code uncompiled."""
    n = pool_t.shape[0]
    finish = np.full(n, np.nan)
    batch = np.zeros(dp, np.int64)
    kv = np.zeros(dp, np.int64)
    worker = np.full(n, -1, np.int64)
    fin_step = np.zeros(n, np.int64)
    admitted = np.zeros(n, np.bool_)
    # running requests per worker, as an array of ids with a count (removal: swap with the last)
    slots = np.full((dp, batch_limit), -1, np.int64)
    head = 0  # first pool entry not yet admitted (everything before it is)
    arrived = 0  # pool entries with pool_t <= now
    steps = 0
    now = 0.0
    running = 0
    done_count = 0
    while done_count < n:
        while arrived < n and pool_t[arrived] <= now:
            arrived += 1
        if running == 0 and head >= arrived:
            if arrived >= n:
                break
            now = pool_t[arrived]  # idle: the next KV transfer wakes the instance
            continue
        # ---- admissions: least KV among workers with a free slot, pool in arrival order
        too_big = -1
        i = head
        while i < arrived:
            if admitted[i]:
                if i == head:
                    head += 1
                i += 1
                continue
            load = prompt[i] + 1  # the prefill produced the first token
            if too_big >= 0 and load >= too_big:
                i += 1
                continue
            best = -1
            best_kv = 0
            any_slot = False
            for w in range(dp):
                if batch[w] < batch_limit:
                    any_slot = True
                    if kv[w] + load <= kv_cap and (best < 0 or kv[w] < best_kv):
                        best = w
                        best_kv = kv[w]
            if not any_slot:
                break
            if best < 0:
                too_big = load
                i += 1
                continue
            slots[best, batch[best]] = i
            batch[best] += 1
            kv[best] += load
            worker[i] = best
            fin_step[i] = steps + output[i] - 1
            admitted[i] = True
            running += 1
            if i == head:
                head += 1
            i += 1
        if running == 0:
            now = pool_t[arrived] if arrived < n else now
            if arrived >= n:
                break
            continue
        # ---- roofline decode step time (RooflineCost.pass_time with no prefill work)
        n_d = 0.0
        for w in range(dp):
            n_d += batch[w]
        mean = n_d / dp
        mx = 0.0
        tmax = 0.0
        for w in range(dp):
            tok = float(batch[w])
            c = tok * c_tok + kv[w] * c_dk
            m = tok * m_tok + kv[w] * m_dk
            if tok > 0:
                m += m_w
            c += tok * c_head  # the LM head on every decode token (0.0 for a model without one)
            if tok > 0:
                m += m_head
            if shared:
                c += mean * exp_c
                m += exp_read * -math.expm1(-mean * exp_rate)
            elif moe_local:
                m -= exp_read * math.expm1(tok * -exp_rate)
            u = max(c, m)
            if u > mx:
                mx = u
            if tok > tmax:
                tmax = tok
        now = now + (overhead + mx + tmax * comm)
        steps += 1
        # ---- step end: one token each, due requests finish
        for w in range(dp):
            kv[w] += batch[w]
            j = 0
            while j < batch[w]:
                r = slots[w, j]
                if fin_step[r] == steps:
                    finish[r] = now
                    kv[w] -= prompt[r] + output[r]
                    batch[w] -= 1
                    slots[w, j] = slots[w, batch[w]]
                    running -= 1
                    done_count += 1
                else:
                    j += 1
    return finish, steps


def python_run():
    """The Python engine on the scenario: (a simulator that noted its pool entries, whole-run seconds of an
    unobserved run, the decode chain's share of a profiled run)."""
    from pdgym.agents.common import policy_spec, sim_config_from
    from pdgym.agents.compose import compose_checked
    from pdgym.baselines import make_policies
    from pdgym.envs.sim import Simulator
    from pdgym.envs.sim.events import EventKind

    cfg = compose_checked("bench", "config", SCENARIO)
    sim_cfg, spec = sim_config_from(cfg), policy_spec(cfg)
    sim = Simulator(sim_cfg, make_policies(spec), seed=0)
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0
    # the same run again, noting the order requests enter the decode pool (ties in time keep heap order)
    sim = Simulator(sim_cfg, make_policies(spec), seed=0)
    sim.pool_order, sim.pool_times = [], []
    kv_ready = sim._handlers[EventKind.KV_READY]

    def noting(rid):
        sim.pool_order.append(rid)
        sim.pool_times.append(sim.now)
        kv_ready(rid)

    sim._handlers[EventKind.KV_READY] = noting
    sim.run()
    prof = Simulator(sim_cfg, make_policies(spec), seed=0)
    pr = cProfile.Profile()
    pr.enable()
    prof.run()
    pr.disable()
    st = pstats.Stats(pr)
    total = next(cum for (path, _, fn), (_, _, _, cum, _) in st.stats.items()
                 if fn == "run" and path.endswith("engine.py"))
    chain = _chain_seconds(st)
    return sim, wall, chain / total if total else math.nan


def _chain_seconds(st: pstats.Stats) -> float:
    """Cumulative seconds of DecodeInstance.end_step plus start_step when called from the event loop."""
    out = 0.0
    for (path, _, fn), (_, _, _, cum, callers) in st.stats.items():
        if not path.endswith("decode.py"):
            continue
        if fn == "end_step":
            out += cum
        elif fn == "start_step":
            for (cpath, _, _), (_, _, _, ccum) in callers.items():
                if cpath.endswith("engine.py"):
                    out += ccum
    return out


def prototype_inputs(sim) -> tuple:
    """Pool entry times and lengths from the Python run, and the decode instance's cost coefficients."""
    req = sim.req
    d = sim.decode[0]
    order = np.array(sim.pool_order, dtype=np.int64)
    pool_t = np.array(sim.pool_times)
    c = d.cost
    args = (pool_t, req.prompt[order].astype(np.int64), req.output[order].astype(np.int64), d.dp,
            d.batch_limit, int(d.kv_cap[0]), float(c._c_tok[0]), float(c._m_tok[0]), float(c._c_dk[0]),
            float(c._m_dk[0]), float(c._m_w[0]), bool(c._shared), bool(c._moe_local), float(c._exp_c),
            float(c._exp_read), float(c._exp_rate), float(c._comm), float(c._overhead),
            float(c._c_head[0]) if c._head else 0.0, float(c._m_head[0]) if c._head else 0.0)
    return args, order


def run() -> dict:
    try:
        import numba
    except ImportError:
        print("bench_compiled: numba is not installed (pip install numba); nothing measured")
        return {}
    sim, py_wall, chain_frac = python_run()
    assert int(sim.req.preemptions.sum()) == 0, "the prototype models no preemption"
    args, order = prototype_inputs(sim)
    kernel = numba.njit(cache=False)(decode_tier_loop)
    t0 = time.perf_counter()
    kernel(*args)
    jit_s = time.perf_counter() - t0  # compile + one run
    t0 = time.perf_counter()
    fin, steps = kernel(*args)
    nb_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fin_py, _ = decode_tier_loop(*args)
    pyf_s = time.perf_counter() - t0
    want = sim.req.finish[order]
    same = bool(np.allclose(fin, want, rtol=1e-9, atol=1e-9, equal_nan=True)) and bool(
        np.allclose(fin_py, fin, rtol=0, atol=0, equal_nan=True))
    if not same:
        raise AssertionError(f"prototype differs from the engine: max |dt| {np.nanmax(np.abs(fin - want)):.3g} s")
    chain_s = py_wall * chain_frac
    return {"python_engine_s": py_wall, "python_decode_chain_s": chain_s, "python_decode_chain_frac": chain_frac,
            "numba_decode_chain_s": nb_s, "numba_jit_compile_s": jit_s - nb_s, "plain_python_prototype_s": pyf_s,
            "speedup_numba_vs_engine_chain": chain_s / nb_s, "speedup_numba_vs_same_code": pyf_s / nb_s,
            "decode_steps": steps, "requests": N_REQUESTS}
