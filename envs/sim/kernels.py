"""The compiled kernels of `engine=numba` (numba, cached on disk): imported only by compiled.py, when a run
asks for that engine, so `import pdgym` never imports numba or compiles anything.

Each kernel repeats its Python twin's floating-point operations in the same order, so both engines give the
same bits (tests/test_compiled.py compares them on random inputs; the golden digests run on both engines).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# RooflineCost coefficients, in the order `roofline_decode` reads them from its `coef` vector
COEF = ("c_tok", "m_tok", "c_dk", "m_dk", "m_w", "exp_c", "exp_read", "exp_rate", "shared", "c_pa", "m_pa", "c_head",
        "m_head")


@njit(inline="always", cache=True, nogil=True)
def _roofline(tok, attn, ends, c_att, m_att, coef):  # pragma: no cover (compiled; inlined into the kernels below)
    """The roofline pass both kernels share, one unit at a time, in pass_time's order: c = tok c_tok (+ attn
    c_att), m = tok m_tok (+ attn m_att) + sign(tok) m_w, + the LM head of the prompts ending on the unit (c +=
    ends c_head, m += sign(ends) m_head; 0 for a model without one: adding 0.0 is exact), (+ the shared expert
    terms), unit = max(c, m). The token count sums integers (as floats): exact in any order. Returns the
    per-unit seconds, their max and the largest token count (float)."""
    c_tok, m_tok, m_w = coef[0], coef[1], coef[4]
    c_head, m_head = coef[11], coef[12]
    exp_c, exp_read, exp_rate, shared = coef[5], coef[6], coef[7], coef[8] != 0.0
    dp = tok.shape[0]
    n = 0.0
    tokmax = tok[0]
    for i in range(dp):
        n += float(tok[i])
        if tok[i] > tokmax:
            tokmax = tok[i]
    sc = 0.0
    sm = 0.0
    if shared:
        mean = n / dp
        sc = mean * exp_c
        sm = exp_read * -math.expm1(-mean * exp_rate)
    unit = np.empty(dp)
    mx = -math.inf
    for i in range(dp):
        t = float(tok[i])
        c = t * c_tok
        m = t * m_tok
        if n > 0.0:
            a = float(attn[i])
            c = c + a * c_att
            m = m + a * m_att
        m = m + (1.0 if t > 0.0 else 0.0) * m_w
        if n > 0.0:
            e = float(ends[i])
            c = c + e * c_head
            m = m + (1.0 if e > 0.0 else 0.0) * m_head
        if shared:
            c = c + sc
            m = m + sm
        u = c if c >= m else m
        unit[i] = u
        if u > mx:
            mx = u
    return unit, mx, float(tokmax)


@njit(cache=True, nogil=True)
def roofline_decode(reqs, kv, coef):  # pragma: no cover (compiled; its Python twin is RooflineCost.pass_time)
    """A decode-only pass of RooflineCost (expert work shared over the EP group, or no MoE): _roofline with
    tok = reqs, attention = the KV read (c_dk, m_dk), and every request's LM head (ends = reqs)."""
    return _roofline(reqs, kv, reqs, coef[2], coef[3], coef)


@njit(cache=True, nogil=True)
def decode_start(batch, kv, kv_cap, coef):  # pragma: no cover (compiled; twin: DecodeInstance.start_step's NumPy)
    """A decode step's start in one call: whether a worker's KV would overflow this step (kv + batch > kv_cap),
    the KV extremes the step table records, and the pass (roofline_decode) -- what start_step computes with
    six NumPy calls."""
    over = False
    kv_max = kv[0]
    kv_min = kv[0]
    for i in range(kv.shape[0]):
        if kv[i] + batch[i] > kv_cap[i]:
            over = True
        if kv[i] > kv_max:
            kv_max = kv[i]
        if kv[i] < kv_min:
            kv_min = kv[i]
    unit, mx, tokmax = _roofline(batch, kv, batch, coef[2], coef[3], coef)
    return over, unit, mx, tokmax, kv_max, kv_min


@njit(cache=True, nogil=True)
def roofline_prefill(tokens, attn, ends, coef):  # pragma: no cover (compiled; twin: RooflineCost.pass_time)
    """A prefill-only pass of RooflineCost (no decode on any unit): _roofline with the prompt attention (c_pa,
    m_pa) and the LM head of the prompts ending here."""
    return _roofline(tokens, attn, ends, coef[9], coef[10], coef)


