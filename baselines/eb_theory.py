"""Closed forms of exclusive vs mixed batching (ALGORITHMS.md section 5), as plain functions.

Notation: N slots, p = 1 / mu_O the per-iteration completion hazard of geometric outputs,
mu_L / mu_O mean prompt / output tokens, and the linear cost form of one hardware x model:
prefill phase a_p + b_p L, decode iteration a_d + b_d n, mixed batch a_mb + b_mb(r) T with
b_mb(r) = c0 + c1 r + c2 r^2 (`coef` is a mapping with those keys, e.g. from
`pdgym.envs.sim.cost.linear_coefficients`). EB* / EB+ (exclusive_batching.py) call these;
the tests check them against hand-computed values and against each other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
from pdgym.envs.sim.events import PassKind

THETA_MIN, THETA_MAX = 0.01, 0.99
BOUNDS = ("static", "expected_peak", "probabilistic")  # memory-safe batch bounds, rising caution


def lam(theta: float) -> float:
    """Lambda(theta) = -ln(1 - theta): decode iterations (in units of mu_O) until theta N slots are idle."""
    return -math.log1p(-theta)


def theta0_rhs(theta: float) -> float:
    """Left side of the theta0 equation, theta / (1 - theta) + ln(1 - theta); increasing from 0 on (0, 1)."""
    return theta / (1.0 - theta) + math.log1p(-theta)


def theta0(a_p: float, a_d: float, mu_o: float) -> float:
    """Optimal EB threshold for geometric outputs: root of theta/(1-theta) + ln(1-theta) = a_p / (mu_O a_d).

    Independent of N, mu_L, b_p, b_d; falls as mu_O grows (~ sqrt(2c) for a small right side c).
    Bisection, clamped to [0.01, 0.99].
    """
    if a_d <= 0 or mu_o <= 0:
        return THETA_MAX
    c = a_p / (mu_o * a_d)
    if c <= theta0_rhs(THETA_MIN):
        return THETA_MIN
    if c >= theta0_rhs(THETA_MAX):
        return THETA_MAX
    lo, hi = THETA_MIN, THETA_MAX
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if theta0_rhs(mid) < c:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def blended_b(coef: Mapping[str, float], mu_l: float, mu_o: float) -> float:
    """bw = (b_p mu_L + b_d mu_O) / (mu_L + mu_O): the per-token marginal cost of exclusive batching."""
    return (coef["b_p"] * mu_l + coef["b_d"] * mu_o) / (mu_l + mu_o)


def eb_throughput(theta: float, n: float, coef: Mapping[str, float], mu_l: float, mu_o: float) -> float:
    """Requests/s of EB(theta, N) in the fluid cycle: theta N / (a_p + a_d mu_O Lambda + theta N (mu_L+mu_O) bw)."""
    tn = theta * n
    cycle = coef["a_p"] + coef["a_d"] * mu_o * lam(theta) + tn * (mu_l + mu_o) * blended_b(coef, mu_l, mu_o)
    return tn / cycle


def b_mb(r: float, coef: Mapping[str, float]) -> float:
    """Per-token cost of a mixed batch with decode share r: c0 + c1 r + c2 r^2."""
    return coef["c0"] + (coef["c1"] + coef["c2"] * r) * r


def mb_throughput(lam_pf: float, r: float, coef: Mapping[str, float], mu_l: float, mu_o: float) -> float:
    """Requests/s of MB with lam_pf prefill completions per iteration: lam / (a_mb + b_mb(r) lam (mu_L + mu_O))."""
    return lam_pf / (coef["a_mb"] + b_mb(r, coef) * lam_pf * (mu_l + mu_o))


def exact_k(n: int, p: float, a_p: float, a_d: float, b_d: float) -> int:
    """Exact finite-N rule: the smallest k with k tau(N-k) - sum_{j=N-k+1..N} tau(j) >= a_p,
    tau(j) = (a_d + b_d j) / (1 - (1-p)^j) the expected time per completion with j running.
    Returns N - 1 when no k < N qualifies."""
    j = np.arange(1, n + 1, dtype=float)
    tau = (a_d + b_d * j) / -np.expm1(j * math.log1p(-p))
    k = np.arange(1, n)
    top = np.cumsum(tau[::-1])[: n - 1]  # sum of tau(N-k+1..N) for k = 1..N-1
    gain = k * tau[n - k - 1] - top  # tau(N-k) sits at index N-k-1
    ok = np.flatnonzero(gain >= a_p)
    return int(k[ok[0]]) if len(ok) else n - 1


def ifr_correction(theta_0: float, p: float, eta: float, n: float, a_d: float, b_d: float) -> float:
    """First-order shift of the optimal theta under an increasing hazard h(t) = p + eta t (eta >= 0):

    dtheta = eta (1-theta0)^2 / (p^2 theta0) [Lambda0 (theta0/(1-theta0) - Lambda0/2) + rho (Lambda0 - theta0)],
    rho = b_d N / a_d, capped at 5 theta0.
    """
    if eta <= 0:
        return 0.0
    l0 = lam(theta_0)
    rho = b_d * n / a_d
    d = eta * (1 - theta_0) ** 2 / (p * p * theta_0) * (l0 * (theta_0 / (1 - theta_0) - l0 / 2)
                                                         + rho * (l0 - theta_0))
    return min(d, 5.0 * theta_0)


def fluid_cost_per_completion(theta: float, p: float, eta: float, n: float, a_p: float, a_d: float,
                              b_d: float) -> float:
    """Fluid model n(t) = N exp(-p t - eta t^2 / 2) of one EB cycle: decode until (1-theta) N remain
    (time T), then refill; seconds per completion, without the b_p mu_L term (constant in theta)."""
    lm = lam(theta)
    t_end = lm / p if eta <= 0 else (-p + math.sqrt(p * p + 2 * eta * lm)) / eta
    ts = np.linspace(0.0, t_end, 257)
    alive = np.exp(-p * ts - 0.5 * eta * ts * ts)
    area = float(np.sum((alive[1:] + alive[:-1]) * 0.5) * (ts[1] - ts[0]))
    return (a_p + a_d * t_end + b_d * n * area) / (theta * n)


def fluid_optimum(p: float, eta: float, n: float, a_p: float, a_d: float, b_d: float) -> float:
    """Numerical optimum theta of the fluid model (bounded scalar minimisation on [0.01, 0.99])."""
    from scipy.optimize import minimize_scalar  # 0.7 s of import: only when a fluid optimum is asked for

    res = minimize_scalar(fluid_cost_per_completion, bounds=(THETA_MIN, THETA_MAX), method="bounded",
                          args=(p, eta, n, a_p, a_d, b_d), options={"xatol": 1e-6})
    return float(res.x)


def slot_kv(theta: float, p: float, mu_l: float) -> float:
    """D(theta) = mu_L + ((1-theta) / (theta p)) ln(1 / (1-theta)): expected KV per slot at decode start."""
    return mu_l + (1 - theta) / (theta * p) * lam(theta)


def memory_bounds(capacity: float, theta: float, p: float, mu_l: float, eps: float = 0.01) -> dict[str, int]:
    """Memory-safe batch sizes in rising caution: static floor(C/D), expected peak floor((C - nu)/D),
    probabilistic floor((C - nu ln(1/eps))/D), with nu = 1 / (p^2 mu_L) the volatility of the KV walk."""
    d = slot_kv(theta, p, mu_l)
    nu = 1.0 / (p * p * mu_l)
    return {"static": int(capacity // d), "expected_peak": int(max(capacity - nu, 0.0) // d),
            "probabilistic": int(max(capacity - nu * math.log(1.0 / eps), 0.0) // d)}


def safe_batch(bounds: Mapping[str, int], bound: str) -> int:
    """The `bound` entry of `memory_bounds`, or the next less cautious one while it is 0, at least 1.

    A bound is 0 when its headroom (nu, or nu ln(1/eps)) exceeds the capacity: long outputs on
    a small KV (e.g. mu_O = 4608, mu_L = 512 on 182k tokens: nu ln 100 = 191k). Then no batch
    meets that caution at all, not even one request, and clamping to a batch of 1 would idle the
    instance; the next bound still sizes the batch to the memory, and the KV gate and preemption
    carry the residual risk.
    """
    for name in reversed(BOUNDS[: BOUNDS.index(bound) + 1]):
        if bounds[name] >= 1:
            return int(bounds[name])
    return 1


def crossover(r: float, n: float, coef: Mapping[str, float], mu_l: float, mu_o: float,
              theta_0: float) -> tuple[float, float]:
    """(LHS, RHS) of the EB+ test: MB is at least as good as EB iff LHS <= RHS, where
    LHS = b_mb(r) - bw and RHS = [(a_p - a_d mu_O ln(1-theta0)) / (theta0 N) - a_mb (1 + mu_O) / N] / (mu_L + mu_O).
    """
    lhs = b_mb(r, coef) - blended_b(coef, mu_l, mu_o)
    rhs = ((coef["a_p"] + coef["a_d"] * mu_o * lam(theta_0)) / (theta_0 * n)
           - coef["a_mb"] * (1 + mu_o) / n) / (mu_l + mu_o)
    return lhs, rhs


def mb_better(r: float, n: float, coef: Mapping[str, float], mu_l: float, mu_o: float, theta_0: float) -> bool:
    lhs, rhs = crossover(r, n, coef, mu_l, mu_o, theta_0)
    return lhs <= rhs


def fit_mixed_cost(tokens, decode_reqs, dur) -> dict[str, float]:
    """Least-squares fit of dur = a_mb + (c0 + c1 r + c2 r^2) T over mixed iterations (T tokens, r = decodes / T)."""
    t = np.asarray(tokens, dtype=float)
    r = np.asarray(decode_reqs, dtype=float) / t
    x = np.column_stack([np.ones_like(t), t, r * t, r * r * t])
    if len(t) < 4:
        raise ValueError(f"fit_mixed_cost: need at least 4 mixed iterations, got {len(t)}")
    scale = np.abs(x).max(axis=0)
    coef, *_ = np.linalg.lstsq(x / scale, np.asarray(dur, dtype=float), rcond=None)
    a_mb, c0, c1, c2 = (coef / scale).tolist()
    return {"a_mb": a_mb, "c0": c0, "c1": c1, "c2": c2}


def calibrate_mixed(sim_config, output_means=(32, 128, 512), num_requests: int = 400,
                    seed: int = 0) -> dict[str, float]:
    """Mixed-cost calibration from a few MB runs: run the engine's mixed batching on `sim_config`
    (a SimConfig) with geometric outputs of each mean (several decode ratios) and fit
    `fit_mixed_cost` to every mixed iteration they logged."""
    from pdgym.envs.sim import simulate
    from pdgym.envs.sim.config import LengthConfig

    rows = []
    for mu in output_means:
        wl = dataclasses.replace(sim_config.workload, num_requests=num_requests, trace=None,
                                 output=LengthConfig(dist="geometric", mean=float(mu), max=8 * int(mu)))
        steps = simulate(dataclasses.replace(sim_config, workload=wl), seed=seed).steps
        mixed = steps[(steps.kind == PassKind.COLOCATED) & (steps.reqs > 0) & (steps.tokens > steps.reqs)]
        rows.append(mixed[["tokens", "reqs", "dur"]])
    import pandas as pd  # the fit's one table; pandas is not loaded for EB's policies

    m = pd.concat(rows)
    return fit_mixed_cost(m.tokens, m.reqs, m.dur)
