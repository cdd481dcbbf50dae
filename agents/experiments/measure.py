"""Measurements shared by several reproductions (one module instead of reproductions importing each other).

Prefill side (sbs_ttft, pbaa_util): one policy at one Poisson rate averaged over seeds, the largest rate
meeting a mean-TTFT target (bisection), a load sweep and its ratio columns. Decode side (br_imbalance,
iqr_band): a decode tier resized to N workers, its measured capacity, one router's run with figures over
the loaded window, and the per-worker KV figure.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from pdgym.baselines import make_policy
from pdgym.envs.sim import SimResult, Simulator, simulate
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.cost import kv_capacity_tokens
from pdgym.envs.sim.events import PassKind
from pdgym.envs.sim.hardware import load_hardware
from pdgym.envs.sim.models import load_model
from pdgym.envs.sim.observers import Observer
from pdgym.envs.sim.policy import DecodeRouter
from pdgym.envs.sim.safe_files import save_figure
from pdgym.envs.sim.workload import make_workload
from tqdm import tqdm

# --------------------------------------------------------------------------- prefill: rates and loads
METRICS = ("ttft_mean", "ttft_p50", "ttft_p99", "device_queue_s", "sched_queue_s", "chunk_util_mean", "rejected",
           "finished")


def workload_lengths(sim_cfg, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) token counts of the run's requests, as the simulator draws them (for regime checks)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short trace says so once, when the reproduction runs
        wl = make_workload(sim_cfg.workload, np.random.default_rng(seed))
    return np.asarray(wl.prompt), np.asarray(wl.output)


def at_rate(sim_cfg, rate: float, num_requests: int):
    return dataclasses.replace(sim_cfg, workload=dataclasses.replace(sim_cfg.workload, rate=float(rate),
                                                                     num_requests=int(num_requests)))


def run_point(sim_cfg, spec, rate: float, num_requests: int, seeds) -> dict:
    """Seed-averaged summary metrics (+ TTFT spread, prefill pass-time mean and CV) of one policy at one rate."""
    rows = []
    for seed in seeds:
        pol = make_policy("prefill", spec)
        res = simulate(at_rate(sim_cfg, rate, num_requests), {"prefill": pol}, int(seed))
        m = res.summary()
        fin = res.requests[res.requests.status == "finished"]
        dur = res.steps.loc[res.steps.kind == PassKind.PREFILL, "dur"]
        st = getattr(pol, "stats", {})
        n_rel = max(int(st.get("releases", 0)), 1)
        rows.append({**{k: m[k] for k in METRICS}, "ttft_std": float(fin.ttft.std()),
                     "pass_s": float(dur.mean()) if len(dur) else np.nan,
                     "pass_cv": float(dur.std() / dur.mean()) if len(dur) else np.nan,
                     "late_ms": 1e3 * st["late_s"] / n_rel if "late_s" in st else np.nan,
                     "busy_target": st["busy_target"] / n_rel if "busy_target" in st else np.nan})
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def full_pass_s(sim_cfg) -> float:
    """The cost model's time for a prefill pass with every DP unit carrying a full chunk (fresh prompts)."""
    P0 = Simulator(sim_cfg, None, 0).prefill[0]
    full = np.full(P0.dp, float(P0.chunk_tokens))
    z = np.zeros(P0.dp)
    return float(P0.cost.pass_time(full, full * full / 2, z, z))


def over_chunk(sim_cfg, seed: int = 0) -> tuple[str, float]:
    """(quantity, value) of the short-prompt regime that SBS's and PBAA's claims share: the share of the run's
    prompts longer than the prefill chunk (such a prompt runs on in continuation passes, one DP unit busy)."""
    prompts, _ = workload_lengths(sim_cfg, seed)
    chunk = sim_cfg.cluster.prefill.chunk_tokens
    return f"share of prompts longer than the {chunk}-token chunk", float(np.mean(prompts > chunk))


def full_chunk_rate(sim_cfg) -> float:
    """Requests per second the prefill instances serve if every pass is full (`full_pass_s`), at the
    workload's mean prompt: the cost model's own capacity figure."""
    P = sim_cfg.cluster.prefill
    prompts, _ = workload_lengths(sim_cfg)
    return P.count * P.dp * P.chunk_tokens / full_pass_s(sim_cfg) / float(prompts.mean())


