"""The simulator's engines: `engine=python` (the reference) and `engine=numba` (compiled kernels, kernels.py).

Both give the same results bit for bit (the golden digests run on both). `kernels(engine)` is asked once per
cost model: None means the Python path. numba is imported and its kernels compiled (or loaded from numba's
on-disk cache, `cache=True`) on the first run that asks for them, never at `import pdgym`; a machine without
numba, or where a kernel fails to compile, runs the Python path after one warning line naming why.
What is compiled so far: the roofline cost model's decode-only and prefill-only pass times, the NumPy of a
decode step's start (the inner loops of the disaggregated tiers), and, of a decode step's end -> start (issue 46),
the step's finishes (`decode_finishes`) and the engine's default least-KV round (`least_kv_route`).
"""

from __future__ import annotations

import functools
import time
import warnings
from types import SimpleNamespace

from .notices import EngineWarning
from .validation import ENGINES, check_choice

compile_seconds: dict[str, float] = {}  # engine -> seconds its kernels took to compile or load, first use


def check_engine(engine) -> str:
    check_choice(engine, "engine", ENGINES)
    return engine


@functools.cache
def kernels(engine: str) -> SimpleNamespace | None:
    """The compiled kernels of `engine`, or None (the Python path): for "python", or after a warning when
    they cannot be built here."""
    if check_engine(engine) == "python":
        return None
    t0 = time.perf_counter()
    try:
        import numpy as np

        from . import kernels as K

        coef = np.zeros(len(K.COEF))
        one = np.ones(2, dtype=np.int64)
        K.roofline_decode(one, one, coef)  # compile (or load from numba's cache) now, not inside a run
        K.decode_start(one, one, one, coef)
        K.roofline_prefill(np.ones(2), np.ones(2), np.ones(2), coef)
        i64, i32, none = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int32), np.zeros(0, dtype=np.int64)
        K.least_kv_round(none, i64, i64, i64, np.zeros(2, dtype=np.int8), np.zeros(2), i64, i64, i64, i32, i32,
                         i64.copy(), i64.copy(), i64, 1, -1, 0.0, 0, 0, 0, none, none, none)
        K.decode_finishes(none, 1, 0, i32, i32, np.zeros(2, dtype=np.int8), i64, i64, np.zeros(2), np.zeros(2), i64,
                          i64, i64, np.zeros(2), np.zeros(2), i64.copy(), i64.copy(), 0, none, none)
    except Exception as e:  # noqa: BLE001 (numba missing or a compile failure: the Python path, said once)
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        warnings.warn(f"engine=numba unavailable ({why}); running engine=python", EngineWarning, stacklevel=2)
        return None
    compile_seconds[engine] = time.perf_counter() - t0
    return SimpleNamespace(roofline_decode=K.roofline_decode, decode_start=K.decode_start,
                           roofline_prefill=K.roofline_prefill, least_kv_round=K.least_kv_round, decode_finishes=K.decode_finishes,
                           coef_names=K.COEF)


def _twin(cost, engine: str):
    """(kernels module, coefficients, comm, overhead) of `cost`'s compiled twin, or None (the Python path: another
    engine, or a cost model without a twin)."""
    k = kernels(engine)
    spec = getattr(cost, "decode_coef", None)
    got = spec() if k is not None and spec is not None else None
    return None if got is None else (k, *got)


def decode_time(cost, engine: str):
    """`cost`'s decode-only pass_time(0, 0, reqs, kv) as a compiled function of (reqs, kv) that sets the same
    last_unit / last_idle_frac, or None (the Python path: another engine, or a cost model without a twin).
    With a third argument kv_cap it is a decode step's start (kernels.decode_start): (KV would overflow,
    seconds, KV max, KV min)."""
    got = _twin(cost, engine)
    if got is None:
        return None
    import numpy as np

    k, coef, comm, overhead = got
    kernel, start, dp, ones = k.roofline_decode, k.decode_start, cost.dp, np.ones(cost.dp)

    def decode_pass(reqs, kv, kv_cap=None):
        if kv_cap is None:
            unit, mx, tokmax = kernel(reqs, kv, coef)
        else:
            over, unit, mx, tokmax, kv_max, kv_min = start(reqs, kv, kv_cap, coef)
        cost.last_unit = unit
        cost.last_idle_frac = 1.0 - float(unit.dot(ones)) / (mx * dp) if mx > 0 else 0.0  # NumPy's sum, as _barrier
        dur = overhead + mx + (tokmax * comm if comm else 0.0)
        return dur if kv_cap is None else (over, dur, int(kv_max), int(kv_min))

    return decode_pass


