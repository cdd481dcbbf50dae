"""Forward-pass time models: one pass's work per DP unit -> seconds.

Every model sees the same four float vectors of length `dp` (one entry per DP unit):
prefill tokens, prefill attention token-pairs, decode requests and the KV tokens those
decodes read. The instance's pass time is the barrier: the slowest unit sets it, so
`pass_time` returns fixed costs + max over units, and records how long the other
units sat idle (`last_idle_frac`). `pass_time` is the simulator's inner loop: each
model precomputes its constants in __init__ and spends a few NumPy ops per call.

Kinds (`cost.kind`): roofline (default), linear (the EB form), piecewise_linear (the
batching study's service curve), table (measured timings from a CSV).
"""

from __future__ import annotations

import abc
import csv
import dataclasses
import io
import math
import numbers
import types
import warnings
from collections.abc import Callable, Mapping

import numpy as np

from . import compiled, safe_files
from .config import CostConfig, InstanceConfig
from .hardware import HardwareProfile
from .models import ModelProfile
from .notices import CostWarning
from .registry import Registry
from .validation import ConfigError, check, check_choice, check_params

Q_TILE = 128  # query rows per attention tile: a prefill chunk re-reads its KV context once per tile
ACT_BYTES = 8  # residual-stream traffic per token, layer and hidden element: 2 reads + 2 writes in BF16
COMBINE_BYTES = 2  # EP combine travels in BF16; dispatch in the weight dtype (FP8 for FP8 models)
ENGINE_KERNELS = ("mfu", "mbu", "pass_overhead_s")  # hardware fields an instance's engine may set (InstanceConfig)

# Published EB calibration, H200 + Qwen3-8B (ALGORITHMS.md s5). a_mb and b_kv were not
# published: with kind=linear they are fitted from the roofline of the configured hardware.
EB_H200_QWEN3_8B = types.MappingProxyType({
    "a_p": 1.279e-3, "b_p": 2.485e-5, "a_d": 8.921e-3, "b_d": 4.586e-5,
    "c0": 2.494e-5, "c1": 5.193e-5, "c2": 1.478e-5,
})

DEFAULT_MEAN_PROMPT = 1024.0  # prompt and decode-context lengths the linear fit assumes unless
DEFAULT_MEAN_CTX = 1024.0  # cost.params.mean_prompt / mean_ctx say otherwise


class CostModel(abc.ABC):
    """Time of one forward pass of an instance with `dp` barrier-synchronised DP units."""

    last_idle_frac: float = 0.0  # mean over units of (max_unit - unit) / max_unit, last call
    last_unit: np.ndarray | None = None  # per-unit compute seconds of the last call (before the barrier max)
    decode_kernel: Callable | None = None  # engine=numba: (reqs, kv) -> a decode-only pass_time (compiled.py)
    prefill_kernel: Callable | None = None  # engine=numba: (tokens, attn) -> a prefill-only pass_time

    def __init__(self, dp: int):
        self.dp = dp
        self._ones = np.ones(dp)  # x.dot(ones) is the cheapest sum of a small vector

    @abc.abstractmethod
    def pass_time(self, prefill_tokens: np.ndarray, prefill_attn: np.ndarray,
                  decode_reqs: np.ndarray, decode_kv: np.ndarray) -> float:
        """Seconds for one pass; each argument has one entry per DP unit, all >= 0.

        prefill_attn[d] = sum over the prompt pieces on unit d of
        piece_len * (prior_context + piece_len / 2); decode_kv[d] = KV tokens read by
        the decode_reqs[d] requests (one new token each).
        """

    def _barrier(self, unit: np.ndarray) -> float:
        self.last_unit = unit
        mx = float(unit.max())
        self.last_idle_frac = 1.0 - float(unit.dot(self._ones)) / (mx * self.dp) if mx > 0 else 0.0
        return mx