def prefill_capacity(sim_cfg, spec, num_requests: int, seeds, overload: float = 1.5) -> float:
    """Requests per second a prefill policy serves under sustained overload (seed mean): Poisson arrivals at
    `overload` x the full-chunk rate (`full_chunk_rate`), and the prefill tokens of the passes that start in the
    middle half of the arrival period, per second, over the run's prefill tokens per request. Tokens, not
    completions: a policy that takes long prompts first, as PBAA does from a deep buffer, would read fast or
    slow by its order. Arrivals, not a burst: a release rule without a capacity model (SBS's first-fit and
    round-robin ablations) sends a burst's whole buffer to one instance and leaves the others idle, which
    says nothing of its steady state. A rate above this has no steady state: its backlog grows for as long as
    arrivals last, so a finite run can still meet a mean-TTFT target there by ending before the backlog is
    seen (`peak_rate` alone)."""
    cfg = at_rate(sim_cfg, overload * full_chunk_rate(sim_cfg), num_requests)
    rates = []
    for seed in seeds:
        res = simulate(cfg, {"prefill": make_policy("prefill", spec)}, int(seed))
        passes = res.steps[res.steps.kind == PassKind.PREFILL]
        span = float(res.requests.arrival.max())
        lo, hi = 0.25 * span, 0.75 * span
        tokens = passes.tokens[(passes.t >= lo) & (passes.t < hi)].sum()
        rates.append(float(tokens / (hi - lo)) / float(passes.tokens.sum() / len(res.requests)))
    return float(np.mean(rates))


MAX_DOUBLINGS = 8


def bracketed(rate: float, rate_hi: float) -> bool:
    """False when `peak_rate` stopped doubling without finding a violating rate (the run is too short), or
    found no rate that meets the target (0: even the floor halved MAX_DOUBLINGS times misses it)."""
    return 0 < rate < rate_hi * 2 ** (MAX_DOUBLINGS - 1)


def peak_rate(sim_cfg, spec, target_s: float, num_requests: int, seeds, lo: float, hi: float,
              iters: int = 10, max_reject: float = 0.01, max_doublings: int = MAX_DOUBLINGS) -> float:
    """Largest rate whose seed-mean TTFT stays <= target_s (and rejections <= max_reject), by bisection.

    `hi` is doubled until it violates the target (at most `max_doublings` times: a run too short to
    overload returns its last `hi`, which the caller's regime check flags). A `lo` that already violates
    it (a workload heavier than the one `lo` was set for, e.g. another trace) is halved until it meets
    it; 0.0 when none does (flagged the same way, see `bracketed`).
    """

    def ok(rate: float) -> bool:
        m = run_point(sim_cfg, spec, rate, num_requests, seeds)
        return m["ttft_mean"] <= target_s and m["rejected"] <= max_reject * num_requests

    if not ok(lo):
        for _ in range(max_doublings):
            lo, hi = lo / 2, lo
            if ok(lo):
                break
        else:
            return 0.0
    else:
        for _ in range(max_doublings):
            if not ok(hi):
                break
            lo, hi = hi, hi * 2
        else:
            return lo
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def load_sweep(sim_cfg, specs: dict, peak: float, loads, num_requests: int, seeds, desc: str) -> pd.DataFrame:
    rows = []
    for load in tqdm(list(loads), desc=desc, leave=False):
        for label, spec in specs.items():
            m = run_point(sim_cfg, spec, load * peak, num_requests, seeds)
            rows.append({"load": float(load), "rate": load * peak, "policy": label, **m})
    return pd.DataFrame(rows)


def ratios(table: pd.DataFrame, a: str, b: str, col: str) -> list[float]:
    t = table.pivot(index="load", columns="policy", values=col)
    return (t[a] / t[b]).round(4).tolist()


def col(table: pd.DataFrame, policy: str, name: str) -> list[float]:
    return table[table.policy == policy].sort_values("load")[name].round(4).tolist()


