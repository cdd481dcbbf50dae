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


@njit(cache=True, nogil=True)
def roofline_decode(reqs, kv, coef):  # pragma: no cover (compiled; its Python twin is RooflineCost.pass_time)
    """A decode-only pass of RooflineCost (expert work shared over the EP group, or no MoE): the per-unit
    seconds, their max, and the largest batch. The operations are pass_time's for tok = reqs, one unit at a
    time: c = tok c_tok (+ kv c_dk), m = tok m_tok (+ kv m_dk) + sign(tok) m_w, + the LM head (c += tok c_head,
    m += sign(tok) m_head; 0 for a model without one: adding 0.0 is exact), (+ the shared expert terms),
    unit = max(c, m). The request count n_d sums integers: exact in any order."""
    c_tok, m_tok, c_dk, m_dk, m_w = coef[0], coef[1], coef[2], coef[3], coef[4]
    c_head, m_head = coef[11], coef[12]
    exp_c, exp_read, exp_rate, shared = coef[5], coef[6], coef[7], coef[8] != 0.0
    dp = reqs.shape[0]
    n_d = 0.0
    tokmax = reqs[0]
    for i in range(dp):
        n_d += float(reqs[i])
        if reqs[i] > tokmax:
            tokmax = reqs[i]
    sc = 0.0
    sm = 0.0
    if shared:
        mean = n_d / dp
        sc = mean * exp_c
        sm = exp_read * -math.expm1(-mean * exp_rate)
    unit = np.empty(dp)
    mx = -math.inf
    for i in range(dp):
        t = float(reqs[i])
        c = t * c_tok
        m = t * m_tok
        if n_d > 0.0:
            k = float(kv[i])
            c = c + k * c_dk
            m = m + k * m_dk
        m = m + (1.0 if t > 0.0 else 0.0) * m_w
        if n_d > 0.0:
            c = c + t * c_head
            m = m + (1.0 if t > 0.0 else 0.0) * m_head
        if shared:
            c = c + sc
            m = m + sm
        u = c if c >= m else m
        unit[i] = u
        if u > mx:
            mx = u
    return unit, mx, float(tokmax)


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
    unit, mx, tokmax = roofline_decode(batch, kv, coef)
    return over, unit, mx, tokmax, kv_max, kv_min


@njit(cache=True, nogil=True)
def roofline_prefill(tokens, attn, ends, coef):  # pragma: no cover (compiled; twin: RooflineCost.pass_time)
    """A prefill-only pass of RooflineCost (no decode on any unit), as roofline_decode: c = tok c_tok (+ attn
    c_pa), m = tok m_tok (+ attn m_pa) + sign(tok) m_w, + the LM head of the prompts ending here (c += ends
    c_head, m += sign(ends) m_head), (+ the shared expert terms), unit = max(c, m). Token counts are integers:
    their sum is exact in any order."""
    c_tok, m_tok, m_w, c_pa, m_pa = coef[0], coef[1], coef[4], coef[9], coef[10]
    c_head, m_head = coef[11], coef[12]
    exp_c, exp_read, exp_rate, shared = coef[5], coef[6], coef[7], coef[8] != 0.0
    dp = tokens.shape[0]
    n_p = 0.0
    tokmax = tokens[0]
    for i in range(dp):
        n_p += tokens[i]
        if tokens[i] > tokmax:
            tokmax = tokens[i]
    sc = 0.0
    sm = 0.0
    if shared:
        mean = n_p / dp
        sc = mean * exp_c
        sm = exp_read * -math.expm1(-mean * exp_rate)
    unit = np.empty(dp)
    mx = -math.inf
    for i in range(dp):
        t = tokens[i]
        c = t * c_tok
        m = t * m_tok
        if n_p > 0.0:
            c = c + attn[i] * c_pa
            m = m + attn[i] * m_pa
        m = m + (1.0 if t > 0.0 else 0.0) * m_w
        if n_p > 0.0:
            e = ends[i]
            c = c + e * c_head
            m = m + (1.0 if e > 0.0 else 0.0) * m_head
        if shared:
            c = c + sc
            m = m + sm
        u = c if c >= m else m
        unit[i] = u
        if u > mx:
            mx = u
    return unit, mx, tokmax
