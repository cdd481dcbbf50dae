"""The roofline cost model: a pass's FLOPs and bytes per device against the hardware's achievable peaks."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .config import InstanceConfig
from .cost_model import CostModel
from .hardware import HardwareProfile
from .models import ModelProfile

Q_TILE = 128  # query rows per attention tile: a prefill chunk re-reads its KV context once per tile
ACT_BYTES = 8  # residual-stream traffic per token, layer and hidden element: 2 reads + 2 writes in BF16
COMBINE_BYTES = 2  # EP combine travels in BF16; dispatch in the weight dtype (FP8 for FP8 models)
ENGINE_KERNELS = ("mfu", "attn_mfu", "mbu", "pass_overhead_s")  # hardware fields an instance's engine may set (InstanceConfig)


class RooflineCost(CostModel):
    """Per device of each unit: max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth).

    pass = pass_overhead_s + max over units (barrier) + communication (EP all-to-all
    and TP all-reduce, paid for the unit with the most tokens: every unit waits for it).
    An all-zero pass costs pass_overhead_s: an empty step still launches.

    FLOPs, parameters counted as the kernels run them (models.py): 2 x decoder params per
    token (non-routed decoder / tp, plus top-k routed experts), 2 x LM-head params (/ tp) per
    LM-head token (every decode token, and each prompt's last token: `prompt_ends`; a chunk
    that does not end its prompt runs no LM head), attention 4 x layers x heads x width per
    token-pair (width = head_dim; MLA decode attends over the cached latent, absorbed); the
    embedding is a lookup (no FLOPs). Bytes: decoder weights / tp (if the unit has work), the
    LM head / tp (if it has an LM-head token), one embedding row / tp per token, routed experts
    actually touched on the device, KV read / written (a prefill piece re-reads its context
    once per Q_TILE query rows), activations. Weights run at mfu x the FP8 peak when the model
    is served in FP8 and the device has FP8, else x the BF16 peak; attention products run at
    attn_mfu x the BF16 peak (the engine's attention kernel: FlashAttention-3 / cuDNN-class
    near mfu, FlashAttention-2-class well below it on Hopper; conf/hardware/*.yaml).

    Expert parallelism (ep > tp): routed experts are spread over the whole EP group, so
    each device's expert work follows the instance's mean tokens per unit (balanced
    routing) and a unit without tokens still does it; the imbalance the barrier sees
    comes from attention and the non-routed weights. With ep <= tp each unit holds
    every expert (sharded by tp) and its expert work follows its own tokens.

    mfu, attn_mfu, mbu and pass_overhead_s are the engine's kernels: the instance's (cluster.*.mfu, ...) where
    set, else the hardware profile's.

    Mixed-batch interference: a unit that runs prefill and decode in one batch pays
    interference x its decode KV-read time on top (cluster.*.interference, the engine's; else
    hw.interference, the EB study's engine on that GPU) (the decode attention runs as a
    separate, poorly overlapped phase beside compute-bound prefill). The term grows
    with the decode share r and with 1 / bandwidth. Calibration (tests/test_cost.py):
    qwen3_8b, dp=1, a mixed batch of T = 2048 tokens, r*T decodes of 1000 KV tokens each
    plus (1-r)*T prefill tokens from 1000-token prompts (attention pairs = 500 per token);
    m(r) = pass_time / T against pure decode d = pass_time(256 decodes x 1000 KV) / 256;
    the crossover m(r*) = d lies in [0.1, 0.35] on rtx_pro_6000 and [0.65, 0.95] on
    h200 (EB study: about 0.2 and 0.8). Those two profiles' interference (2.72, 0.91)
    put r* at 0.20 and 0.80; the others follow 0.91 * (4.8 TB/s / hbm_bw)^1.11 (re-fitted
    with issue 35's parameter counting: 2.17 and 0.95 had put r* at 0.25 and 0.78).
    """

    def __init__(self, hw: HardwareProfile, model: ModelProfile, inst: InstanceConfig):
        super().__init__(inst.dp)
        hw = engine_hardware(hw, inst)
        tp, ep = inst.tp, inst.ep
        flops = hw.flops_fp8 if model.weight_bytes <= 1 and hw.flops_fp8 > 0 else hw.flops_bf16
        f = flops * hw.mfu
        b = hw.hbm_bw * hw.mbu
        wb = model.weight_bytes
        kvb = model.kv_bytes_per_token / kv_shards(model, tp)
        moe = model.num_experts > 0
        k, n_exp = model.experts_per_token, model.num_experts
        expert_flops = 2.0 * model.expert_params * model.moe_layers * k  # per token
        self._shared = moe and ep > tp
        self._moe_local = moe and not self._shared
        # Attention products (QK^T, PV) run in BF16 even when the weights are FP8: FlashAttention / FlashMLA,
        # the kernels FP8 engines use, keep attention in BF16 (FlashMLA: 580 TFLOP/s compute-bound on an H800,
        # 0.59 of the BF16 peak). Measured 2026-11-26 on an H200 (data/calibration/h200_ds_v3_prefill_slice.csv):
        # the attention of a DS-V3 prefill layer takes the same time with FP8 and with BF16 projections.
        attn = 4.0 * model.layers * model.num_heads / tp / (hw.flops_bf16 * hw.attn_mfu)
        shard = max(ep, tp)

        # Per-unit coefficients as length-dp vectors: array * array is the cheapest NumPy op.
        def vec(x: float) -> np.ndarray:
            return np.full(self.dp, x)

        self._c_tok = vec((2.0 * model.decoder_params + (expert_flops if self._moe_local else 0.0)) / tp / f)
        self._c_pa = vec(attn * model.head_dim)
        self._c_dk = vec(attn * (model.kv_width if model.attention == "mla" else model.head_dim))
        emb_row = model.hidden * wb / tp if model.vocab_size else 0.0  # the embedding: a row read per token
        self._m_tok = vec((kvb + ACT_BYTES * model.layers * model.hidden + emb_row) / b)
        self._m_pa = vec(kvb / Q_TILE / b)
        self._m_dk = vec(kvb / b)
        self._m_w = vec(model.decoder_params * wb / tp / b)
        self._head = model.lm_head_params > 0  # LM head per LM-head token: its GEMM, and its weights read once
        self._c_head = vec(2.0 * model.lm_head_params / tp / f)
        self._m_head = vec(model.lm_head_params * wb / tp / b)
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
            comm += per_tok / tp / link_bw(hw, ep)
        if tp > 1:  # ring all-reduce after attention, and after every FFN that is not an EP MoE
            n_ar = 2 * model.layers - (model.moe_layers if moe and ep > 1 else 0)
            comm += n_ar * model.hidden * 2.0 * 2.0 * (tp - 1) / tp / link_bw(hw, tp)
        self._comm = comm
        # One unit (dp = 1) without per-unit experts: the same float operations, in the same order, on Python floats
        # (length-1 NumPy vectors cost more in dispatch than in arithmetic). colocated.py's iterations call it.
        if self.dp == 1 and not self._moe_local:
            self._k1 = tuple(float(v[0]) for v in (self._c_tok, self._m_tok, self._c_pa, self._m_pa, self._c_dk,
                                                   self._m_dk, self._m_w, self._c_head, self._m_head))
            self._interf1 = None if self._interf is None else float(self._interf[0])
            self.pass_time1 = self._pass_time1

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends=None) -> float:
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
        if self._head:  # the LM head: every decode token, each prompt's last token
            head = decode_reqs if n_d > 0 else None
            if prompt_ends is not None and n_p > 0:
                head = prompt_ends if head is None else head + prompt_ends
            if head is not None:
                c += head * self._c_head
                m += np.sign(head) * self._m_head
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

    def _pass_time1(self, prefill_tokens: float, prefill_attn: float, decode_reqs: float, decode_kv: float,
                    prompt_ends: float) -> float:
        """pass_time of a one-unit instance on scalars: the same value as pass_time on length-1 vectors (each operation
        is the vector one's, in its order; x * 1.0 and a sum over one unit are exact), and the same last_idle_frac
        (0: one unit never waits); last_unit is not kept (record_pass reads it only for observers)."""
        c_tok, m_tok, c_pa, m_pa, c_dk, m_dk, m_w, c_head, m_head = self._k1
        n_p = prefill_tokens
        n_d = decode_reqs
        if n_p > 0 and n_d > 0:
            tok = prefill_tokens + decode_reqs
        else:
            tok = prefill_tokens if n_p > 0 else decode_reqs
        c = tok * c_tok
        m = tok * m_tok
        if n_p > 0:
            c += prefill_attn * c_pa
            m += prefill_attn * m_pa
        if n_d > 0:
            c += decode_kv * c_dk
            m += decode_kv * m_dk
        m += (1.0 if tok > 0 else 0.0) * m_w
        if self._head:
            head = decode_reqs if n_d > 0 else None
            if n_p > 0:
                head = prompt_ends if head is None else head + prompt_ends
            if head is not None:
                c += head * c_head
                m += (1.0 if head > 0 else 0.0) * m_head
        if self._shared:
            mean = (n_p + n_d) / self.dp
            c += mean * self._exp_c
            m += self._exp_read * -math.expm1(-mean * self._exp_rate)
        unit = c if c > m else m
        if n_p > 0 and n_d > 0 and self._interf1 is not None:
            unit += (1.0 if prefill_tokens * decode_reqs > 0 else 0.0) * decode_kv * self._interf1
        comm = tok * self._comm if self._comm else 0.0
        self.last_unit = None
        self.last_idle_frac = 0.0
        return self._overhead + unit + comm

    def decode_coef(self) -> tuple[np.ndarray, float, float] | None:
        """What a compiled decode- or prefill-only pass_time reads (kernels.COEF order), the comm and overhead; None
        where it has no twin (experts held per unit: pass_time's vector expm1)."""
        if self._moe_local:
            return None
        return (np.array([self._c_tok[0], self._m_tok[0], self._c_dk[0], self._m_dk[0], self._m_w[0], self._exp_c,
                          self._exp_read, self._exp_rate, float(self._shared), self._c_pa[0], self._m_pa[0],
                          self._c_head[0] if self._head else 0.0, self._m_head[0] if self._head else 0.0]),
                self._comm, self._overhead)


def engine_hardware(hw: HardwareProfile, inst: InstanceConfig) -> HardwareProfile:
    """The hardware as this engine's kernels see it: the instance's mfu / mbu / pass_overhead_s where it sets them."""
    own = {k: getattr(inst, k) for k in ENGINE_KERNELS if getattr(inst, k) is not None}
    return dataclasses.replace(hw, **own) if own else hw


def kv_shards(model: ModelProfile, tp: int) -> int:
    """Devices of a DP unit that split its KV cache: GQA shards KV heads over TP; MLA's latent is replicated."""
    return 1 if model.attention == "mla" else min(tp, model.num_kv_heads)


def link_bw(hw: HardwareProfile, group: int) -> float:
    return hw.scaleup_bw if group <= hw.scaleup_domain else hw.scaleout_bw