@njit(cache=True, nogil=True)
def least_kv_round(ids, prompt, done, output, state, decode_admit, admit_step, done_at_admit, finish_step,
                   decode_inst, worker, batch, kv, kv_cap, limit, too_big, now, steps, idx, decode_code,
                   taken, taken_w, taken_fs):  # pragma: no cover (compiled; twin: policy.LeastLoadedAdmission.route)
    """The engine's least-KV round over the pool ids `ids` (a chunk, in pool order), one KV capacity: each request,
    unless at least as large as one that fit nowhere this round (`too_big`, -1: none yet), goes to the worker of
    least KV among those with a free slot (lowest index on ties: the heap top of (kv, worker) tuples), if its load
    (prompt + done) fits there; else it sets `too_big`. An admission does what Simulator.admit ->
    DecodeInstance.admit -> RequestTable.admit_decode write into the arrays (batch, kv, decode_inst, worker, state,
    decode_admit, admit_step, done_at_admit, finish_step), and lists (rid, worker, finish step) in `taken*` for the
    Python side (pool, active sets, finish buckets, in this order). Integers only, so the same values as the twin.
    Returns (admitted, too_big, every worker full); admitted -1 (nothing changed) when the workers' capacities differ
    (the twin's sorted-list path, left to Python)."""
    dp = batch.shape[0]
    cap = kv_cap[0]
    free = 0
    for w in range(dp):
        if kv_cap[w] != cap:
            return -1, too_big, False
        if batch[w] < limit:
            free += 1
    n = 0
    if free == 0:
        return n, too_big, True
    for i in range(ids.shape[0]):
        rid = ids[i]
        load = prompt[rid] + done[rid]
        if too_big >= 0 and load >= too_big:
            continue
        best = -1
        for w in range(dp):
            if batch[w] < limit and (best < 0 or kv[w] < kv[best]):
                best = w
        if kv[best] + load > cap:
            too_big = load
            continue
        batch[best] += 1
        kv[best] += load
        decode_inst[rid] = idx
        worker[rid] = best
        state[rid] = decode_code
        decode_admit[rid] = now
        admit_step[rid] = steps
        done_at_admit[rid] = done[rid]
        fs = steps + (output[rid] - done[rid])
        finish_step[rid] = fs
        taken[n] = rid
        taken_w[n] = best
        taken_fs[n] = fs
        n += 1
        if batch[best] == limit:
            free -= 1
            if free == 0:
                return n, too_big, True
    return n, too_big, False


@njit(cache=True, nogil=True)
def decode_finishes(bucket, s, idx, decode_inst, worker, state, finish_step, admit_step, last_tok, itl_max, done,
                    output, prompt, step_t, gap, batch, kv, decode_code, out_rid, out_w):  # pragma: no cover (compiled)
    """A decode step's finishes (twin: DecodeInstance.end_step's loop over Stepper.due): each request of the step's
    finish bucket still due (finish step `s`, decoding) on this instance settles its last segment's longest gap
    (Stepper.segment_itl: differences and maxima, exact in any engine; Python's max keeps its first argument
    unless the second is greater, NumPy's max propagates NaN), takes its whole output and leaves its worker's
    batch and KV; (rid, worker) listed in order for the Python side (active sets, Simulator.finish_request).
    Returns how many finished."""
    n = 0
    for i in range(bucket.shape[0]):
        rid = bucket[i]
        if finish_step[rid] != s or state[rid] != decode_code or decode_inst[rid] != idx:
            continue
        w = worker[rid]
        s0 = admit_step[rid]
        if s > s0:
            g = step_t[s0] - last_tok[rid]
            if s - s0 > 1:
                m = gap[s0 + 1]
                for j in range(s0 + 2, s):
                    x = gap[j]
                    if x != x or x > m:
                        m = x
                        if x != x:
                            break
                if m > g:
                    g = m
            if g > itl_max[rid]:
                itl_max[rid] = g
            last_tok[rid] = step_t[s - 1]
        done[rid] = output[rid]
        batch[w] -= 1
        kv[w] -= prompt[rid] + output[rid]
        out_rid[n] = rid
        out_w[n] = w
        n += 1
    return n