# --------------------------------------------------------------------------- roofline
class RooflineCost(CostModel):
    """Per device of each unit: max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth).

    pass = pass_overhead_s + max over units (barrier) + communication (EP all-to-all
    and TP all-reduce, paid for the unit with the most tokens: every unit waits for it).
    An all-zero pass costs pass_overhead_s: an empty step still launches.

    FLOPs: 2 x params per token (non-routed / tp, plus top-k routed experts) + attention
    4 x layers x heads x width per token-pair (width = head_dim; MLA decode attends over
    the cached latent, absorbed). Bytes: non-routed weights / tp (if the unit has work),
    routed experts actually touched on the device, KV read / written (a prefill piece
    re-reads its context once per Q_TILE query rows), activations. Weights run at FP8
    FLOP/s when the model is served in FP8 and the device has FP8; attention products always at BF16.

    Expert parallelism (ep > tp): routed experts are spread over the whole EP group, so
    each device's expert work follows the instance's mean tokens per unit (balanced
    routing) and a unit without tokens still does it; the imbalance the barrier sees
    comes from attention and the non-routed weights. With ep <= tp each unit holds
    every expert (sharded by tp) and its expert work follows its own tokens.

    mfu, mbu and pass_overhead_s are the engine's kernels: the instance's (cluster.*.mfu, ...) where set, else
    the hardware profile's.

    Mixed-batch interference: a unit that runs prefill and decode in one batch pays
    interference x its decode KV-read time on top (cluster.*.interference, the engine's; else
    hw.interference, the EB study's engine on that GPU) (the decode attention runs as a
    separate, poorly overlapped phase beside compute-bound prefill). The term grows
    with the decode share r and with 1 / bandwidth. Calibration (tests/test_cost.py):
    qwen3_8b, dp=1, a mixed batch of T = 2048 tokens, r*T decodes of 1000 KV tokens each
    plus (1-r)*T prefill tokens from 1000-token prompts (attention pairs = 500 per token);
    m(r) = pass_time / T against pure decode d = pass_time(256 decodes x 1000 KV) / 256;
    the crossover m(r*) = d lies in [0.1, 0.35] on rtx_pro_6000 and [0.65, 0.95] on
    h200 (EB study: about 0.2 and 0.8). Those two profiles' interference (2.17, 0.95)
    put r* at 0.20 and 0.80; the others follow 0.95 * (4.8 TB/s / hbm_bw)^0.84.
    """

    def __init__(self, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig):
        super().__init__(inst.dp)
        hw = engine_hardware(hw, inst)
        tp, ep = inst.tp, inst.ep
        flops = hw.flops_fp8 if model.weight_bytes <= 1 and hw.flops_fp8 > 0 else hw.flops_bf16
        f = flops * hw.mfu
        b = hw.hbm_bw * hw.mbu
        wb = model.weight_bytes
        kvb = model.kv_bytes_per_token / _kv_shards(model, tp)
        moe = model.num_experts > 0
        k, n_exp = model.experts_per_token, model.num_experts
        expert_flops = 2.0 * model.expert_params * model.moe_layers * k  # per token
        self._shared = moe and ep > tp
        self._moe_local = moe and not self._shared
        # Attention products (QK^T, PV) run in BF16 even when the weights are FP8: FlashAttention / FlashMLA,
        # the kernels FP8 engines use, keep attention in BF16 (FlashMLA: 580 TFLOP/s compute-bound on an H800,
        # 0.59 of the BF16 peak). Measured 2026-11-26 on an H200 (data/calibration/h200_ds_v3_prefill_slice.csv):
        # the attention of a DS-V3 prefill layer takes the same time with FP8 and with BF16 projections.
        attn = 4.0 * model.layers * model.num_heads / tp / (hw.flops_bf16 * hw.mfu)
        shard = max(ep, tp)

        # Per-unit coefficients as length-dp vectors: array * array is the cheapest NumPy op.
        def vec(x: float) -> np.ndarray:
            return np.full(self.dp, x)

        self._c_tok = vec((2.0 * model.nonrouted_params + (expert_flops if self._moe_local else 0.0)) / tp / f)
        self._c_pa = vec(attn * model.head_dim)
        self._c_dk = vec(attn * (model.kv_width if model.attention == "mla" else model.head_dim))
        self._m_tok = vec((kvb + ACT_BYTES * model.layers * model.hidden) / b)
        self._m_pa = vec(kvb / Q_TILE / b)
        self._m_dk = vec(kvb / b)
        self._m_w = vec(model.nonrouted_params * wb / tp / b)
        self._exp_read = n_exp / shard * model.expert_params * model.moe_layers * wb / b if moe else 0.0
        self._exp_rate = k * (shard / tp) / n_exp if moe else 0.0  # P(expert touched) = 1 - exp(-rate tok)
        self._exp_c = expert_flops / tp / f
        itf = hw.interference if inst.interference is None else inst.interference  # engine's choice first
        self._interf = vec(itf * kvb / b) if itf > 0 else None
        self._overhead = hw.pass_overhead_s

        comm = 0.0  # seconds per token of the busiest unit
        if moe and ep > 1:
            copies = (ep - 1) * (1.0 - (1.0 - 1.0 / ep) ** k)  # distinct remote devices per token
            per_tok = model.moe_layers * model.hidden * ((1.0 if wb <= 1 else 2.0) + COMBINE_BYTES) * copies
            comm += per_tok / tp / _link_bw(hw, ep)
        if tp > 1:  # ring all-reduce after attention, and after every FFN that is not an EP MoE
            n_ar = 2 * model.layers - (model.moe_layers if moe and ep > 1 else 0)
            comm += n_ar * model.hidden * 2.0 * 2.0 * (tp - 1) / tp / _link_bw(hw, tp)
        self._comm = comm

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv) -> float:
        ones = self._ones
        n_p = float(prefill_tokens.dot(ones))
        n_d = float(decode_reqs.dot(ones))
        if n_p > 0 and n_d > 0:
            tok = prefill_tokens + decode_reqs
        else:  # disaggregated instances run one phase: skip the other's terms
            tok = prefill_tokens if n_p > 0 else decode_reqs
        c = tok * self._c_tok
        m = tok * self._m_tok
        if n_p > 0:
            c += prefill_attn * self._c_pa
            m += prefill_attn * self._m_pa
        if n_d > 0:
            c += decode_kv * self._c_dk
            m += decode_kv * self._m_dk
        m += np.sign(tok) * self._m_w
        if self._shared:
            mean = (n_p + n_d) / self.dp
            c += mean * self._exp_c
            m += self._exp_read * -math.expm1(-mean * self._exp_rate)
        elif self._moe_local:
            m -= self._exp_read * np.expm1(tok * -self._exp_rate)
        unit = np.maximum(c, m)
        if n_p > 0 and n_d > 0 and self._interf is not None:
            unit += np.sign(prefill_tokens * decode_reqs) * decode_kv * self._interf
        comm = float(tok.max()) * self._comm if self._comm else 0.0
        return self._overhead + self._barrier(unit) + comm

    def decode_coef(self) -> tuple[np.ndarray, float, float] | None:
        """What a compiled decode- or prefill-only pass_time reads (kernels.COEF order), the comm and overhead; None
        where it has no twin (experts held per unit: pass_time's vector expm1)."""
        if self._moe_local:
            return None
        return (np.array([self._c_tok[0], self._m_tok[0], self._c_dk[0], self._m_dk[0], self._m_w[0], self._exp_c,
                          self._exp_read, self._exp_rate, float(self._shared), self._c_pa[0], self._m_pa[0]]),
                self._comm, self._overhead)


