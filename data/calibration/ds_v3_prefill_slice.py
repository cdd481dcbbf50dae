"""Time one device's share of a DeepSeek-V3 prefill pass with real kernels, and set it beside the roofline.

    python data/calibration/ds_v3_prefill_slice.py --out DIR                 # a CUDA GPU (FP8 needs Hopper or later)
    python data/calibration/ds_v3_prefill_slice.py --shrink 16 --out DIR     # a CPU smoke run (tests)

Why: the SBS reproductions' prefill instance (conf/cluster/disagg_3p1d.yaml: DP 8, attention TP 2, EP 16 over two
H800 nodes) runs a full 3K x 8 pass in 0.35 s at the roofline, about 0.10 s of compute and 0.25 s of EP
all-to-all, and PBAA's "off" utilisation turns on that pass being short against the 0.8 s TTFT target
(docs/fidelity.md). One GPU cannot time the all-to-all, but it can time the compute each device does in that
pass, with the kernels a serving engine runs: per layer, MLA attention of one DP unit's prompt over its TP share
of the heads (projections, causal flash attention with query / key width 192 and value width 128), the shared
expert over the unit's tokens (TP-split), and the device's 256 / EP routed experts over every token of the
instance routed to them (random top-8 routing of DP x T tokens; 3 dense layers run a TP-split SwiGLU instead).
GEMMs run in FP8 with per-tensor scales (`torch._scaled_mm`, activations quantised each time, as DeepSeek serves
the model) or in BF16; attention and the router in BF16. Each layer is captured in a CUDA graph and replayed
(kernel time, no host launch gaps; eager times are kept beside it). Not timed: the all-to-all and TP
all-reduce, embeddings, the LM head, the engine's scheduler.

Writes DIR/ds_v3_prefill_slice.csv (one row per precision, tokens per unit and component; `pass` rows are
58 MoE layers + 3 dense layers) and DIR/ds_v3_prefill_slice.json (device, torch, settings). The roofline's
compute term for the same pass (cost.py's RooflineCost on the named hardware with the links made free) is in
the `roofline_s` column, so `time_s / roofline_s` is the measured-to-modelled ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# DeepSeek-V3's HF config.json (the widths conf/model/deepseek_v3.yaml does not carry).
Q_LORA, KV_LORA, ROPE, NOPE, V_DIM = 1536, 512, 64, 128, 128
DENSE_FFN, MOE_LAYERS, DENSE_LAYERS = 18432, 58, 3
FP8_MAX = 448.0  # largest float8_e4m3fn


@dataclass(frozen=True)
class Slice:
    """One device's share of a layer: widths after `shrink`, the instance layout, the tokens per DP unit."""

    hidden: int = 7168
    heads: int = 128
    expert_ffn: int = 2048
    experts: int = 256
    top_k: int = 8
    q_lora: int = Q_LORA
    kv_lora: int = KV_LORA
    rope: int = ROPE
    nope: int = NOPE
    v_dim: int = V_DIM
    dense_ffn: int = DENSE_FFN
    dp: int = 8
    tp: int = 2
    ep: int = 16

    def shrunk(self, k: int) -> Slice:
        d = lambda x: max(16, x // k)  # noqa: E731 (GEMM dims stay multiples of 16)
        return dataclasses.replace(self, hidden=d(self.hidden), heads=max(self.tp, self.heads // k),
                                   expert_ffn=d(self.expert_ffn), q_lora=d(self.q_lora), kv_lora=d(self.kv_lora),
                                   dense_ffn=d(self.dense_ffn))

    @property
    def local_heads(self) -> int:
        return self.heads // self.tp

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep


class Device:
    """The GEMM of one precision on one torch device: FP8 (weights stored quantised, activations quantised per
    call) or a float type."""

    def __init__(self, torch, device: str, precision: str, seed: int):
        self.torch, self.device, self.precision = torch, device, precision
        self.act = torch.bfloat16 if device == "cuda" else torch.float32
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.gen, device=self.device, dtype=self.torch.float32).to(self.act)

    def weight(self, k: int, n: int):
        """A [k, n] weight, stored as the GEMM wants it: FP8 column-major ([n, k] contiguous, transposed)."""
        w = self.torch.randn(n, k, generator=self.gen, device=self.device) / math.sqrt(k)
        if self.precision == "fp8":
            scale = w.abs().max() / FP8_MAX
            return (w / scale).to(self.torch.float8_e4m3fn).t(), scale.float()
        return w.to(self.act).t().contiguous(), None

    def quant(self, x):
        """(x, scale): FP8 with one per-tensor scale, or x as it is."""
        if self.precision != "fp8":
            return x, None
        scale = (x.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
        return (x / scale.to(x.dtype)).to(self.torch.float8_e4m3fn), scale

    def mm_q(self, xq, w):
        """GEMM of a quantised (or plain) x with a stored weight."""
        (x, xscale), (wt, wscale) = xq, w
        if wscale is None:
            return x @ wt
        return self.torch._scaled_mm(x, wt, scale_a=xscale, scale_b=wscale, out_dtype=self.act)

    def mm(self, x, w):
        """x @ w; x is quantised first where w is stored in FP8 (the router's weight stays BF16)."""
        return x @ w[0] if w[1] is None else self.mm_q(self.quant(x), w)


def pad16(n: int) -> int:
    """Rows of an expert's GEMM: padded to a multiple of 16 as FP8 tensor-core GEMMs want (DeepGEMM pads to 128)."""
    return max(16, -(-n // 16) * 16)


def routed_rows(s: Slice, tokens: int, seed: int) -> list[int]:
    """Rows each of this device's experts receives when DP x `tokens` tokens pick top-k of all experts at random."""
    import numpy as np

    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((s.dp * tokens, s.experts)), axis=1)[:, :s.top_k]
    counts = np.bincount(picks.ravel(), minlength=s.experts)
    return [int(c) for c in counts[:s.local_experts]]


class Layer:
    """The components of one device's layer share, each a closure over static inputs (graph-capturable)."""

    def __init__(self, s: Slice, dev: Device):
        self.s, self.dev = s, dev
        self.F = dev.torch.nn.functional
        h = s.local_heads
        w = dev.weight
        self.q_a, self.q_b = w(s.hidden, s.q_lora), w(s.q_lora, h * (s.nope + s.rope))
        self.kv_a, self.kv_b = w(s.hidden, s.kv_lora + s.rope), w(s.kv_lora, h * (s.nope + s.v_dim))
        self.o = w(h * s.v_dim, s.hidden)
        self.router = (dev.randn(s.hidden, s.experts) / math.sqrt(s.hidden), None)
        sh_ffn = s.expert_ffn // s.tp
        self.sh_up, self.sh_down = w(s.hidden, 2 * sh_ffn), w(sh_ffn, s.hidden)
        d_ffn = s.dense_ffn // s.tp
        self.d_up, self.d_down = w(s.hidden, 2 * d_ffn), w(d_ffn, s.hidden)
        self.e_up = [w(s.hidden, 2 * s.expert_ffn) for _ in range(s.local_experts)]
        self.e_down = [w(s.expert_ffn, s.hidden) for _ in range(s.local_experts)]
        torch = dev.torch
        # BF16 / float: the experts' weights stacked for one grouped GEMM per projection, where torch has one here
        self.grouped = False
        if dev.precision != "fp8" and hasattr(torch, "_grouped_mm"):
            from pdgym.agents.apps.profile import grouped_layout

            probe = dev.randn(16 * s.local_experts, s.hidden)
            offs = torch.arange(16, 16 * s.local_experts + 1, 16, device=dev.device, dtype=torch.int32)
            ws = grouped_layout(torch, probe, [torch.stack([wt for wt, _ in self.e_up]),
                                               torch.stack([wt for wt, _ in self.e_down])], offs)
            if ws is not None:
                self.grouped, (self.g_up, self.g_down) = True, ws
        self.flash = dev.device == "cuda"  # a fused attention kernel (value width padded to the query / key width)

    def set_tokens(self, tokens: int, seed: int) -> None:
        """Inputs of a pass with `tokens` prompt tokens per DP unit: the unit's hidden states and the rows its
        device's experts receive from the whole instance."""
        self.tokens = tokens
        self.x = self.dev.randn(tokens, self.s.hidden)
        self.rows = routed_rows(self.s, tokens, seed)
        self.padded = [pad16(n) for n in self.rows]
        self.e_x = self.dev.randn(sum(self.padded), self.s.hidden)  # every local expert's rows, expert by expert
        self.offs = self.dev.torch.tensor(self.padded, device=self.dev.device).cumsum(0).to(self.dev.torch.int32)

    def _norm(self, x):
        return x * (x.float().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt().to(x.dtype)

    def _swiglu(self, x, up, down):
        a, b = self.dev.mm(x, up).chunk(2, dim=-1)
        return self.dev.mm((self.F.silu(a) * b).contiguous(), down)

    def attention(self):
        s, dev, T, h = self.s, self.dev, self.tokens, self.s.local_heads
        x = self._norm(self.x)
        q = dev.mm(self._norm(dev.mm(x, self.q_a)), self.q_b).view(T, h, s.nope + s.rope)
        kv = dev.mm(x, self.kv_a)
        latent, k_rope = kv.split([s.kv_lora, s.rope], -1)
        kvb = dev.mm(self._norm(latent).contiguous(), self.kv_b).view(T, h, s.nope + s.v_dim)
        k_nope, v = kvb.split([s.nope, s.v_dim], -1)
        k = dev.torch.cat([k_nope, k_rope[:, None, :].expand(T, h, s.rope)], -1)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        if self.flash:  # fused kernels need one head width: pad V (the PV product does 192 / 128 of its work)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            v = self.F.pad(v, (0, s.nope + s.rope - s.v_dim))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):  # never the math fallback
                a = self.F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0, ..., :s.v_dim]
        else:
            a = self.F.scaled_dot_product_attention(q, k, v.contiguous(), is_causal=True)
        return dev.mm(a.transpose(0, 1).reshape(T, h * s.v_dim), self.o)

    def shared(self):
        return self._swiglu(self._norm(self.x), self.sh_up, self.sh_down)

    def routed(self):
        """The router over the unit's tokens, then this device's experts over the rows routed to them: one grouped
        GEMM per projection (BF16), or per-expert FP8 GEMMs on inputs quantised once per projection (as a
        grouped FP8 kernel does)."""
        torch, dev, F = self.dev.torch, self.dev, self.F
        torch.softmax(dev.mm(self.x, self.router).float(), -1).topk(self.s.top_k, -1)
        if self.grouped:
            a, b = torch._grouped_mm(self.e_x, self.g_up, offs=self.offs).chunk(2, dim=-1)
            return torch._grouped_mm((F.silu(a) * b), self.g_down, offs=self.offs)
        xq, scale = dev.quant(self.e_x)
        mids, start = [], 0
        for n, up in zip(self.padded, self.e_up):
            a, b = dev.mm_q((xq[start:start + n], scale), up).chunk(2, dim=-1)
            mids.append(F.silu(a) * b)
            start += n
        mq, mscale = dev.quant(torch.cat(mids))
        outs, start = [], 0
        for n, down in zip(self.padded, self.e_down):
            outs.append(dev.mm_q((mq[start:start + n], mscale), down))
            start += n
        return outs

    def dense(self):
        return self._swiglu(self._norm(self.x), self.d_up, self.d_down)

    def moe_layer(self):
        self.attention()
        self.shared()
        self.routed()

    def dense_layer(self):
        self.attention()
        self.dense()

    def flops(self) -> dict[str, float]:
        s, T, h = self.s, self.tokens, self.s.local_heads
        proj = s.hidden * s.q_lora + s.q_lora * h * (s.nope + s.rope) + s.hidden * (s.kv_lora + s.rope) \
            + s.kv_lora * h * (s.nope + s.v_dim) + h * s.v_dim * s.hidden
        core = 2.0 * h * (T * T / 2) * ((s.nope + s.rope) + s.v_dim)  # causal: T^2 / 2 pairs, QK and PV
        attention = 2.0 * T * proj + core
        shared = 2.0 * T * 3 * s.hidden * (s.expert_ffn // s.tp)
        routed = 2.0 * sum(self.rows) * 3 * s.hidden * s.expert_ffn + 2.0 * T * s.hidden * s.experts  # padding not counted
        dense = 2.0 * T * 3 * s.hidden * (s.dense_ffn // s.tp)
        return {"attention": attention, "shared": shared, "routed": routed, "dense": dense,
                "moe_layer": attention + shared + routed, "dense_layer": attention + dense}


def roofline_s(hardware: str, s: Slice, tokens: int) -> float:
    """The roofline's compute for the same pass (pdgym.agents.experiments.calibration.roofline_compute_s)."""
    from pdgym.agents.experiments.calibration import roofline_compute_s
    from pdgym.envs.sim.config import InstanceConfig
    from pdgym.envs.sim.hardware import load_hardware
    from pdgym.envs.sim.models import load_model

    inst = InstanceConfig(count=1, dp=s.dp, tp=s.tp, ep=s.ep)
    return roofline_compute_s(load_hardware(hardware), load_model("deepseek_v3"), inst, tokens)


def measure(s: Slice, tokens: list[int], precisions: list[str], device: str, warmup: int, repeats: int,
            hardware: str, seed: int, progress=print) -> list[dict]:
    import torch
    from pdgym.agents.apps.profile import time_call

    rows = []
    for prec in precisions:
        lay = Layer(s, Device(torch, device, prec, seed))
        for T in tokens:
            lay.set_tokens(T, seed)
            fl = lay.flops()
            times = {}
            for comp in ("attention", "shared", "routed", "dense", "moe_layer", "dense_layer"):
                fn = getattr(lay, comp)
                times[comp] = time_call(torch, fn, device, warmup, repeats, graph=True)
                eager = time_call(torch, fn, device, warmup, repeats) if device == "cuda" else times[comp]
                rows.append({"precision": prec, "tokens_per_unit": T, "component": comp, "layers": 1,
                             "moe_kernel": "grouped" if lay.grouped else "per_expert",
                             "routed_rows": sum(lay.rows), "flops": fl[comp], "time_s": times[comp],
                             "eager_s": eager, "roofline_s": float("nan")})
            total = MOE_LAYERS * times["moe_layer"] + DENSE_LAYERS * times["dense_layer"]
            eager_total = sum(r["eager_s"] * (MOE_LAYERS if r["component"] == "moe_layer" else DENSE_LAYERS)
                              for r in rows[-6:] if r["component"] in ("moe_layer", "dense_layer"))
            roof = roofline_s(hardware, s, T) if s == Slice() else float("nan")  # a shrunk slice is no model
            rows.append({"precision": prec, "tokens_per_unit": T, "component": "pass",
                         "moe_kernel": "grouped" if lay.grouped else "per_expert",
                         "layers": MOE_LAYERS + DENSE_LAYERS, "routed_rows": sum(lay.rows),
                         "flops": MOE_LAYERS * fl["moe_layer"] + DENSE_LAYERS * fl["dense_layer"], "time_s": total,
                         "eager_s": eager_total, "roofline_s": roof})
            progress(f"{prec:>5} {T:>5} tokens/unit: pass {total * 1e3:8.2f} ms (eager {eager_total * 1e3:8.2f}), "
                     f"roofline compute {roof * 1e3:8.2f} ms, ratio {total / roof:.2f}")
        del lay
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokens", default="512,1024,2048,3072", help="prompt tokens per DP unit (comma-separated)")
    ap.add_argument("--precisions", default=None, help="fp8,bf16 on CUDA (default); float on a CPU")
    ap.add_argument("--shrink", type=int, default=1, help="divide every width by this (CPU smoke runs)")
    ap.add_argument("--hardware", default="h800", help="hardware profile of the roofline column (default h800)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    allowed = ("fp8", "bf16") if device == "cuda" else ("float",)  # the activation dtype the device runs
    precisions = (a.precisions or ",".join(allowed)).split(",")
    try:
        tokens = sorted({int(t) for t in a.tokens.split(",")})
    except ValueError:
        tokens = []
    problems = [
        (any(p not in allowed for p in precisions), "--precisions", f"got {a.precisions!r}; allowed on this "
         f"{device}: {', '.join(allowed)} (fp8 and bf16 need CUDA; a CPU runs float32)"),
        (not tokens or min(tokens) < 16, "--tokens", f"got {a.tokens!r}; allowed: comma-separated integers >= 16"),
        (a.shrink < 1, "--shrink", f"got {a.shrink}; allowed: an integer >= 1"),
        (a.warmup < 0, "--warmup", f"got {a.warmup}; allowed: an integer >= 0"),
        (a.repeats < 1, "--repeats", f"got {a.repeats}; allowed: an integer >= 1"),
    ]
    for bad, key, msg in problems:
        if bad:
            print(f"ds_v3_prefill_slice: error: {key}: {msg}", file=sys.stderr)
            return 2
    try:  # the roofline column's hardware, before anything is timed
        from pdgym.envs.sim.hardware import load_hardware

        load_hardware(a.hardware)
    except Exception as e:  # noqa: BLE001 (ConfigError and a missing profile alike: one line)
        print(f"ds_v3_prefill_slice: error: --hardware: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    s = Slice().shrunk(a.shrink) if a.shrink > 1 else Slice()
    t0 = time.time()
    rows = measure(s, tokens, precisions, device, a.warmup, a.repeats, a.hardware, a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    csv = a.out / "ds_v3_prefill_slice.csv"
    tmp = csv.with_suffix(".csv.tmp")
    pd.DataFrame(rows).assign(dp=s.dp, tp=s.tp, ep=s.ep).to_csv(tmp, index=False)
    os.replace(tmp, csv)
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "slice": dataclasses.asdict(s), "shrink": a.shrink, "tokens": tokens, "precisions": precisions,
            "warmup": a.warmup, "repeats": a.repeats, "seed": a.seed, "roofline_hardware": a.hardware,
            "wall_s": round(time.time() - t0, 1)}
    js = a.out / "ds_v3_prefill_slice.json"
    js.with_suffix(".json.tmp").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(js.with_suffix(".json.tmp"), js)
    print(f"wrote {csv} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