# --------------------------------------------------------------------------- decode: tiers and routers
class KVRecorder(Observer):
    """Keeps, for every step of decode instance `inst`, the worker-KV vector at the step's start and the pool
    left after the router's admissions (the regime: a saturated tier always has a pool to choose from)."""

    def __init__(self, inst: int = 0):
        self.inst = inst
        self.kv: list[np.ndarray] = []
        self.pool: list[int] = []

    def on_pass_start(self, sim, p):
        if p.kind == PassKind.DECODE and p.inst == self.inst:
            self.kv.append(p.decode_kv.copy())
            self.pool.append(len(sim.pool))


def tier(sim_cfg, n: int | None = None, rate: float | None = None, oracle: bool | None = None,
         num_requests: int | None = None, scale_prefill: bool = False):
    """The tier config with N workers (EP N x tp), an arrival rate, the oracle flag and a request count.
    `scale_prefill`: prefill instances grow with N (ceil(count x N / the scenario's N), never fewer), so the side
    that feeds the pool grows with the decode tier and a larger N is not starved. A tier of N workers that
    cannot hold the model's weights gets the smallest worker that can (`holding_worker`)."""
    cl, wl = sim_cfg.cluster, sim_cfg.workload
    if n is not None:
        if scale_prefill:
            count = max(cl.prefill.count, math.ceil(cl.prefill.count * n / cl.decode.dp))
            cl = dataclasses.replace(cl, prefill=dataclasses.replace(cl.prefill, count=count))
        tp = holding_worker(sim_cfg, n)
        cl = dataclasses.replace(cl, decode=dataclasses.replace(cl.decode, dp=n, tp=tp, ep=n * tp))
    if rate is not None:
        wl = dataclasses.replace(wl, rate=float(rate))
    if num_requests is not None:
        wl = dataclasses.replace(wl, num_requests=int(num_requests))
    out = dataclasses.replace(sim_cfg, cluster=cl, workload=wl)
    return dataclasses.replace(out, oracle=oracle) if oracle is not None else out


def holding_worker(sim_cfg, n: int) -> int:
    """Attention TP per decode worker for a tier of `n` workers: the scenario's, doubled until the weights fit
    (EP n x tp). DeepSeek-V3 on 4 Ascend 910C at EP 4 needs 181 GB per device of 115 usable, so BalanceRoute's
    N = 4 tier runs 4 workers of 2 NPUs each (SGLang `--tp 8 --dp 4 --enable-dp-attention`)."""
    dec = sim_cfg.cluster.decode
    if dec.kv_capacity_tokens is not None:
        return dec.tp
    hw, model = load_hardware(sim_cfg.hardware), load_model(sim_cfg.model)
    tp = dec.tp
    for _ in range(8):
        inst = dataclasses.replace(dec, dp=n, tp=tp, ep=n * tp)
        try:
            kv_capacity_tokens(hw, model, inst)
            return tp
        except ConfigError:
            tp *= 2
    return dec.tp  # nothing fits: the engine's own check names the key


@dataclasses.dataclass(frozen=True)
class TierCapacity:
    """What one calibration burst measured (see `tier_capacity`)."""

    decode_rps: float  # requests per second the decode tier sustains (least-KV router)
    prefill_rps: float  # requests per second one prefill instance feeds
    full_share: float  # share of the burst's measured decode steps with >= 90% of the slots busy
    bursts: int = 1  # calibration bursts run (`saturated`)
    converged: bool = True  # the last burst added no prefill instance (the fixed point was reached)


def tier_capacity(sim_cfg, seed: int) -> TierCapacity:
    """Decode requests per second the least-KV router sustains, and prefill requests per second per instance.

    Decode: output tokens per second while the whole workload, arriving at once, keeps the tier full (steps
    between the 20% and 80% completion times with at least 90% of the slots busy, when there are enough of
    them), over the mean output length. Prefill: prompt tokens per second of prefill pass time in the same
    burst (every instance has a queue), over the mean prompt length: what one instance can feed."""
    burst = dataclasses.replace(sim_cfg, workload=dataclasses.replace(
        sim_cfg.workload, arrival="poisson", rate=1e6, time_scale=None))
    sim = Simulator(burst, {"decode": make_policy("decode", "least_kv")}, seed)
    sim.run()
    f = np.sort(sim.req.finish[sim.req.state == R.FINISHED])
    lo, hi = f[int(0.2 * len(f))], f[int(0.8 * len(f)) - 1]
    steps = SimResult(sim).steps
    st = steps[(steps.kind == PassKind.DECODE) & (steps.t >= lo) & (steps.t <= hi)]
    d = sim.decode[0]
    full = st[st.reqs >= 0.9 * d.dp * d.batch_limit]  # the tier's capacity is its rate when full, not while
    share = len(full) / max(len(st), 1)
    st = full if share >= 0.1 else st  # a prefill-bound burst trickles requests in
    decode = float(st.reqs.sum() / st.dur.sum()) / float(sim.req.output.mean())
    pre = steps[steps.kind == PassKind.PREFILL]
    prefill = float(pre.tokens.sum() / pre.dur.sum()) / float(sim.req.prompt.mean()) if len(pre) else math.inf
    return TierCapacity(decode, prefill, share)


