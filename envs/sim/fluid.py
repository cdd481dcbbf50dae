"""Fluid model of a P/D cluster: per-class queues drained at the pools' token rates, for capacity control over hours.

The pass-level engine (engine.py) times every forward pass; an hour of traffic at tens of requests per second is
millions of passes, far too slow for an env that takes one capacity decision every 15 s. The fluid model keeps, per
request class, the prefill backlog (requests and tokens), the requests waiting for a decode slot and those decoding,
and moves them in sub-steps at rates taken from the scenario's own cost model (`FluidRates`: a prefill instance's
token rate on full chunks of the class's prompts, a decode instance's step time at its batch and context, the KV a
decode instance holds). TTFT attainment comes from each class's empirical prompt lengths (the share whose own prefill
pass fits in what the queue wait leaves of the SLO), TPOT attainment from the decode step time plus the wait for a
decode slot spread over the class's empirical output lengths. Every state array has a leading batch shape, so one
call steps many cluster configurations at once (the hindsight DP's table of static configurations).

Calibrated against the engine at stationary points: tests/test_capacity_fluid.py (bounds and why there).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np

from .config import SimConfig
from .cost import build_cost_model
from .hardware import load_hardware
from .kv_memory import kv_capacity_tokens
from .models import load_model
from .traces import read_lengths
from .validation import check

# Prompt lengths sampled per class for the service-time table (the CDF behind TTFT attainment): enough for the
# percentiles that matter (0.1% resolution), few enough to build in milliseconds.
CDF_POINTS = 1024


@dataclass(frozen=True)
class ClassLengths:
    """One request class's length distribution: empirical prompt and output lengths (a shipped trace's columns)."""

    name: str
    prompt: np.ndarray
    output: np.ndarray

    @classmethod
    def from_trace(cls, name: str, trace: str) -> ClassLengths:
        return cls(name, read_lengths(trace, "prompt", f"capacity.classes.{name}"),
                   read_lengths(trace, "output", f"capacity.classes.{name}"))


class FluidRates:
    """Per-instance rates of one P/D cluster shape, per class, from the scenario's cost model (roofline by default),
    so the fluid model follows the configured hardware and model."""

    def __init__(self, sim: SimConfig, classes: list[ClassLengths]):
        check(sim.cluster.topology == "disaggregated", "cluster.topology",
              f"got {sim.cluster.topology!r}; the capacity model needs disaggregated")
        hw, model = load_hardware(sim.hardware), load_model(sim.model)
        self.hw, self.model = hw, model
        pre, dec = sim.cluster.prefill, sim.cluster.decode
        check(pre.dp == 1 and dec.dp == 1, "cluster.prefill.dp", "the capacity model runs one DP unit per instance")
        self.gpus_prefill, self.gpus_decode = pre.tp * pre.dp, dec.tp * dec.dp  # devices one instance spans
        pc = build_cost_model(sim.cost, hw, model, pre)
        self.dc = build_cost_model(sim.cost, hw, model, dec)
        one = np.ones(1)

        def ptime(tokens: float, attn: float, ends: float) -> float:
            return pc.pass_time(one * tokens, one * attn, one * 0.0, one * 0.0, one * ends)

        chunk = float(pre.chunk_tokens)
        self.names = [c.name for c in classes]
        n = len(classes)
        self.prompt_mean = np.array([c.prompt.mean() for c in classes])
        self.output_mean = np.array([c.output.mean() for c in classes])
        self.prefill_tok_s = np.empty(n)  # prompt tokens / s of one prefill instance on full chunks of this class
        self.service = []  # per class: sorted seconds of one prompt's own prefill (its passes alone), CDF_POINTS
        self.out_sorted = []  # per class: sorted output lengths (TPOT: the decode-queue wait spread over them)
        q = (np.arange(CDF_POINTS) + 0.5) / CDF_POINTS
        for i, c in enumerate(classes):
            p = c.prompt.astype(float)
            # a full chunk holds chunk / E[P] prompts; each prompt's attention pairs are P^2 / 2
            attn_per_tok = float((p * p).mean() / (2 * p.mean()))
            self.prefill_tok_s[i] = chunk / ptime(chunk, chunk * attn_per_tok, chunk / p.mean())
            sample = np.quantile(p, q)
            passes = np.ceil(sample / chunk)
            own = np.array([k * ptime(s / k, s * s / (2 * k), 1.0 / k) for s, k in zip(sample, passes)])
            self.service.append(np.sort(own))
            self.out_sorted.append(np.sort(np.quantile(c.output.astype(float), q)))
        self.kv_tokens = float(kv_capacity_tokens(hw, model, dec, "cluster.decode"))
        self.batch_limit = float(dec.batch_limit)
        self.net_s = float(sim.cluster.net_latency_s)
        self.kv_link_bw = hw.scaleout_bw if sim.cluster.kv_link == "scaleout" else hw.scaleup_bw
        self.weight_bytes = model.params_total * model.weight_bytes / max(pre.tp, 1)
        self.ttft_s, self.tpot_s = float(sim.slo.ttft_s), float(sim.slo.tpot_s)

    def decode_step_s(self, batch: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """Seconds of one decode step of `batch` requests reading `ctx` KV tokens each (arrays, any shape)."""
        b, k = np.broadcast_arrays(np.asarray(batch, float), np.asarray(ctx, float))
        out = np.empty(b.shape)
        f = self.dc.pass_time1
        for i, (bi, ki) in enumerate(zip(b.ravel(), k.ravel())):
            out.flat[i] = f(0.0, 0.0, bi, bi * ki, 0.0) if bi > 0 else 0.0
        return out


class DecodeTable:
    """The decode step time on a grid of batch sizes at one context, interpolated: the per-sub-step call is then one
    np.interp (the cost model is linear in the KV read, so the context enters as a linear correction)."""

    def __init__(self, rates: FluidRates, ctx_lo: float, ctx_hi: float):
        self.b = np.unique(np.round(np.geomspace(1, max(rates.batch_limit, 2), 64)))
        self.lo_ctx, self.hi_ctx = ctx_lo, max(ctx_hi, ctx_lo + 1.0)
        self.lo = rates.decode_step_s(self.b, ctx_lo)
        self.hi = rates.decode_step_s(self.b, self.hi_ctx)

        self._b, self._lo, self._hi = self.b.tolist(), self.lo.tolist(), self.hi.tolist()

    def __call__(self, batch: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        w = (ctx - self.lo_ctx) / (self.hi_ctx - self.lo_ctx)
        bb = np.maximum(batch, 1.0)
        return np.interp(bb, self.b, self.lo) * (1 - w) + np.interp(bb, self.b, self.hi) * w

    def one(self, batch: float, ctx: float) -> float:
        """__call__ on floats (np.interp's linear interpolation, clamped at the grid's ends)."""
        b = self._b
        x = batch if batch > 1.0 else 1.0
        j = bisect_right(b, x)
        if j >= len(b):
            lo, hi = self._lo[-1], self._hi[-1]
        else:
            f = (x - b[j - 1]) / (b[j] - b[j - 1])
            lo = self._lo[j - 1] + f * (self._lo[j] - self._lo[j - 1])
            hi = self._hi[j - 1] + f * (self._hi[j] - self._hi[j - 1])
        w = (ctx - self.lo_ctx) / (self.hi_ctx - self.lo_ctx)
        return lo * (1 - w) + hi * w


@dataclass
class FluidTotals:
    """What a run has resolved so far, per class (arrays of shape batch + (classes,))."""

    arrived: np.ndarray
    finished: np.ndarray
    good: np.ndarray  # finished meeting both SLOs
    ttft_ok: np.ndarray  # prefilled within the TTFT SLO (counted when the prefill ends)
    prefilled: np.ndarray
    rejected: np.ndarray


class FluidCluster:
    """The fluid state of one or many clusters (leading `shape`), each with `classes` request classes.

    step(arrivals, n_prefill, n_decode, dt) moves every cluster by dt seconds with that many serving instances;
    arrivals are requests per class during dt. Requests are conserved exactly: arrived = queued + waiting + decoding
    + finished + rejected (`in_system`). A prefill backlog above `max_wait_s` of the pool's work is rejected at
    arrival (load shedding: reason "queue"), so the state stays bounded in overload."""

    def __init__(self, rates: FluidRates, shape: tuple[int, ...] = (), max_wait_s: float = 60.0):
        self.r = rates
        self.shape = shape
        n = len(rates.names)
        z = lambda: np.zeros(shape + (n,))  # noqa: E731
        self.pq_req, self.pq_tok = z(), z()  # prefill backlog
        self.dq, self.dq_ok = z(), z()  # prefilled, waiting for a decode slot (of which met TTFT)
        self.dr, self.dr_ok = z(), z()  # decoding (of which met TTFT)
        self.totals = FluidTotals(z(), z(), z(), z(), z(), z())
        self.max_wait_s = max_wait_s
        ctx = rates.prompt_mean + rates.output_mean / 2  # mean context a decoding request of the class reads
        self.ctx = ctx
        self.kv_per_req = rates.prompt_mean + rates.output_mean  # KV a request reserves by its end (preempt-free)
        self.table = DecodeTable(rates, float(ctx.min()), float(ctx.max()))
        # the scalar path's constants as Python floats and lists
        self._pm, self._om = rates.prompt_mean.tolist(), rates.output_mean.tolist()
        self._ptok, self._ctx, self._kvr = rates.prefill_tok_s.tolist(), ctx.tolist(), self.kv_per_req.tolist()
        self._service = [s.tolist() for s in rates.service]
        self._out = [o.tolist() for o in rates.out_sorted]
        self._tau = np.ones(shape)  # mean seconds a request holds its decode slot, last sub-step (occupancy estimate)
        self.last_step_s = np.zeros(shape)  # the decode step time of the last sub-step (TPOT signal)
        self.last_wait_s = np.zeros(shape)  # the prefill queue wait of the last sub-step (TTFT signal)
        self.last_decode_tps = np.zeros(shape)  # output tokens / s of the decode pool (HeteroScale's signal)

    def in_system(self) -> np.ndarray:
        return self.pq_req + self.dq + self.dr

    def decode_slots(self, n_decode: np.ndarray) -> np.ndarray:
        """Requests a decode pool of `n_decode` instances holds at once: the batch limit, or the KV of the mix."""
        dr = self.dr.sum(-1) + self.dq.sum(-1)
        mix = np.where(dr[..., None] > 0, (self.dr + self.dq) / np.maximum(dr[..., None], 1e-12), 1.0 / self.dr.shape[-1])
        kv = (mix * self.kv_per_req).sum(-1)
        return n_decode * np.minimum(self.r.batch_limit, self.r.kv_tokens / kv)

    def _slots(self, held: list[float], n_decode: float) -> float:
        """decode_slots on floats, from the requests held (decoding + waiting) per class."""
        h = sum(held)
        kv = sum((x / h if h > 0 else 1.0 / len(held)) * k for x, k in zip(held, self._kvr))
        return n_decode * min(self.r.batch_limit, self.r.kv_tokens / kv)

    def slots_one(self, n_decode: float) -> float:
        """decode_slots of an unbatched cluster, as a float."""
        return self._slots([a + b for a, b in zip(self.dr.tolist(), self.dq.tolist())], n_decode)

    def step(self, arrivals: np.ndarray, n_prefill: np.ndarray, n_decode: np.ndarray, dt: float) -> np.ndarray:
        """Advance dt seconds; returns the good requests finished per class in this step."""
        if not self.shape:
            return self._step1(arrivals, float(n_prefill), float(n_decode), dt)
        r, t = self.r, self.totals
        n_p = np.asarray(n_prefill, float)
        n_d = np.asarray(n_decode, float)
        a = np.asarray(arrivals, float)
        t.arrived += a
        # prefill: backlog work in instance-seconds per class, served FCFS-fluid (every class the same fraction)
        work0 = (self.pq_tok / r.prefill_tok_s).sum(-1)
        cap = n_p * dt
        limit = np.maximum(n_p, 1e-9) * self.max_wait_s  # shed what would wait longer than max_wait_s
        new_work = (a * r.prompt_mean / r.prefill_tok_s).sum(-1)
        keep = np.clip((limit + cap - work0) / np.maximum(new_work, 1e-12), 0.0, 1.0)
        rej = a * (1 - keep[..., None])
        t.rejected += rej
        a = a - rej
        self.pq_req += a
        self.pq_tok += a * r.prompt_mean
        work = work0 + new_work * keep
        frac = np.minimum(1.0, cap / np.maximum(work, 1e-12))
        served = self.pq_req * frac[..., None]
        self.pq_req -= served
        self.pq_tok -= self.pq_tok * frac[..., None]
        # the wait of the served work: the mean of the backlog (in time) at the sub-step's start and end
        wait = (work0 + np.maximum(work - cap, 0.0)) / (2 * np.maximum(n_p, 1e-9))
        self.last_wait_s = wait
        ok = np.empty_like(served)
        budget = r.ttft_s - r.net_s - wait
        for i, s in enumerate(r.service):
            ok[..., i] = np.searchsorted(s, budget, side="right") / s.shape[0]
        served_ok = served * ok
        t.prefilled += served
        t.ttft_ok += served_ok
        # decode: a pool of `slots` requests at once (batch limit or KV), each holding its slot for O steps. Over dt
        # a slot serves several requests in turn, so completions are the unsaturated flow (every request in a slot,
        # the inflow spread over dt), scaled down to the slot-seconds the pool has
        slots = self.decode_slots(n_d)
        old = self.dr + self.dq
        old_ok = self.dr_ok + self.dq_ok
        total = old.sum(-1) + served.sum(-1)
        occ = np.minimum(slots, np.maximum(old.sum(-1), served.sum(-1) / dt * self._tau))  # Little: rate x time
        batch = occ / np.maximum(n_d, 1e-9)
        mix = old + served
        ctx = (mix * self.ctx).sum(-1) / np.maximum(total, 1e-12)
        step_s = np.where(n_d > 0, self.table(batch, np.where(total > 0, ctx, self.ctx[0])), np.inf)
        self.last_step_s = step_s
        tau = r.output_mean * step_s[..., None]  # seconds a request of the class holds its slot
        held = mix.sum(-1)
        self._tau = np.where((n_d > 0) & (held > 0), (tau * mix).sum(-1) / np.maximum(held, 1e-12), self._tau)
        x = dt / tau
        e = -np.expm1(-x)
        fin = old * e + served * np.where(x > 0, 1.0 - e / np.maximum(x, 1e-300), 0.0)
        # each completion held its slot tau: the flow may use at most slots x dt slot-seconds (else the pool runs full)
        used = (fin * tau).sum(-1)
        fin = fin * np.minimum(1.0, slots * dt / np.maximum(used, 1e-12))[..., None]
        ok_share = (old_ok + served_ok) / np.maximum(mix, 1e-12)
        fin_ok = fin * ok_share
        rest = mix - fin
        rest_ok = (old_ok + served_ok) - fin_ok
        keep = np.minimum(1.0, slots / np.maximum(rest.sum(-1), 1e-12))[..., None]
        self.dr, self.dr_ok = rest * keep, rest_ok * keep
        self.dq, self.dq_ok = rest - self.dr, rest_ok - self.dr_ok
        self.last_decode_tps = np.where(n_d > 0, occ / step_s, 0.0)
        # TPOT: the step time plus the wait for a slot (Little: waiting / completions per s) over the output's tokens
        waiting = self.dq.sum(-1)
        dwait = np.where(waiting > 1e-9, waiting * dt / np.maximum(fin.sum(-1), 1e-9), 0.0)
        need = np.where(r.tpot_s > step_s, dwait / np.maximum(r.tpot_s - step_s, 1e-12) + 1.0, np.inf)
        tok_ok = np.empty_like(fin)
        for i, o in enumerate(r.out_sorted):  # outputs long enough that the wait spread over them fits
            tok_ok[..., i] = 1.0 - np.searchsorted(o, need, side="left") / o.shape[0]
        good = fin_ok * tok_ok
        t.finished += fin
        t.good += good
        return good

    def _step1(self, arrivals, n_p: float, n_d: float, dt: float) -> np.ndarray:
        """`step` of one cluster on Python floats (the env's path: NumPy's per-call overhead on two-element arrays was
        most of a step): the same operations in the same order (tests/test_capacity_fluid.py compares the two)."""
        r, t, C = self.r, self.totals, range(len(self.r.names))
        a = [float(x) for x in arrivals]
        pm, ptok, om = self._pm, self._ptok, self._om
        pq_req, pq_tok = self.pq_req.tolist(), self.pq_tok.tolist()
        work0 = sum(pq_tok[i] / ptok[i] for i in C)
        cap = n_p * dt
        limit = max(n_p, 1e-9) * self.max_wait_s
        new_work = sum(a[i] * pm[i] / ptok[i] for i in C)
        keep = min(max((limit + cap - work0) / max(new_work, 1e-12), 0.0), 1.0)
        rej = [x * (1 - keep) for x in a]
        a = [a[i] - rej[i] for i in C]
        pq_req = [pq_req[i] + a[i] for i in C]
        pq_tok = [pq_tok[i] + a[i] * pm[i] for i in C]
        work = work0 + new_work * keep
        frac = min(1.0, cap / max(work, 1e-12))
        served = [x * frac for x in pq_req]
        pq_req = [pq_req[i] - served[i] for i in C]
        pq_tok = [x - x * frac for x in pq_tok]
        wait = (work0 + max(work - cap, 0.0)) / (2 * max(n_p, 1e-9))
        budget = r.ttft_s - r.net_s - wait
        served_ok = [served[i] * bisect_right(self._service[i], budget) / len(self._service[i]) for i in C]
        dr, dq, dr_ok, dq_ok = self.dr.tolist(), self.dq.tolist(), self.dr_ok.tolist(), self.dq_ok.tolist()
        old = [dr[i] + dq[i] for i in C]
        slots = self._slots(old, n_d)
        old_ok = [dr_ok[i] + dq_ok[i] for i in C]
        total = sum(old) + sum(served)
        occ = min(slots, max(sum(old), sum(served) / dt * float(self._tau)))
        batch = occ / max(n_d, 1e-9)
        mix = [old[i] + served[i] for i in C]
        ctx = sum(mix[i] * self._ctx[i] for i in C) / max(total, 1e-12)
        step_s = self.table.one(batch, ctx if total > 0 else self._ctx[0]) if n_d > 0 else math.inf
        tau = [om[i] * step_s for i in C]
        held = sum(mix)
        if n_d > 0 and held > 0:
            self._tau = np.asarray(sum(tau[i] * mix[i] for i in C) / max(held, 1e-12))
        fin = []
        for i in C:
            x = dt / tau[i]
            e = -math.expm1(-x)
            fin.append(old[i] * e + served[i] * ((1.0 - e / max(x, 1e-300)) if x > 0 else 0.0))
        used = sum(fin[i] * tau[i] for i in C)
        scale = min(1.0, slots * dt / max(used, 1e-12))
        fin = [x * scale for x in fin]
        fin_ok = [fin[i] * ((old_ok[i] + served_ok[i]) / max(mix[i], 1e-12)) for i in C]
        rest = [mix[i] - fin[i] for i in C]
        rest_ok = [(old_ok[i] + served_ok[i]) - fin_ok[i] for i in C]
        keep = min(1.0, slots / max(sum(rest), 1e-12))
        dr = [x * keep for x in rest]
        dr_ok = [x * keep for x in rest_ok]
        waiting = sum(rest[i] - dr[i] for i in C)
        dwait = waiting * dt / max(sum(fin), 1e-9) if waiting > 1e-9 else 0.0
        need = dwait / max(r.tpot_s - step_s, 1e-12) + 1.0 if r.tpot_s > step_s else math.inf
        good = np.array([fin_ok[i] * (1.0 - bisect_left(self._out[i], need) / len(self._out[i])) for i in C])
        self.pq_req, self.pq_tok = np.array(pq_req), np.array(pq_tok)
        self.dr, self.dr_ok = np.array(dr), np.array(dr_ok)
        self.dq = np.array([rest[i] - dr[i] for i in C])
        self.dq_ok = np.array([rest_ok[i] - dr_ok[i] for i in C])
        self.last_wait_s, self.last_step_s = np.asarray(wait), np.asarray(step_s)
        self.last_decode_tps = np.asarray(occ / step_s if n_d > 0 else 0.0)
        t.arrived += arrivals
        t.rejected += rej
        t.prefilled += served
        t.ttft_ok += served_ok
        t.finished += fin
        t.good += good
        return good

    def fail_decode(self, share: np.ndarray) -> None:
        """A decode instance holding `share` of the pool fails: its requests lose their KV and prefill again."""
        share = np.asarray(share, float)[..., None]
        for q, qok in ((self.dr, self.dr_ok),):
            back = q * share
            q -= back
            qok -= qok * share
            self.pq_req += back
            self.pq_tok += back * self.r.prompt_mean

    def drain_rest(self) -> None:
        """End of a run: whatever is still in the system is rejected (reason "horizon"), so finished + rejected =
        arrived."""
        rest = self.in_system()
        self.totals.rejected += rest
        for x in (self.pq_req, self.pq_tok, self.dq, self.dq_ok, self.dr, self.dr_ok):
            x[...] = 0.0


def stationary(rates: FluidRates, rate: np.ndarray, n_prefill: int, n_decode: int, duration_s: float,
               dt: float = 1.0, drain_s: float = 600.0) -> dict:
    """A fixed split under constant per-class arrival rates for `duration_s`, then drained without arrivals (as an
    engine run that resolves every request): the figures the calibration compares with the engine's summary
    (throughput: requests finished while arrivals last, per second; attainment: of all finished requests)."""
    fl = FluidCluster(rates)
    a = np.asarray(rate, float) * dt
    t = 0.0
    while t < duration_s - 1e-9:
        fl.step(a, n_prefill, n_decode, dt)
        t += dt
    in_window = float(fl.totals.finished.sum())
    zero = np.zeros_like(a)
    end = t + drain_s
    while t < end and fl.in_system().sum() > 1e-6 * max(fl.totals.arrived.sum(), 1.0):
        fl.step(zero, n_prefill, n_decode, dt)
        t += dt
    tot = fl.totals
    fin = float(tot.finished.sum())
    return {"throughput_rps": in_window / duration_s, "slo_attainment": float(tot.good.sum()) / max(fin, 1e-12),
            "slo_ttft_attainment": float(tot.ttft_ok.sum()) / max(float(tot.prefilled.sum()), 1e-12),
            "rejected": float(tot.rejected.sum()), "makespan_s": t}