def engine_hardware(hw: HardwareProfile, inst: InstanceConfig) -> HardwareProfile:
    """The hardware as this engine's kernels see it: the instance's mfu / mbu / pass_overhead_s where it sets them."""
    own = {k: getattr(inst, k) for k in ENGINE_KERNELS if getattr(inst, k) is not None}
    return dataclasses.replace(hw, **own) if own else hw


def _kv_shards(model: ModelProfile, tp: int) -> int:
    """Devices of a DP unit that split its KV cache: GQA shards KV heads over TP; MLA's latent is replicated."""
    return 1 if model.attention == "mla" else min(tp, model.num_kv_heads)


def _link_bw(hw: HardwareProfile, group: int) -> float:
    return hw.scaleup_bw if group <= hw.scaleup_domain else hw.scaleout_bw


# --------------------------------------------------------------------------- linear (EB)
class LinearCost(CostModel):
    """The EB form per unit: prefill a_p + b_p tokens, decode a_d + b_d reqs (+ b_kv kv),
    mixed a_mb + (c0 + c1 r + c2 r^2) (tokens + reqs) with r the decode share; the
    instance takes the max over units and nothing else. Idle units cost 0."""

    KEYS = ("a_p", "b_p", "a_d", "b_d", "b_kv", "a_mb", "c0", "c1", "c2")

    def __init__(self, dp: int, coef: Mapping[str, float]):
        super().__init__(dp)
        for name in self.KEYS:
            setattr(self, name, float(coef.get(name, 0.0)))

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv) -> float:
        n_p = prefill_tokens.dot(self._ones)
        n_d = decode_reqs.dot(self._ones)
        if n_d == 0:
            unit = np.sign(prefill_tokens) * (prefill_tokens * self.b_p + self.a_p)
        else:
            unit = np.sign(decode_reqs) * (decode_reqs * self.b_d + decode_kv * self.b_kv + self.a_d)
            if n_p > 0:
                pre = np.sign(prefill_tokens) * (prefill_tokens * self.b_p + self.a_p)
                n = prefill_tokens + decode_reqs
                r = decode_reqs / np.maximum(n, 1.0)
                mix = (self.c0 + (self.c1 + self.c2 * r) * r) * n + self.a_mb
                unit = np.where(prefill_tokens * decode_reqs > 0, mix, unit + pre)
        return self._barrier(unit)