def fed(sim_cfg, rate: float, prefill_rps: float, margin: float):
    """The tier with enough prefill instances that their capacity is `margin` x the arrival rate (never fewer
    than it has): a decode tier is saturated only if the side that fills its pool keeps ahead of it."""
    cl = sim_cfg.cluster
    need = math.ceil(margin * rate / prefill_rps) if math.isfinite(prefill_rps) and prefill_rps > 0 else 0
    if need <= cl.prefill.count:
        return sim_cfg
    return dataclasses.replace(sim_cfg, cluster=dataclasses.replace(
        cl, prefill=dataclasses.replace(cl.prefill, count=need)))


def saturated(sim_cfg, load: float, margin: float, seed: int, rounds: int = 12) -> tuple:
    """The tier at `load` x its decode capacity, with prefill capacity `margin` x that rate: (config, capacity).

    Calibrated to a fixed point: a burst whose prefill cannot keep the decode slots full measures the decode
    tier part-empty, so its capacity reads low; the prefill is grown to feed the rate that reading gives and
    the burst is run again, until no instance is added (at most `rounds` bursts; `converged` says whether the
    last one added none). One burst alone left the Ascend 910C tier at N = 32 with 8 prefill instances in
    calibration: capacity 7.5 requests/s per worker (8.4 at N = 16), a rate the tier kept up with, and a pool
    empty on every loaded step. Each burst grows the prefill by at most load x margin, so a tier that starts
    far from its fixed point needs many: on the Azure code trace the H800 tier at N = 16 took 8 bursts (4 to
    28 instances), past the 5 this loop used to stop at, which had left it part-empty and flagged. A trace
    too short to fill the tier never settles (Azure code at N = 32: 5,291 requests for 2,048 slots)."""
    cap = None
    for burst in range(1, rounds + 1):
        cap = tier_capacity(sim_cfg, seed)
        grown = fed(sim_cfg, load * cap.decode_rps, cap.prefill_rps, margin)
        done = grown.cluster.prefill.count == sim_cfg.cluster.prefill.count
        cap = dataclasses.replace(cap, bursts=burst, converged=done)
        if done:
            break
        sim_cfg = grown
    return tier(sim_cfg, rate=load * cap.decode_rps), cap


class TimedRouter(DecodeRouter):
    """A decode router whose route() calls are timed, with the simulated time of each: BalanceRoute's claim
    that dispatch costs far less than a decode step (ALGORITHMS.md s6: under 1 ms in Python per step at
    N = 32 with a pool of a few hundred). Timing changes nothing the router decides."""

    def __init__(self, inner: DecodeRouter):
        self.inner, self.name = inner, inner.name
        self.calls: list[tuple[float, float]] = []  # (simulated time, wall seconds) per call

    def reset(self, sim) -> None:
        self.inner.reset(sim)

    def route(self, sim, inst: int) -> None:
        t0 = time.perf_counter()
        self.inner.route(sim, inst)
        self.calls.append((sim.now, time.perf_counter() - t0))

    def on_timer(self, sim, tag) -> None:
        self.inner.on_timer(sim, tag)


