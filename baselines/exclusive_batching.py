"""Exclusive vs mixed batching on a colocated instance (ALGORITHMS.md section 5): v0, MB (v1),
EB(theta, N), EB* and EB+.

Exclusive batching (EB) alternates whole phases: a decode phase in which every running
request steps, and a refill phase of prefill-only batches that admit new requests. The phase
machine per DP unit: refill (phase 0 = the initial fill of N, phase 2 = a refill) and decode
(phase 1). Decode -> refill when fillable * (N - k) >= n * k with n running,
fillable = min(waiting, N - n) and k = round(theta N): "k slots idle" under saturation,
continuous batching under light load. Refill -> decode when the refill target is admitted,
the queue is empty, or KV / slots are full (prompt chunks in flight always finish first).

EB* sets theta and N online from completed requests only (`sim.completed`; output lengths of
running requests stay hidden): an empirical hazard fit gives p0 and eta, theta0 (closed form)
plus the IFR correction, clipped and smoothed; N is the memory-safe batch size; a KV gate holds
refills while free KV is short. EB+ runs MB or EB* by the crossover test with an EMA of the
occupancy, a margin, hysteresis and a cooldown; it starts in MB.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.cost import linear_coefficients
from pdgym.envs.sim.policy import Batch, BatchingPolicy, MixedBatching
from pdgym.envs.sim.validation import check_float, check_int

from . import eb_theory as T
from .batching_study import PrefillFirst
from .registry import register

REFILL, DECODE = 0, 1
BOUNDS = T.BOUNDS


@register("batching", "v0")
class V0(PrefillFirst):
    """vLLM v0: exclusive batching that switches to prefill whenever a slot frees and a prompt fits
    (prefill-first with K = the unit's token budget unless given)."""


@register("batching", "mb")
class MB(MixedBatching):
    """MB / vLLM v1: decode-maximal mixed batching (the engine default) under a token budget
    (`budget` tokens per iteration, decodes included; null = the unit's chunk_tokens)."""

    def __init__(self, budget: int | None = None):
        self.budget = check_int(budget, "policy.batching.budget", allow_none=True)

    def next_batch(self, sim, inst, unit):
        if self.budget is None:
            return super().next_batch(sim, inst, unit)
        u = sim.colocated[inst].units[unit]
        n_dec = u.n_decoding
        pieces = sim.fill_prefill(inst, unit, self.budget - n_dec)
        if not pieces and n_dec == 0:
            return None
        return Batch(prefill=pieces, decode=n_dec > 0)


# --------------------------------------------------------------------------- EB(theta, N)
class UnitState:
    """Phase-machine state of one DP unit (read through baselines/shared.py's PhaseMachine)."""

    __slots__ = ("phase", "target", "theta")

    def __init__(self):
        self.phase = REFILL  # phase 0: the initial prefill of N
        self.target = -1  # admissions left in this refill; -1 = up to N
        self.theta: float | None = None  # this unit's threshold (set_theta); None: the policy's


@register("batching", "eb")
class EB(BatchingPolicy):
    """EB(theta, N): exclusive batching with a fixed threshold theta and batch size N (null = the
    unit's slots). `prefill_budget` caps the tokens of one prefill batch (null = chunk_tokens)."""

    def __init__(self, theta: float = 0.1, N: int | None = None, prefill_budget: int | None = None):
        self.theta = check_float(theta, "policy.batching.theta", 0.0, 1.0, lo_open=True, hi_open=True)
        self.N = check_int(N, "policy.batching.N", allow_none=True)
        self.prefill_budget = check_int(prefill_budget, "policy.batching.prefill_budget", allow_none=True)

    def reset(self, sim):
        self._units: dict[tuple[int, int], UnitState] = {}

    # Hooks EB* overrides (batch size, KV gate); the unit's theta is set_theta's when given.
    def batch_size(self, u) -> int:
        return min(self.N or u.slots, u.slots)

    def current_theta(self, st: UnitState) -> float:
        return self.theta if st.theta is None else st.theta

    def kv_gate_open(self, u) -> bool:
        return True

    def unit_state(self, inst: int, unit: int) -> UnitState:
        st = self._units.get((inst, unit))
        if st is None:
            st = self._units[(inst, unit)] = UnitState()
        return st

    def set_theta(self, inst: int, unit: int, theta: float) -> None:
        """The unit's threshold from now on, instead of the policy's (an agent's per-unit choice)."""
        self.unit_state(inst, unit).theta = theta

    def resume(self, inst: int, unit: int, refill: bool) -> None:
        """Restart the unit's cycle with no admission pending: finish the prompt chunks in flight (refill)
        or decode; theta decides the next refill."""
        st = self.unit_state(inst, unit)
        st.phase, st.target = (REFILL if refill else DECODE), 0

    def wants_refill(self, u, st: UnitState) -> bool:
        """Decode -> refill: fillable (N - k) >= n k, fillable = min(waiting, N - n), KV gate open."""
        n_cap = self.batch_size(u)
        n = u.n_running
        fillable = min(len(u.waiting), n_cap - n)
        if fillable <= 0:
            return False
        k = max(1, round(self.current_theta(st) * n_cap))
        if fillable * (n_cap - k) < n * k:
            return False
        return u.n_decoding == 0 or self.kv_gate_open(u)

    def next_batch(self, sim, inst, unit):
        u = sim.colocated[inst].units[unit]
        st = self.unit_state(inst, unit)
        if st.phase == REFILL:
            b = self.refill_batch(sim, inst, unit, u, st)
            if b is not None:
                return b
            st.phase = DECODE
            if u.n_decoding:  # a refill is followed by at least one decode iteration
                return Batch(decode=True)
        if self.wants_refill(u, st):
            st.phase = REFILL
            st.target = self.batch_size(u) - u.n_running
            b = self.refill_batch(sim, inst, unit, u, st)
            if b is not None:
                return b
            st.phase = DECODE
        return Batch(decode=True) if u.n_decoding else None

    def refill_batch(self, sim, inst, unit, u, st) -> Batch | None:
        """Prefill-only batch: chunks in flight, then new admissions up to the refill target."""
        budget = self.prefill_budget or u.chunk_tokens
        left = st.target if st.target >= 0 else self.batch_size(u) - u.n_running
        pieces = sim.fill_prefill(inst, unit, budget, admit_new=left > 0)
        n_running = len(u.prefilling)
        if len(pieces) > n_running + max(left, 0):
            pieces = pieces[: n_running + left]
        if not pieces:
            return None
        st.target = left - (len(pieces) - n_running)
        return Batch(prefill=pieces)


# --------------------------------------------------------------------------- online statistics
class OutputStats:
    """Output-length statistics learned from completed requests only (ALGORITHMS.md s5, EB*).

    Every `every` completions once `warmup` are seen: a hazard fit p0 + eta t over the last
    `window` output lengths; mu_O by EMA (0.2) over the means of those batches of completions,
    mu_L by EMA (0.05) per completion. Shared by EB*, EB+ and the PhaseBatching env.
    """

    def __init__(self, window: int = 500, every: int = 100, warmup: int = 30, mu_o_ema: float = 0.2,
                 mu_l_ema: float = 0.05):
        self.window, self.every, self.warmup = window, every, warmup
        self.mu_o_ema, self.mu_l_ema = mu_o_ema, mu_l_ema

    def reset(self, sim) -> None:
        self._seen = 0
        self.outputs: deque[int] = deque(maxlen=self.window)
        self.n = 0  # completions observed
        self._batch_sum = 0.0
        self._batch_n = 0
        self._last_fit = None  # self.n at the last fit
        self.mu_o: float | None = None
        self.mu_l: float | None = None
        self.p0: float | None = None
        self.eta = 0.0

    @property
    def fitted(self) -> bool:
        return self.p0 is not None

    def ingest(self, sim) -> bool:
        """Read completions since the last call; True when a refit happened."""
        done = sim.completed
        if len(done) == self._seen:
            return False
        new = done[self._seen:]
        self._seen = len(done)
        req = sim.req
        outs = req.done[new]
        self.outputs.extend(outs.tolist())
        a = self.mu_l_ema
        mu_l = self.mu_l
        for x in req.prompt[new].tolist():
            mu_l = float(x) if mu_l is None else (1 - a) * mu_l + a * x
        self.mu_l = mu_l
        self.n += len(new)
        self._batch_sum += float(outs.sum())
        self._batch_n += len(new)
        if self.n < self.warmup or (self._last_fit is not None and self.n - self._last_fit < self.every):
            return False
        batch_mean = self._batch_sum / self._batch_n
        self.mu_o = batch_mean if self.mu_o is None else (1 - self.mu_o_ema) * self.mu_o + self.mu_o_ema * batch_mean
        self._batch_sum, self._batch_n = 0.0, 0
        self.p0, self.eta = fit_hazard(np.fromiter(self.outputs, dtype=np.int64, count=len(self.outputs)))
        self._last_fit = self.n
        return True


def fit_hazard(outputs: np.ndarray, min_count: int = 5) -> tuple[float, float]:
    """Weighted least squares of the empirical hazard h(t) = #{O = t} / #{O >= t} to p0 + eta t
    over the 5th..95th percentile of t, weights #{O >= t} (counts < min_count skipped), subject to
    eta >= 0 and p0 >= 1 / mean(O). Fallback (too few points): p0 = 1 / mean, eta = 0."""
    mean = float(outputs.mean())
    p_min = 1.0 / mean
    lo, hi = np.percentile(outputs, [5, 95])
    lo, hi = max(int(lo), 1), int(hi)
    counts = np.bincount(outputs, minlength=hi + 2)
    at_least = np.cumsum(counts[::-1])[::-1]  # #{O >= t}
    t = np.arange(lo, hi + 1)
    w = at_least[t].astype(float)
    keep = w >= min_count
    t, w = t[keep].astype(float), w[keep]
    if len(t) < 2:
        return p_min, 0.0
    h = counts[t.astype(int)] / w

    def sse(p0, eta):
        return float(np.dot(w, (h - p0 - eta * t) ** 2))

    sw, st, stt = w.sum(), np.dot(w, t), np.dot(w, t * t)
    sh, sth = np.dot(w, h), np.dot(w, t * h)
    det = sw * stt - st * st
    cands = []
    if det > 0:
        eta = (sw * sth - st * sh) / det
        p0 = (sh - eta * st) / sw
        if eta >= 0 and p0 >= p_min:
            return float(p0), float(eta)
    cands.append((max(sh / sw, p_min), 0.0))  # eta = 0 face
    cands.append((p_min, max((sth - p_min * st) / stt, 0.0)))  # p0 = p_min face
    p0, eta = min(cands, key=lambda c: sse(*c))
    return float(p0), float(eta)


# --------------------------------------------------------------------------- EB*
@register("batching", "eb_star")
class EBStar(EB):
    """EB*: EB with theta and N set online (hazard fit, CFR theta0, IFR correction, clip and
    smoothing, memory-safe N, KV gate). Linear cost coefficients come from the instance's cost
    model (`linear_coefficients`, refitted when the learned lengths drift by > 25%) unless `coef`
    gives them. Parameters as ALGORITHMS.md s5; `bound` picks the memory-safe batch bound."""

    def __init__(self, theta_min: float = 0.01, theta_max: float = 0.80, smooth: float = 0.3,
                 cold_theta: float = 0.70, eps: float = 0.01, bound: str = "probabilistic",
                 kv_gate: bool = True, r0: float = 0.0, window: int = 500, every: int = 100,
                 warmup: int = 30, mean_prompt: float = 1024.0, mean_output: float = 128.0,
                 coef: dict | None = None, N: int | None = None, prefill_budget: int | None = None):
        super().__init__(theta=cold_theta, N=N, prefill_budget=prefill_budget)
        k = "policy.batching."
        self.theta_min = check_float(theta_min, k + "theta_min", 0.0, 1.0, lo_open=True, hi_open=True)
        self.theta_max = check_float(theta_max, k + "theta_max", self.theta_min, 1.0, hi_open=True)
        self.smooth = check_float(smooth, k + "smooth", 0.0, 1.0, lo_open=True)
        self.cold_theta = check_float(cold_theta, k + "cold_theta", 0.0, 1.0, lo_open=True, hi_open=True)
        self.eps = check_float(eps, k + "eps", 0.0, 1.0, lo_open=True, hi_open=True)
        if bound not in BOUNDS:
            raise ConfigError(f"{k}bound: got {bound!r}; allowed: {', '.join(BOUNDS)}")
        self.bound = bound
        if not isinstance(kv_gate, bool):
            raise ConfigError(f"{k}kv_gate: got {kv_gate!r}; must be true or false")
        self.kv_gate = kv_gate
        self.r0 = check_float(r0, k + "r0", -1.0, 1.0)
        self.stats = OutputStats(window=check_int(window, k + "window", 10),
                                 every=check_int(every, k + "every"), warmup=check_int(warmup, k + "warmup", 2))
        self.mean_prompt = check_float(mean_prompt, k + "mean_prompt", lo_open=True)
        self.mean_output = check_float(mean_output, k + "mean_output", lo_open=True)
        if coef is not None:
            need = ("a_p", "b_p", "a_d", "b_d", "a_mb", "c0", "c1", "c2")
            missing = [c for c in need if c not in coef]
            if not isinstance(coef, dict) or missing:
                raise ConfigError(f"{k}coef: missing {', '.join(missing)}; needs {', '.join(need)}")
            coef = {c: float(coef[c]) for c in need}
        self.fixed_coef = coef

    def reset(self, sim):
        super().reset(sim)
        self.stats.reset(sim)
        self.theta = self.cold_theta
        self._n_mem: int | None = None  # memory-safe N (None until the first fit)
        self._cost = sim.colocated[0].cost
        self._calib = (self.mean_prompt, self.mean_output)
        self.coef = self.fixed_coef or self._fit_coef(*self._calib)

    def _fit_coef(self, mu_l: float, mu_o: float) -> dict:
        return linear_coefficients(self._cost, mu_l, mu_l + 0.5 * mu_o)

    @property
    def mu_o(self) -> float:
        return self.stats.mu_o or self.mean_output

    @property
    def mu_l(self) -> float:
        return self.stats.mu_l or self.mean_prompt

    def batch_size(self, u) -> int:
        cap = min(self.N or u.slots, u.slots)
        return cap if self._n_mem is None else max(1, min(cap, self._n_mem))

    def kv_gate_open(self, u) -> bool:
        if not self.kv_gate:
            return True
        tau = min(max(self.batch_size(u) * 0.5 * self.mu_o / u.kv_cap + self.r0, 0.05), 0.6)
        return u.kv_cap - u.kv_used >= tau * u.kv_cap

    def observe(self, sim) -> bool:
        """Ingest completions; on a refit update coefficients, theta and N. True on a refit."""
        if not self.stats.ingest(sim):
            return False
        s = self.stats
        if self.fixed_coef is None:
            c_l, c_o = self._calib
            if abs(s.mu_l / c_l - 1) > 0.25 or abs(s.mu_o / c_o - 1) > 0.25:
                self._calib = (s.mu_l, s.mu_o)
                self.coef = self._fit_coef(*self._calib)
        c = self.coef
        u = sim.colocated[0].units[0]
        n_prev = self.batch_size(u)
        th0 = T.theta0(c["a_p"], c["a_d"], 1.0 / s.p0)
        th = th0 + T.ifr_correction(th0, s.p0, s.eta, n_prev, c["a_d"], c["b_d"])
        th = min(max(th, self.theta_min), self.theta_max)
        self.theta = self.smooth * th + (1 - self.smooth) * self.theta
        self._n_mem = T.safe_batch(T.memory_bounds(u.kv_cap, self.theta, s.p0, s.mu_l, self.eps), self.bound)
        return True

    def next_batch(self, sim, inst, unit):
        self.observe(sim)
        return super().next_batch(sim, inst, unit)


# --------------------------------------------------------------------------- EB+
@register("batching", "eb_plus")
class EBPlus(EBStar):
    """EB+: MB or EB* chosen online by the crossover test (ALGORITHMS.md s5).

    EB when LHS(r_hat) > RHS(N_obs) + delta, back to MB when LHS < RHS - 3 delta, with
    r_hat = mu_O / (mu_L + mu_O) and N_obs an EMA of running + waiting requests per unit (weight
    0.3 rising, 0.03 falling), capped at the batch EB could run. Evaluated every `every`
    completions, or at once when demand exceeds 2 N_obs; never while N_obs < min_occupancy;
    `cooldown` evaluations skipped after a switch; starts in MB. Takes EB*'s parameters too.

    Departure: delta defaults to 1e-6 s/token, not ALGORITHMS.md's 1e-5. That figure suits the
    published H200 calibration; with coefficients fitted to the roofline, the EB-vs-MB gap of
    regimes where EB wins by ~5% (RTX PRO 6000, prefill-heavy) is 3-6e-6 s/token, so 1e-5 kept
    EB+ in MB there (eb_plus_shift). Hysteresis (3 delta) and the cooldown still stop flapping.
    """

    def __init__(self, delta: float = 1e-6, rise: float = 0.3, fall: float = 0.03, cooldown: int = 3,
                 min_occupancy: float = 16.0, budget: int | None = None, theta_min: float = 0.01,
                 theta_max: float = 0.80, smooth: float = 0.3, cold_theta: float = 0.70, eps: float = 0.01,
                 bound: str = "probabilistic", kv_gate: bool = True, r0: float = 0.0, window: int = 500,
                 every: int = 100, warmup: int = 30, mean_prompt: float = 1024.0, mean_output: float = 128.0,
                 coef: dict | None = None, N: int | None = None, prefill_budget: int | None = None):
        super().__init__(theta_min=theta_min, theta_max=theta_max, smooth=smooth, cold_theta=cold_theta, eps=eps,
                         bound=bound, kv_gate=kv_gate, r0=r0, window=window, every=every, warmup=warmup,
                         mean_prompt=mean_prompt, mean_output=mean_output, coef=coef, N=N,
                         prefill_budget=prefill_budget)
        k = "policy.batching."
        self.delta = check_float(delta, k + "delta")
        self.rise = check_float(rise, k + "rise", 0.0, 1.0, lo_open=True)
        self.fall = check_float(fall, k + "fall", 0.0, 1.0, lo_open=True)
        self.cooldown = check_int(cooldown, k + "cooldown", 0)
        self.min_occupancy = check_float(min_occupancy, k + "min_occupancy")
        self.mb = MB(budget)

    def reset(self, sim):
        super().reset(sim)
        self.mode = "mb"
        self.n_obs = 0.0
        self._skip = 0
        self.switches: list[tuple[float, str]] = []  # (time, new mode), for analysis

    def _occupancy(self, sim) -> float:
        units = [u for C in sim.colocated for u in C.units]
        return sum(u.n_running + len(u.waiting) for u in units) / len(units)

    def evaluate(self, sim) -> None:
        if self.n_obs < self.min_occupancy or not self.stats.fitted:
            return
        if self._skip > 0:
            self._skip -= 1
            return
        u = sim.colocated[0].units[0]
        mu_l, mu_o = self.mu_l, self.mu_o
        n = min(self.n_obs, self.batch_size(u))
        lhs, rhs = T.crossover(mu_o / (mu_l + mu_o), n, self.coef, mu_l, mu_o, self.theta)
        new = self.mode
        if self.mode == "mb" and lhs > rhs + self.delta:
            new = "eb"
        elif self.mode == "eb" and lhs < rhs - 3 * self.delta:
            new = "mb"
        if new != self.mode:
            self.mode = new
            self._skip = self.cooldown
            self.switches.append((sim.now, new))
            for st in self._units.values():  # EB resumes by finishing chunks in flight
                st.phase, st.target = REFILL, 0

    def next_batch(self, sim, inst, unit):
        if inst == 0 and unit == 0:
            occ = self._occupancy(sim)
            a = self.rise if occ > self.n_obs else self.fall
            self.n_obs += a * (occ - self.n_obs)
            refit = self.observe(sim)
            if refit or occ > 2 * self.n_obs:
                self.evaluate(sim)
        if self.mode == "mb":
            return self.mb.next_batch(sim, inst, unit)
        return EB.next_batch(self, sim, inst, unit)