# --------------------------------------------------------------------------- piecewise linear
class PiecewiseLinearCost(CostModel):
    """The batching study's service curve per unit: c + a * max(0, b - b0), b = prefill tokens +
    decode requests; a unit without work costs 0; the instance takes the max."""

    def __init__(self, dp: int, c: float, a: float, b0: float):
        super().__init__(dp)
        self.c, self.a, self.b0 = c, a, b0

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv) -> float:
        b = prefill_tokens + decode_reqs
        unit = np.where(b > 0, self.c + self.a * np.maximum(b - self.b0, 0.0), 0.0)
        return self._barrier(unit)


# --------------------------------------------------------------------------- table
MAX_TABLE_BYTES = 64 * safe_files.MiB  # a measured cost table: a few hundred rows (docs/architecture.md, bounds)


class TableCost(CostModel):
    """Measured timings: per unit, prefill time interpolated over prompt tokens, decode time
    over batch size, or over KV tokens when the CSV has a `kv` column (KV reads drive a
    memory-bound decode step); a mixed unit pays both; the instance takes the max.
    Outside the measured range the end values are held (np.interp).

    A table that names what it timed (`model`, `hardware` columns: pdgym-profile writes them) is checked
    against the scenario: another model is refused (its layers have other shapes, so every pass time would
    be wrong); other hardware is a CostWarning, not a refusal: one device's kernel timings carry over between
    parts of one silicon (an H100 table for the H800, whose difference is the interconnect a one-device
    table does not time), the way calibration sets Hopper measurements against the H800 scenarios."""

    def __init__(self, dp: int, path: str, hardware: str | None = None, model: str | None = None):
        super().__init__(dp)
        key = "cost.params.path"
        reader = csv.DictReader(io.StringIO(safe_files.read_text(path, MAX_TABLE_BYTES, key), newline=""))
        rows = list(reader)
        cols = set(reader.fieldnames or ())
        check({"phase", "tokens", "time_s"} <= cols, key,
              f"{path} needs columns phase, tokens, time_s (has: {', '.join(sorted(cols)) or 'none'})")
        self._check_identity(path, rows, cols, hardware, model)
        bad = sorted({r["phase"] for r in rows} - {"prefill", "decode"})
        if bad:
            raise ConfigError(f"{key}: {path} has phase {bad[0]!r}; allowed: prefill, decode")
        self.by_kv = "kv" in cols
        curves = {}
        for phase in ("prefill", "decode"):
            x_col = "kv" if phase == "decode" and self.by_kv else "tokens"
            try:
                pts = sorted((float(r[x_col]), float(r["time_s"])) for r in rows if r["phase"] == phase)
            except (TypeError, ValueError):
                raise ConfigError(f"{key}: {path} has a non-numeric {x_col} or time_s in a {phase} row") from None
            check(bool(pts), key, f"{path} has no {phase!r} rows")
            check(all(math.isfinite(x) and math.isfinite(t) for x, t in pts), key,
                  f"{path} has a {x_col} or time_s that is not a finite number (inf, nan) in a {phase} row")
            check(all(t >= 0 for _, t in pts), key, f"{path} has a negative time_s")
            curves[phase] = (np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
        self.xp, self.yp = curves["prefill"]
        self.xd, self.yd = curves["decode"]

    @staticmethod
    def _check_identity(path: str, rows: list[dict], cols: set, hardware: str | None, model: str | None) -> None:
        key = "cost.params.path"
        named = {c: sorted({r[c] for r in rows}) for c in ("model", "hardware") if c in cols}
        for c, vals in named.items():
            check(len(vals) == 1 and bool(vals[0]), key, f"{path} has {len(vals)} {c} values ({', '.join(vals)}); "
                  f"a table times one {c}")
        if model is not None and "model" in named and named["model"][0] != model:
            raise ConfigError(f"{key}: {path} times model {named['model'][0]}; the scenario serves {model}: profile "
                              f"it (pdgym-profile model={model} hardware=...) or use a scenario of {named['model'][0]}")
        if hardware is not None and "hardware" in named and named["hardware"][0] != hardware:
            warnings.warn(f"{key}: {path} was timed on hardware {named['hardware'][0]}; the scenario runs {hardware}, "
                          f"and its passes take {named['hardware'][0]}'s times (right for one silicon, e.g. h100 -> "
                          f"h800; for {hardware}'s own: pdgym-profile hardware={hardware})", CostWarning, stacklevel=2)

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv) -> float:
        dx = decode_kv if self.by_kv else decode_reqs
        unit = (np.where(prefill_tokens > 0, np.interp(prefill_tokens, self.xp, self.yp), 0.0)
                + np.where(decode_reqs > 0, np.interp(dx, self.xd, self.yd), 0.0))
        return self._barrier(unit)