def run_router(sim_cfg, spec, seed: int, window_start: float, trace_at: float = 0.7, trace_steps: int = 0) -> dict:
    """One run; figures over the loaded window (module doc). `trace_steps` steps of per-worker KV from the
    arrival of the `trace_at` quantile request are returned under "kept". `route_ms`: the router's mean wall
    time per decision over the window (this machine's; the claim is relative to a decode step, `step_ms`)."""
    needs_oracle = isinstance(spec, dict) and spec.get("predictor") == "oracle"
    cfg = dataclasses.replace(sim_cfg, oracle=True) if needs_oracle else sim_cfg
    router = make_policy("decode", copy.deepcopy(spec))
    timed = TimedRouter(router)
    sim = Simulator(cfg, {"decode": timed}, seed)
    rec = KVRecorder(0)
    sim.observe(rec)
    sim.run()
    res = SimResult(sim)
    s = res.summary()
    dec = res.steps[(res.steps.kind == PassKind.DECODE) & (res.steps.inst == 0)].reset_index(drop=True)
    kv = np.asarray(rec.kv, dtype=np.float64)
    arr = np.sort(sim.req.arrival)
    lo, hi = arr[int(window_start * (len(arr) - 1))], arr[-1]
    w = ((dec.t >= lo) & (dec.t <= hi)).to_numpy()
    win = dec[w]
    first = int(np.searchsorted(dec.t.to_numpy(), arr[int(trace_at * (len(arr) - 1))]))
    pool = np.asarray(rec.pool, dtype=np.float64)[w]
    calls = np.asarray(timed.calls, dtype=np.float64).reshape(-1, 2)
    route_s = calls[(calls[:, 0] >= lo) & (calls[:, 0] <= hi), 1]
    return {"imbalance": float((win.kv_max - win.kv_min).mean()), "tput": float(win.reqs.sum() / win.dur.sum()),
            "kv_std": float(kv[w].std(axis=1).mean()), "kv_max": float(win.kv_max.mean()),
            "step_ms": 1e3 * float(win.dur.mean()), "batch_mean": float(win.reqs.mean() / kv.shape[1]),
            "window_steps": int(w.sum()), "imbalance_all": s["imbalance_mean"], "tput_all": s["throughput_tok_s"],
            "tpot_p95": s["tpot_p95"], "ttft_mean": s["ttft_mean"], "finished": s["finished"],
            "rejected": s["rejected"], "pool_mean": float(pool.mean()) if len(pool) else float("nan"),
            "empty_pool_frac": float((pool == 0).mean()) if len(pool) else float("nan"),
            "slot_occupancy": float(win.reqs.mean() / (kv.shape[1] * sim.decode[0].batch_limit)),
            "route_ms": 1e3 * float(route_s.mean()) if len(route_s) else float("nan"),
            **overflow(router), "kept": kv[first:first + trace_steps]}


def overflow(router) -> dict:
    """BalanceRoute's admissions past today's margin, over the whole run (its `stats`; NaN for other routers):
    the share of picks that overflow and the tokens of overflow per pick."""
    st = getattr(router, "stats", None)
    if not st or "overflow_tokens" not in st:
        return {"overflow_share": float("nan"), "overflow_per_pick": float("nan")}
    picks = max(st["picks"], 1)
    return {"overflow_share": st["overflow_picks"] / picks, "overflow_per_pick": st["overflow_tokens"] / picks}


def plot_traces(traces: dict[str, np.ndarray], path: Path, title: str) -> None:
    """Per-worker KV over a window of steps, one panel per router: a line per worker and the +-1 sigma band."""
    traces = {k: v for k, v in traces.items() if len(v)}
    if not traces:
        return
    cols = 2
    rows = (len(traces) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.3 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, (name, kv) in zip(axes.ravel(), traces.items()):
        x = np.arange(kv.shape[0])
        ax.plot(x, kv / 1e3, lw=0.5, alpha=0.6)
        mu, sd = kv.mean(axis=1) / 1e3, kv.std(axis=1) / 1e3
        ax.fill_between(x, mu - sd, mu + sd, color="k", alpha=0.15, lw=0)
        ax.set_title(f"{name}: mean max-min {np.mean(kv.max(1) - kv.min(1)) / 1e3:.1f}k", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(traces):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("worker KV (k tokens)")
    for ax in axes[-1]:
        ax.set_xlabel("decode step")
    fig.suptitle(f"per-worker KV load ({title}); grey: mean +- 1 sigma", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