def prefill_time(cost, engine: str):
    """`cost`'s prefill-only pass_time(tokens, attn, 0, 0, ends) compiled (float vectors; same value, same last_unit /
    last_idle_frac), or None (the Python path)."""
    got = _twin(cost, engine)
    if got is None:
        return None
    import numpy as np

    k, coef, comm, overhead = got
    kernel, dp, ones = k.roofline_prefill, cost.dp, np.ones(cost.dp)

    zeros = np.zeros(dp)

    def prefill_pass(tokens, attn, ends=None) -> float:  # ends: prompts ending per unit (LM head), None: none
        unit, mx, tokmax = kernel(tokens, attn, zeros if ends is None else ends, coef)
        cost.last_unit = unit
        cost.last_idle_frac = 1.0 - float(unit.dot(ones)) / (mx * dp) if mx > 0 else 0.0  # NumPy's sum, as _barrier
        return overhead + mx + (tokmax * comm if comm else 0.0)

    return prefill_pass


def least_kv_route(engine: str):
    """The engine's default decode round (policy.LeastLoadedAdmission.route) compiled, as `route(d) -> bool` for a
    decode instance `d` at its step start, or None (the Python path). `route` returns False, having changed
    nothing, when the run's decode router is not that class or the workers' KV capacities differ: the caller
    asks the router then. Same admissions, in the same order, as the router's own round: the pool read in the same
    growing chunks (policy.pool_in_order), the request table written by the kernel, then per admission the pool,
    the worker's active set and the finish bucket in Python, as Simulator.admit does them."""
    k = kernels(engine)
    if k is None:
        return None
    from itertools import islice

    import numpy as np

    from . import requests as R
    from .policy import LeastLoadedAdmission

    kernel, decode_code = k.least_kv_round, R.DECODE

    def route(d) -> bool:
        sim = d.sim
        if type(sim.policies["decode"]) is not LeastLoadedAdmission:
            return False
        req, pool, active, buckets = sim.req, sim.pool, d.active, d.buckets
        start, chunk, too_big = 0, 16, -1
        while True:
            ids = list(islice(pool, start, start + chunk))
            if not ids:
                return True
            taken, taken_w, taken_fs = (np.empty(len(ids), dtype=np.int64) for _ in range(3))
            n, too_big, full = kernel(np.array(ids, dtype=np.int64), req.prompt, req.done, req.output, req.state,
                                      req.decode_admit, req.admit_step, req.done_at_admit, req.finish_step,
                                      req.decode_inst, req.worker, d.batch, d.kv, d.kv_cap, d.batch_limit, too_big,
                                      sim.now, d.steps, d.idx, decode_code, taken, taken_w, taken_fs)
            if n < 0:
                return False
            for rid, w, fs in zip(taken[:n].tolist(), taken_w[:n].tolist(), taken_fs[:n].tolist()):
                del pool[rid]
                active[w].add(rid)
                buckets.setdefault(fs, []).append(rid)
            d.n_batch += n
            if full:
                return True
            start += len(ids) - n
            chunk *= 2

    return route


def decode_finishes(engine: str):
    """A decode step's finishes compiled, as `finishes(d, s) -> [(rid, worker), ...]` for decode instance `d` whose
    step `s` just ended (its clock ticked, KV grown): the requests that finish, in bucket order, their last segment
    and the batches and KV settled (kernels.decode_finishes); the caller then removes each from its worker's active
    set and calls Simulator.finish_request, in that order. None: the Python path. Taken only by a run without
    observers (an observer's on_finish reads the run between two finishes; in bulk it would see them all settled)."""
    k = kernels(engine)
    if k is None:
        return None
    import numpy as np

    from . import requests as R

    kernel, decode_code = k.decode_finishes, R.DECODE

    def finishes(d, s: int) -> list:
        bucket = d.buckets.pop(s, None)
        if not bucket:
            return []
        req = d.sim.req
        rids, ws = np.empty(len(bucket), dtype=np.int64), np.empty(len(bucket), dtype=np.int64)
        n = kernel(np.array(bucket, dtype=np.int64), s, d.idx, req.decode_inst, req.worker, req.state, req.finish_step,
                   req.admit_step, req.last_tok, req.itl_max, req.done, req.output, req.prompt, d.step_t.data,
                   d.gap.data, d.batch, d.kv, decode_code, rids, ws)
        d.n_batch -= n
        return list(zip(rids[:n].tolist(), ws[:n].tolist()))

    return finishes