# --------------------------------------------------------------------------- builders
COST_MODELS: Registry[Callable[..., CostModel]] = Registry("cost.kind")


def build_cost_model(cfg: CostConfig, hw: HardwareProfile, model: ModelProfile,
                     inst: InstanceConfig, engine: str = "python") -> CostModel:
    """The cost model `cfg.kind` for one instance shape; bad params fail naming cost.params.X. A full pass of the
    shape (every unit a full chunk, or a full batch) must take a finite time: hardware values that are valid
    one by one (hbm_bw=1e-300) otherwise gave NaN latencies and a result that looked like one."""
    cost = COST_MODELS[cfg.kind](dict(cfg.params or {}), hw, model, inst)
    dp, c, b = inst.dp, float(inst.chunk_tokens), float(inst.batch_limit)
    full = np.full(dp, c)
    try:
        with np.errstate(all="ignore"):  # an overflow here is what the check reports, in one line
            probe = (cost.pass_time(full, full * c / 2, np.zeros(dp), np.zeros(dp)),
                     cost.pass_time(np.zeros(dp), np.zeros(dp), np.full(dp, b), np.full(dp, b * c)))
    except OverflowError:
        probe = (math.inf,)
    if not all(math.isfinite(t) and t >= 0 for t in probe):
        where = "hardware (hbm_bw, flops_*, mfu, mbu, link bandwidths)" if cfg.kind == "roofline" else "cost.params"
        raise ConfigError(f"{where}: a full pass of this instance takes {max(probe)} s under cost.kind={cfg.kind}; "
                          "the values must give a finite, non-negative time")
    cost.decode_kernel = compiled.decode_time(cost, engine)
    cost.prefill_kernel = compiled.prefill_time(cost, engine)
    return cost


@COST_MODELS.register("roofline")
def _roofline(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, (), "cost.params", "kind=roofline")
    return RooflineCost(hw, model, inst)


@COST_MODELS.register("linear")
def _linear(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, LinearCost.KEYS + ("mean_prompt", "mean_ctx"), "cost.params", "kind=linear")
    coef = {k: _nonneg(params, k) for k in params}
    means = coef.pop("mean_prompt", DEFAULT_MEAN_PROMPT), coef.pop("mean_ctx", DEFAULT_MEAN_CTX)
    for k, v in zip(("mean_prompt", "mean_ctx"), means):
        check(v > 0, f"cost.params.{k}", f"got {v}; must be > 0")
    missing = [k for k in LinearCost.KEYS if k not in coef and k != "b_kv"]
    if missing:  # fill what was not given from the roofline of this hardware, model and shape
        fit = linear_coefficients(RooflineCost(hw, model, inst), *means)
        coef.update({k: fit[k] for k in missing})
    return LinearCost(inst.dp, coef)


@COST_MODELS.register("piecewise_linear")
def _piecewise_linear(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, ("c", "a", "b0"), "cost.params", "kind=piecewise_linear")
    for k in ("c", "a"):
        check(k in params, f"cost.params.{k}", "required for kind=piecewise_linear (c + a * max(0, b - b0))")
    return PiecewiseLinearCost(inst.dp, _nonneg(params, "c"), _nonneg(params, "a"),
                               _nonneg(params, "b0") if "b0" in params else 0.0)


@COST_MODELS.register("table")
def _table(params: dict, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig) -> CostModel:
    check_params(params, ("path",), "cost.params", "kind=table")
    check(isinstance(params.get("path"), str), "cost.params.path", "required for kind=table: give +cost.params.path=FILE.csv")
    return TableCost(inst.dp, params["path"], hw.name, model.name)


def _nonneg(params: Mapping, k: str) -> float:
    v = params[k]
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    check(ok, f"cost.params.{k}", f"got {v!r}; must be a number >= 0")
    return float(v)


