"""Open-loop arrival processes of the workload (workload.py's docstring, "Arrivals", is the reference) and the
re-drawn arrival times of a trace replay ("Trace replay", trace_arrivals: redraw).

`ARRIVALS` maps each `workload.arrival` name to fn(n, rate, t0, cfg, rng) -> n absolute times after t0;
adding a process is one decorated function.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from pdgym.envs.sim.config import WorkloadConfig
from pdgym.envs.sim.registry import Registry
from pdgym.envs.sim.validation import check, check_positive

__all__ = ["ARRIVALS", "LOOP_MODES", "arrivals", "redraw", "steps_schedule"]


def steps_schedule(cfg: WorkloadConfig, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints T (starting at 0) and rates R of the piecewise-constant `steps` rate."""
    steps = cfg.steps
    check(isinstance(steps, (list, tuple)) and len(steps) > 0, f"{key}.steps",
          "arrival=steps needs [[t_start_s, rate], ...]")
    ts, rs = [], []
    for i, st in enumerate(steps):
        ok = isinstance(st, (list, tuple)) and len(st) == 2
        try:
            t, r = (float(st[0]), float(st[1])) if ok else (math.nan, math.nan)
        except (TypeError, ValueError):
            t, r = math.nan, math.nan
        check(math.isfinite(t) and math.isfinite(r) and t >= 0 and r >= 0, f"{key}.steps[{i}]",
              f"got {st!r}; need [t_start_s >= 0, rate >= 0]")
        check(not ts or t > ts[-1], f"{key}.steps[{i}]",
              f"t_start {t} must be > the previous one ({ts[-1] if ts else 0}); steps are sorted by time")
        ts.append(t)
        rs.append(r)
    check(rs[-1] > 0, f"{key}.steps[{len(rs) - 1}]", "the last rate must be > 0 (it holds forever)")
    if ts[0] > 0:
        base = float(cfg.rate) if cfg.rate is not None else 0.0
        ts.insert(0, 0.0)
        rs.insert(0, base)
    return np.asarray(ts), np.asarray(rs)


ARRIVALS: Registry[Callable[..., np.ndarray]] = Registry("workload.arrival")
"""Open-loop arrival processes: fn(n, rate, t0, cfg, rng) -> n absolute times after t0 (`rate` checked > 0)."""
LOOP_MODES = ("closed", "trace")  # the other values of workload.arrival, handled by make_workload itself


@ARRIVALS.register("poisson")
def _arrivals_poisson(n: int, rate: float, t0: float, cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    return t0 + np.cumsum(rng.exponential(1.0 / rate, size=n))


@ARRIVALS.register("deterministic")
def _arrivals_deterministic(n: int, rate: float, t0: float, cfg: WorkloadConfig,
                            rng: np.random.Generator) -> np.ndarray:
    return t0 + np.arange(1, n + 1, dtype=np.float64) / rate


@ARRIVALS.register("gamma")
def _arrivals_gamma(n: int, rate: float, t0: float, cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    cv2 = float(cfg.cv) ** 2
    return t0 + np.cumsum(rng.gamma(1.0 / cv2, cv2 / rate, size=n))


@ARRIVALS.register("steps")
def _arrivals_steps(n: int, rate: float | None, t0: float, cfg: WorkloadConfig,
                    rng: np.random.Generator) -> np.ndarray:
    T, R = steps_schedule(cfg, "workload")
    L = np.concatenate([[0.0], np.cumsum(R[:-1] * np.diff(T))])  # cumulative intensity at T
    k0 = int(np.searchsorted(T, t0, side="right") - 1)
    s = L[k0] + R[k0] * (t0 - T[k0]) + np.cumsum(rng.exponential(1.0, size=n))
    k = np.searchsorted(L, s, side="right") - 1  # zero-rate segments are skipped (equal L)
    return T[k] + (s - L[k]) / R[k]


@ARRIVALS.register("onoff")
def _arrivals_onoff(n: int, rate: float, t0: float, cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    on_s, off_s = float(cfg.on_s), float(cfg.off_s)
    r_on = rate * (on_s + off_s) / on_s
    u = np.cumsum(rng.exponential(1.0 / r_on, size=n))  # times on the "on" clock
    m = int(u[-1] / on_s * 1.25) + 16
    on = rng.exponential(on_s, size=m)
    off = rng.exponential(off_s, size=m)
    while on.sum() <= u[-1]:
        on = np.concatenate([on, rng.exponential(on_s, size=m)])
        off = np.concatenate([off, rng.exponential(off_s, size=m)])
    k = np.searchsorted(np.cumsum(on), u, side="right")  # on-period holding u
    off_before = np.concatenate([[0.0], np.cumsum(off)])[k]
    return t0 + u + off_before


@ARRIVALS.register("diurnal")
def _arrivals_diurnal(n: int, rate: float, t0: float, cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    check_positive(cfg.period_s, "workload.period_s")
    amp, period = float(cfg.amplitude), float(cfg.period_s)
    lam_max = rate * (1.0 + amp)
    out, need, t = [], n, t0
    while need > 0:
        m = int(need * (1.0 + amp) * 1.1) + 32
        cand = t + np.cumsum(rng.exponential(1.0 / lam_max, size=m))
        keep = rng.random(m) * (1.0 + amp) < 1.0 + amp * np.sin(2.0 * np.pi * cand / period)
        sel = cand[keep][:need]
        out.append(sel)
        need -= sel.shape[0]
        t = float(cand[-1])
    return np.concatenate(out)


def arrivals(kind: str, n: int, rate: float | None, t0: float, cfg: WorkloadConfig, rate_key: str,
              rng: np.random.Generator) -> np.ndarray:
    """`n` absolute arrival times of the open-loop process `kind`, continuing after time `t0`."""
    process = ARRIVALS[kind]
    if kind != "steps":  # the steps schedule sets its own rates
        check(rate is not None, rate_key, f"arrival={kind} needs rate > 0 (rate: null only replays a trace's times)")
        check_positive(rate, rate_key)
        rate = float(rate)
    return process(n, rate, t0, cfg, rng)


def redraw(recorded: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals on the rate curve of `recorded` (piecewise constant over every k rows; docstring)."""
    n = recorded.shape[0]
    if n < 2 or recorded[-1] <= 0:
        return recorded.copy()
    idx = np.arange(0, n, k)
    if idx[-1] != n - 1:
        idx = np.append(idx, n - 1)
    knots_t, knots_count = recorded[idx], idx.astype(np.float64)
    s = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0, size=n - 1))])
    out = np.interp(s, knots_count, knots_t)
    beyond = s > knots_count[-1]
    out[beyond] = knots_t[-1] + (s[beyond] - knots_count[-1]) * (knots_t[-1] / knots_count[-1])
    return out