def linear_coefficients(cost: CostModel, mean_prompt: float, mean_ctx: float) -> dict[str, float]:
    """Fit the EB linear form to any cost model by non-negative least squares, every unit equally loaded.

    Prefill phase of L = j x mean_prompt tokens (j whole prompts): a_p + b_p L. Decode
    iteration of n requests with mean_ctx KV tokens each: a_d + b_d n. Mixed batch of T
    tokens with decode share r (prefill pieces from mean_prompt-token prompts):
    a_mb + (c0 + c1 r + c2 r^2) T. Returns a_p, b_p, a_d, b_d, a_mb, c0, c1, c2.
    """
    ones = np.ones(cost.dp)

    def t(pt, pa, dr, dk):
        return cost.pass_time(ones * pt, ones * pa, ones * dr, ones * dk)

    half = mean_prompt / 2.0
    lens = mean_prompt * np.array([1, 2, 3, 4, 6, 8, 12, 16])
    a_p, b_p = _nnls(np.column_stack([np.ones_like(lens), lens]),
                     [t(x, x * half, 0, 0) for x in lens])
    ns = np.arange(16, 257, 16, dtype=float)
    a_d, b_d = _nnls(np.column_stack([np.ones_like(ns), ns]), [t(0, 0, n, n * mean_ctx) for n in ns])
    rows, y = [], []
    for big_t in (512.0, 1024.0, 2048.0, 4096.0):
        for r in np.arange(1, 8) / 8.0:
            rows.append([1.0, big_t, r * big_t, r * r * big_t])
            pt, dr = (1 - r) * big_t, r * big_t
            y.append(t(pt, pt * half, dr, dr * mean_ctx))
    a_mb, c0, c1, c2 = _nnls(np.array(rows), y)
    return {"a_p": a_p, "b_p": b_p, "a_d": a_d, "b_d": b_d, "a_mb": a_mb, "c0": c0, "c1": c1, "c2": c2}


def _nnls(x: np.ndarray, y) -> list[float]:
    from scipy.optimize import nnls  # lazy: scipy costs ~1.4 s of import and only this fitting path needs it

    scale = np.abs(x).max(axis=0)  # columns span 1 .. 1e4: rescale for a well-conditioned solve
    coef, _ = nnls(x / scale, np.asarray(y, dtype=float))
    return [float(c) for c in coef / scale]


# --------------------------------------------------------------------------- memory and transfers
def kv_capacity_tokens(hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig,
                       key: str = "cluster.*") -> int:
    """KV tokens one DP unit can hold: inst.kv_capacity_tokens if set, else what HBM x mem_util
    leaves after the resident weights (non-routed / tp, routed experts / max(ep, tp))."""
    if inst.kv_capacity_tokens is not None:
        return int(inst.kv_capacity_tokens)
    shard = max(inst.ep, inst.tp)
    resident = (model.nonrouted_params / inst.tp + model.routed_params / shard) * model.weight_bytes
    usable = hw.hbm_bytes * inst.mem_util
    per_token = model.kv_bytes_per_token / _kv_shards(model, inst.tp)  # bytes per device
    tokens = int((usable - resident) // per_token)
    check(tokens >= 1, f"{key}.kv_capacity_tokens",
          f"{model.name} weights need {resident / 1e9:.1f} GB per device (tp={inst.tp}, ep={inst.ep}) but "
          f"{hw.name} has {usable / 1e9:.1f} GB usable (mem_util {inst.mem_util}); "
          "set kv_capacity_tokens explicitly or raise ep/tp")
    return tokens


def kv_transfer_time(tokens: float, hw: HardwareProfile, model: ModelProfile, link: str,
                     base_s: float) -> float:
    """Seconds to move `tokens` tokens of KV cache over one device's `link` (scaleout | scaleup)."""
    return kv_transfer_fn(hw, model, link, base_s)(tokens)


def kv_transfer_fn(hw: HardwareProfile, model: ModelProfile, link: str,
                   base_s: float) -> Callable[[float], float]:
    """`kv_transfer_time` with the link checked and its bandwidth resolved once: the engine calls the
    returned function once per finished prefill (same arithmetic, so the same floats)."""
    check_choice(link, "cluster.kv_link", ("scaleout", "scaleup"))
    bw = hw.scaleout_bw if link == "scaleout" else hw.scaleup_bw
    kvb = model.kv_bytes_per_token

    def transfer(tokens: float) -> float:
        return base_s + tokens * kvb / bw

    return transfer
