"""`pdgym-profile`: time a model shape's forward passes on this machine and calibrate the cost models.

    pdgym-profile hardware=h100 model=qwen3_8b hydra.run.dir=DIR
    pdgym-profile profile.shrink=32 profile.layers=1 "profile.prefill_tokens=[64,256]" ...   (smoke run on a CPU)

Operator profiling as vidur does it: decoder layers with the model profile's shapes (hidden, query / KV
heads, head width; SwiGLU MLP, or a top-k routed MoE with its experts and shared experts) and random
weights run on the local torch device (CUDA when available, synchronised; else CPU): prefill of one
prompt of N tokens (causal `scaled_dot_product_attention`) and decode steps of B requests over C cached
tokens each (GQA attention over a dense KV cache). With `profile.prefill_ctx` a prefill of N new tokens also runs
after C cached ones: each layer writes its N new K/V rows into a preallocated (C + N)-row cache and attends over all
of it with a lower-right causal mask (as serving engines do for a prefix-cache hit or a later chunk).
`profile.attn_kernel` picks torch's attention backend (flash, cudnn, efficient, math; auto: torch's choice).
`profile.layers` layers are timed (warm-up, then the
median of `repeats`; on CUDA with events, decode replayed from a CUDA graph as engines run it) and scaled by
model.layers / layers; embeddings, LM head, sampling and the engine's scheduler are left out (their fixed
cost lands in the fitted pass_overhead_s only as far as it scales). MoE experts run as one grouped GEMM per
projection where torch has one (no host sync). Measured with it on an H200: data/calibration/SOURCES.md.

Writes to DIR (each file atomically; fit.json last, so a run without it is incomplete):
  table.csv           cost.kind=table input (phase, tokens, kv, time_s; model, hardware: a scenario of
                      another model refuses it, of other hardware warns), checked by a short simulate();
                      use it with cost.kind=table +cost.params.path=DIR/table.csv
  measurements.csv    every grid point: measured and fitted seconds, relative error
  hardware_fit.yaml   the hardware profile with the fitted mfu, attn_mfu, mbu, pass_overhead_s (attn_mfu is fitted
                      apart from mfu when the grid has cached context, prefill_ctx > 0; else it equals mfu)
  profile.png         measured vs fitted (prefill_ctx.png: the prefill passes over new tokens and over context)
  fit.json            the fit (least squares of the roofline's own formula, relative errors), device, shape
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from omegaconf import DictConfig
from pdgym.agents.common import run_dir, to_container
from pdgym.agents.front_door import hydra_cli
from pdgym.envs.sim.config import ConfigError, CostConfig, InstanceConfig, check
from pdgym.envs.sim.cost import RooflineCost
from pdgym.envs.sim.hardware import HardwareProfile, load_hardware
from pdgym.envs.sim.metrics import atomic_path
from pdgym.envs.sim.models import ModelProfile, load_model
from pdgym.envs.sim.validation import check_bool, check_float, check_int

DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cpu", "cuda")
FIT_KEYS = ("mfu", "attn_mfu", "mbu", "pass_overhead_s")
ATTN_KERNELS = {"auto": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                "math": "MATH"}  # profile.attn_kernel -> torch.nn.attention.SDPBackend
PROFILE_KEYS = ("device", "dtype", "layers", "shrink", "ffn", "vocab", "prefill_tokens", "prefill_ctx", "attn_kernel",
                "decode_batch", "decode_ctx",
                "warmup", "repeats", "seed", "threads", "memory_limit_gb", "check_requests", "plots", "cuda_graph", "ep")
CHECK_KV_TOKENS = 1_000_000  # KV capacity of the check run's instances
HUGE = 1e30  # a peak so high that its roofline term vanishes: isolates the other one
# A derived MLP width is rounded to this multiple, as real models' widths are (Qwen3-8B 12288, Llama-3.1-8B 14336):
# params_total gives Qwen3-8B 12287, and that odd width sent cuBLAS to unaligned GEMMs, 2.5x slower on an H200.
ALIGN = 128


# --------------------------------------------------------------------------- settings and shape
@dataclass(frozen=True)
class Shape:
    """What is timed: one decoder layer's widths (after `shrink`) and the element size."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP width (0 for an MoE layer)
    experts: int
    top_k: int
    expert_ffn: int  # one routed expert's width
    shared_ffn: int  # shared experts, fused into one dense MLP (0 = none)
    elem: int  # bytes per element

    @property
    def attn_params(self) -> int:
        return self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_ffn

    @property
    def layer_params(self) -> int:
        """Non-routed parameters of one layer (attention, dense or shared MLP, router)."""
        return self.attn_params + 3 * self.hidden * (self.ffn + self.shared_ffn) + self.hidden * self.experts


@dataclass(frozen=True)
class Settings:
    hw: HardwareProfile
    model: ModelProfile
    shape: Shape
    device: str
    dtype: str
    layers: int
    prefill_tokens: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_ctx: tuple[int, ...]
    warmup: int
    repeats: int
    seed: int
    check_requests: int
    plots: bool
    shrink: int = 1
    threads: int | None = None
    cuda_graph: bool = True
    ep: int = 1
    prefill_ctx: tuple[int, ...] = (0,)
    attn_kernel: str = "auto"


def _int_list(v, key: str, lo: int = 1) -> tuple[int, ...]:
    ok = isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= lo for x in v)
    check(bool(ok), key, f"got {v!r}; must be a non-empty list of integers >= {lo}")
    return tuple(sorted(set(v)))


def _int(p: dict, k: str, lo: int, hi: float = math.inf) -> int:
    return check_int(p.get(k), f"profile.{k}", lo, hi=hi)


def model_shape(model: ModelProfile, shrink: int, ffn: int | None, vocab: int, elem: int, ep: int = 1) -> Shape:
    """A decoder layer of `model`: widths divided by `shrink` (heads too; head width kept). An MoE model is
    timed on its MoE layers (routed experts + shared experts); a dense one derives its MLP width from
    params_total unless `ffn` is given. With expert parallelism `ep`, one device's share: its experts / ep
    experts, which under balanced routing receive as many rows (tokens x top-k) as the device has tokens, the
    same as each token picking top-k of the local experts."""
    heads = max(1, model.num_heads // shrink)
    kv = max(1, min(heads, model.num_kv_heads // shrink))
    kv = math.gcd(heads, kv)  # query heads share KV heads evenly (GQA)
    hidden = max(1, model.hidden // shrink)
    check(ep == 1 or (model.num_experts > 0 and model.num_experts % ep == 0
                      and model.num_experts // ep >= model.experts_per_token),
          "profile.ep", f"got {ep}; must divide the {model.num_experts} routed experts and leave at least top-k "
          f"({model.experts_per_token}) on a device" if model.num_experts else f"got {ep}; {model.name} has no experts")
    if model.num_experts > 0:
        eff = max(1, round(model.expert_params / (3 * model.hidden)) // shrink)
        return Shape(hidden, heads, kv, model.head_dim, 0, model.num_experts // ep, model.experts_per_token, eff,
                     eff * model.shared_experts, elem)
    if ffn is None:
        attn = model.hidden * (model.num_heads + 2 * model.num_kv_heads) * model.head_dim \
            + model.num_heads * model.head_dim * model.hidden
        ffn = round(((model.params_total - 2 * vocab * model.hidden) / model.layers - attn) / (3 * model.hidden))
        check(ffn >= 1, "profile.ffn", f"deriving it from params_total with vocab {vocab} gives {ffn}; set profile.ffn")
        ffn = max(ALIGN, round(ffn / ALIGN) * ALIGN)
    return Shape(hidden, heads, kv, model.head_dim, max(1, ffn // shrink), 0, 0, 0, 0, elem)


def timed_model(model: ModelProfile, shape: Shape) -> ModelProfile:
    """The model profile of what is timed (model.layers of `shape`, no embeddings): the roofline of the fit."""
    L = model.layers
    moe = shape.experts > 0
    routed = L * shape.experts * shape.expert_params
    total = L * shape.layer_params + routed
    return ModelProfile(
        name=f"{model.name}_timed", params_total=float(total),
        params_active=float(total - routed + L * shape.top_k * shape.expert_params),
        layers=L, hidden=shape.hidden, num_heads=shape.heads, num_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim, attention="gqa",
        kv_bytes_per_token=2 * L * shape.kv_heads * shape.head_dim * shape.elem,
        num_experts=shape.experts, experts_per_token=shape.top_k,
        shared_experts=model.shared_experts if moe else 0, moe_layers=L if moe else 0,
        expert_params=float(shape.expert_params), weight_bytes=float(shape.elem),
        vocab_size=0, tie_word_embeddings=False,  # the timed decoder layers: no embedding, no LM head
        source=f"pdgym-profile workload of {model.name}")


def _device_and_dtype(device: str, dtype: str):
    import torch

    check(device in DEVICES, "profile.device", f"got {device!r}; allowed: {', '.join(DEVICES)}")
    check(dtype in DTYPES, "profile.dtype", f"got {dtype!r}; allowed: {', '.join(DTYPES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check(device == "cpu" or torch.cuda.is_available(), "profile.device", "cuda requested but torch sees no CUDA device")
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    return device, dtype


def footprint_bytes(s: Settings) -> float:
    """Weights of the timed layers + the largest KV cache + prefill activations (a generous estimate)."""
    sh = s.shape
    weights = s.layers * (sh.layer_params + sh.experts * sh.expert_params) * sh.elem
    kv_rows = max(max(s.decode_batch) * max(s.decode_ctx), max(s.prefill_ctx) + max(s.prefill_tokens))
    kv = s.layers * 2 * kv_rows * sh.kv_heads * sh.head_dim * sh.elem
    width = 4 * sh.hidden + (sh.heads + 2 * sh.kv_heads) * sh.head_dim + 3 * max(sh.ffn, sh.shared_ffn) \
        + 3 * sh.top_k * sh.expert_ffn + sh.experts
    act = 2 * max(*s.prefill_tokens, *s.decode_batch) * width * 4
    return weights + kv + act


def settings(cfg: DictConfig) -> Settings:
    """Every check before anything runs or is written."""
    data = to_container(cfg)
    p = data.get("profile")
    check(isinstance(p, dict), "profile", "missing; see conf/profile.yaml")
    allowed = PROFILE_KEYS
    unknown = sorted(set(p) - set(allowed))
    check(not unknown, f"profile.{unknown[0] if unknown else ''}", f"unknown key; allowed: {', '.join(allowed)}")
    hw = load_hardware(data.get("hardware"))
    model = load_model(data.get("model"))
    device, dtype = _device_and_dtype(p.get("device", "auto"), p.get("dtype", "auto"))
    shrink = _int(p, "shrink", 1)
    ffn = p.get("ffn")
    if ffn is not None:
        ffn = _int(p, "ffn", 1)
    vocab = _int(p, "vocab", 0)
    elem = 4 if dtype == "float32" else 2
    ep = _int(p, "ep", 1)
    shape = model_shape(model, shrink, ffn, vocab, elem, ep)
    check_bool(p.get("plots", True), "profile.plots")
    check_bool(p.get("cuda_graph", True), "profile.cuda_graph")
    kernel = p.get("attn_kernel", "auto")
    check(kernel in ATTN_KERNELS, "profile.attn_kernel", f"got {kernel!r}; allowed: {', '.join(ATTN_KERNELS)}")
    s = Settings(hw=hw, model=model, shape=shape, device=device, dtype=dtype,
                 layers=_int(p, "layers", 1, model.layers),
                 prefill_tokens=_int_list(p.get("prefill_tokens"), "profile.prefill_tokens"),
                 decode_batch=_int_list(p.get("decode_batch"), "profile.decode_batch"),
                 decode_ctx=_int_list(p.get("decode_ctx"), "profile.decode_ctx"),
                 warmup=_int(p, "warmup", 0), repeats=_int(p, "repeats", 1), seed=_int(p, "seed", 0),
                 check_requests=_int(p, "check_requests", 0), plots=p.get("plots", True), shrink=shrink,
                 threads=None if p.get("threads") is None else _int(p, "threads", 1),
                 cuda_graph=p.get("cuda_graph", True), ep=ep,
                 prefill_ctx=_int_list(p.get("prefill_ctx", [0]), "profile.prefill_ctx", lo=0), attn_kernel=kernel)
    limit = check_float(p.get("memory_limit_gb", 16.0), "profile.memory_limit_gb", 0.0, lo_open=True)
    need = footprint_bytes(s) / 1e9
    check(need <= limit, "profile.memory_limit_gb",
          f"the grid's largest point needs about {need:.1f} GB ({limit} allowed); shrink decode_batch x decode_ctx, "
          "prefill_tokens or layers, or raise the limit")
    return s


# --------------------------------------------------------------------------- the workload
def grouped_layout(torch, a, weights, offs):
    """`weights` ([E, K, N] each) in a memory layout that torch._grouped_mm accepts here (row-major, else
    K-major as CUDA kernels may want), or None where it runs in neither."""
    def k_major(w):
        return w.transpose(-2, -1).contiguous().transpose(-2, -1)

    for convert in (lambda w: w, k_major):
        ws = [convert(w) for w in weights]
        try:
            torch._grouped_mm(a[:, :ws[0].shape[-2]].contiguous(), ws[0], offs=offs)
            return ws
        except (RuntimeError, NotImplementedError):
            continue
    return None


class Layers:
    """`n` decoder layers of `shape` with random weights: RMSNorm, fused QKV, SDPA, output projection,
    RMSNorm, SwiGLU MLP or top-k MoE (+ shared experts), residuals."""

    def __init__(self, shape: Shape, n: int, device: str, dtype: str, seed: int):
        import torch

        self.torch, self.shape, self.device = torch, shape, device
        self.dtype = getattr(torch, dtype)
        g = torch.Generator(device="cpu").manual_seed(seed)
        sh = shape

        def w(*dims):
            return (torch.randn(*dims, generator=g) / math.sqrt(dims[-2])).to(device=device, dtype=self.dtype)

        self.layers = []
        for _ in range(n):
            lay = {"qkv": w(sh.hidden, (sh.heads + 2 * sh.kv_heads) * sh.head_dim),
                   "o": w(sh.heads * sh.head_dim, sh.hidden),
                   "n1": torch.ones(sh.hidden, device=device, dtype=self.dtype),
                   "n2": torch.ones(sh.hidden, device=device, dtype=self.dtype)}
            if sh.ffn or sh.shared_ffn:
                width = sh.ffn or sh.shared_ffn
                lay["up"], lay["down"] = w(sh.hidden, 2 * width), w(width, sh.hidden)
            if sh.experts:
                lay["router"] = w(sh.hidden, sh.experts)
                lay["e_up"] = w(sh.experts, sh.hidden, 2 * sh.expert_ffn)
                lay["e_down"] = w(sh.experts, sh.expert_ffn, sh.hidden)
            self.layers.append(lay)
        self.k_cache: list = []
        self.v_cache: list = []
        self.probe_grouped()

    def alloc_kv(self, batch: int, ctx: int) -> None:  # decode: ctx cached rows; prefill after c: c + n rows
        torch, sh = self.torch, self.shape
        dims = (batch, sh.kv_heads, ctx, sh.head_dim)
        self.k_cache = [torch.randn(dims, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.v_cache = [torch.randn(dims, device=self.device, dtype=self.dtype) for _ in self.layers]

    @staticmethod
    def _norm(x, wt):
        return x * (x.float().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt().to(x.dtype) * wt

    def _mlp(self, x, up, down):
        F = self.torch.nn.functional
        a, b = (x @ up).chunk(2, dim=-1)
        return (F.silu(a) * b) @ down

    def _moe(self, x, lay):
        """Top-k routing, then each expert's SwiGLU over its rows: one grouped GEMM per projection
        (`torch._grouped_mm`, no host sync, so a CUDA graph can hold it) where torch has it for this device and
        dtype, else one GEMM per expert (`moe_kernel` in fit.json says which ran)."""
        torch, sh = self.torch, self.shape
        flat = x.reshape(-1, sh.hidden)
        probs = torch.softmax((flat @ lay["router"]).float(), dim=-1)
        weight, idx = probs.topk(sh.top_k, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype).flatten()
        flat_idx = idx.flatten()
        order = flat_idx.argsort()
        rows = order // sh.top_k
        xs = flat[rows]
        counts = torch.zeros(sh.experts, dtype=torch.int64, device=flat.device).scatter_add_(
            0, flat_idx, torch.ones_like(flat_idx))  # rows per expert: bincount's output size syncs with the host
        if self.grouped:
            offs = counts.cumsum(0).to(torch.int32)
            a, b = torch._grouped_mm(xs, lay["e_up"], offs=offs).chunk(2, dim=-1)
            y = torch._grouped_mm(self.torch.nn.functional.silu(a) * b, lay["e_down"], offs=offs)
        else:
            outs, start = [], 0
            for e, c in enumerate(counts.tolist()):
                if c:
                    outs.append(self._mlp(xs[start:start + c], lay["e_up"][e], lay["e_down"][e]))
                    start += c
            y = torch.cat(outs)
        y = y * weight[order, None]
        out = torch.zeros_like(flat).index_add_(0, rows, y)
        if sh.shared_ffn:
            out = out + self._mlp(flat, lay["up"], lay["down"])
        return out.reshape(x.shape)

    def probe_grouped(self) -> None:
        """Use the grouped GEMM if torch runs it here (in either weight layout) and it agrees with the loop."""
        torch, sh = self.torch, self.shape
        self.grouped = False
        if not sh.experts or not hasattr(torch, "_grouped_mm") or not self.layers:
            return
        x = torch.randn(1, 64, sh.hidden, device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            ref = self._moe(x, self.layers[0])
            probe = x.reshape(-1, sh.hidden)[:, None, :].expand(-1, 2, -1).reshape(-1, sh.hidden)
            offs = torch.full((sh.experts,), 128, device=self.device, dtype=torch.int32)
            offs[0] = 64  # two groups of 64 rows, the other experts empty
            for lay in self.layers:
                ws = grouped_layout(torch, probe, [lay["e_up"], lay["e_down"]], offs)
                if ws is None:
                    return
                lay["e_up"], lay["e_down"] = ws
            self.grouped = True
            got = self._moe(x, self.layers[0])
        scale = float(ref.abs().max()) or 1.0
        self.grouped = float((got - ref).abs().max()) <= 0.05 * scale

    def forward(self, x, decode: bool, ctx: int = 0) -> None:
        """x: [B, T, hidden]; prefill: one prompt (B = 1) with causal attention, after `ctx` cached tokens (its K/V
        written into rows ctx.. of the preallocated cache, a lower-right causal mask over all); decode: T = 1 over
        the KV cache."""
        F, sh = self.torch.nn.functional, self.shape
        B, T, _ = x.shape
        mask = None
        if ctx and not decode:
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(T, ctx + T)
        for i, lay in enumerate(self.layers):
            h = self._norm(x, lay["n1"]) @ lay["qkv"]
            q, k, v = h.split([sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.kv_heads * sh.head_dim], -1)
            q = q.view(B, T, sh.heads, sh.head_dim).transpose(1, 2)
            if decode:
                k, v = self.k_cache[i], self.v_cache[i]
            else:
                k = k.view(B, T, sh.kv_heads, sh.head_dim).transpose(1, 2)
                v = v.view(B, T, sh.kv_heads, sh.head_dim).transpose(1, 2)
                if ctx:
                    self.k_cache[i][:, :, ctx:] = k
                    self.v_cache[i][:, :, ctx:] = v
                    k, v = self.k_cache[i], self.v_cache[i]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not decode and mask is None,
                                               enable_gqa=sh.heads != sh.kv_heads)
            x = x + a.transpose(1, 2).reshape(B, T, sh.heads * sh.head_dim) @ lay["o"]
            h = self._norm(x, lay["n2"])
            x = x + (self._moe(h, lay) if sh.experts else self._mlp(h, lay["up"], lay["down"]))
        return x


def time_call(torch, fn, device: str, warmup: int, repeats: int, graph: bool = False) -> float:
    """Median seconds of fn() after `warmup` calls. On CUDA, timed with events; with `graph`, replayed from a
    CUDA graph (kernel time without host launch gaps), as serving engines run decode steps and as
    data/calibration's H100 decode rows were measured. On a CPU, wall time."""
    cuda = device == "cuda"
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        run = fn
        if cuda and graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
            run()
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


@contextlib.contextmanager
def attention_backend(torch, kernel: str, point: str):
    """scaled_dot_product_attention pinned to profile.attn_kernel (auto: torch chooses); a backend torch cannot run
    here is one line naming the key, not a traceback."""
    if ATTN_KERNELS[kernel] is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel([getattr(SDPBackend, ATTN_KERNELS[kernel])]):
            yield
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"profile.attn_kernel: torch's {kernel} kernel does not run the {point} here ({first}); "
                          "allowed here: another of " + ", ".join(ATTN_KERNELS)) from None


def measure(s: Settings, progress=print) -> pd.DataFrame:
    """Median seconds of the timed layers per grid point, and scaled to model.layers (time_s)."""
    import torch

    torch.manual_seed(s.seed)
    if s.threads is not None:
        torch.set_num_threads(s.threads)
    layers = Layers(s.shape, s.layers, s.device, s.dtype, s.seed)
    scale = s.model.layers / s.layers
    graph = s.cuda_graph and s.device == "cuda" and (layers.grouped or not s.shape.experts)  # a loop syncs
    rows = []

    def x(b, t):
        return torch.randn(b, t, s.shape.hidden, device=s.device, dtype=layers.dtype)

    for c in s.prefill_ctx:
        for n in s.prefill_tokens:  # (a backend that cannot run this point: one line naming profile.attn_kernel)
            if c:
                layers.alloc_kv(1, c + n)
            with attention_backend(torch, s.attn_kernel, f"prefill of {n} after {c}"):
                t = time_call(torch, functools.partial(layers.forward, x(1, n), False, c), s.device, s.warmup,
                              s.repeats)
            rows.append({"phase": "prefill", "batch": 1, "tokens_per_req": n, "ctx": c, "timed_s": t,
                         "cuda_graph": False})
            progress(f"prefill {n:>6} tokens after {c:>6}: {t * scale * 1e3:9.3f} ms")
        layers.k_cache = layers.v_cache = []
    for c in s.decode_ctx:
        for b in s.decode_batch:
            layers.alloc_kv(b, c)
            step = functools.partial(layers.forward, x(b, 1), True)
            with attention_backend(torch, s.attn_kernel, f"decode of {b} x {c}"):
                t = time_call(torch, step, s.device, s.warmup, s.repeats, graph)
            rows.append({"phase": "decode", "batch": b, "tokens_per_req": 1, "ctx": c, "timed_s": t,
                         "cuda_graph": graph})
            progress(f"decode  {b:>4} x {c:>6} ctx: {t * scale * 1e3:9.3f} ms")
        layers.k_cache = layers.v_cache = []
    df = pd.DataFrame(rows)
    df["tokens"] = df.batch * df.tokens_per_req
    df["kv"] = df.batch * df.ctx
    df["time_s"] = df.timed_s * scale
    df["moe_kernel"] = ("grouped" if layers.grouped else "loop") if s.shape.experts else "none"
    return df


# --------------------------------------------------------------------------- the table and the fit
def table_frame(df: pd.DataFrame, model: str, hardware: str) -> pd.DataFrame:
    """cost.kind=table rows: prefill over tokens; decode over KV tokens read (points with the same KV
    count averaged, so np.interp sees strictly increasing x; prefill after cached context is the fit's, not the
    table's: the table has no context axis); each row names the model and hardware timed,
    which the table cost model checks against the scenario's (envs/sim/cost.TableCost)."""
    pre = df[(df.phase == "prefill") & (df.ctx == 0)].groupby("tokens", as_index=False).time_s.mean()
    pre = pre.assign(phase="prefill", kv="")
    dec = df[df.phase == "decode"].groupby("kv", as_index=False).agg(tokens=("batch", "mean"), time_s=("time_s", "mean"))
    dec = dec.assign(phase="decode", tokens=dec.tokens.round().astype(int))
    out = pd.concat([pre, dec])[["phase", "tokens", "kv", "time_s"]].reset_index(drop=True)
    return out.assign(model=model, hardware=hardware)


def ideal_terms(hw: HardwareProfile, model: ModelProfile, df: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """Seconds of each point's GEMM FLOPs at peak, attention FLOPs at the BF16 peak and bytes at peak bandwidth,
    from roofline.py's own RooflineCost (one unit, tp = ep = 1): the other terms' peaks set so high that they
    vanish. A prefill of n tokens after c cached ones has n (c + n / 2) attention pairs per prompt."""
    base = dict(mfu=1.0, attn_mfu=1.0, mbu=1.0, pass_overhead_s=0.0, interference=0.0, hbm_bw=HUGE)
    one = InstanceConfig(count=1)
    costs = (RooflineCost(dataclasses.replace(hw, **{**base, "attn_mfu": HUGE}), model, one),
             RooflineCost(dataclasses.replace(hw, **{**base, "mfu": HUGE}), model, one),
             RooflineCost(dataclasses.replace(hw, **{**base, "hbm_bw": hw.hbm_bw}, flops_bf16=HUGE, flops_fp8=HUGE),
                          model, one))
    z = np.zeros(1)
    out = []
    for cost in costs:
        t = []
        for r in df.itertuples():
            if r.phase == "prefill":
                n, pairs = float(r.batch * r.tokens_per_req), r.batch * r.tokens_per_req * (r.ctx + r.tokens_per_req / 2)
                t.append(cost.pass_time(np.array([n]), np.array([float(pairs)]), z, z))
            else:
                t.append(cost.pass_time(z, z, np.array([float(r.batch)]), np.array([float(r.batch * r.ctx)])))
        out.append(np.array(t))
    return tuple(out)


def roofline_time(c: np.ndarray, m: np.ndarray, mfu: float, mbu: float, overhead: float,
                  a: np.ndarray | float = 0.0, attn_mfu: float = 1.0) -> np.ndarray:
    """RooflineCost's pass time of one unit: overhead + max(GEMM FLOPs / (peak mfu) + attention FLOPs / (peak
    attn_mfu), bytes / (bw mbu))."""
    return overhead + np.maximum(c / mfu + a / attn_mfu, m / mbu)


FIT_PARAMS = 3  # mfu, mbu, pass_overhead_s (+ attn_mfu when the grid has cached context)


def fit_roofline(hw: HardwareProfile, model: ModelProfile, df: pd.DataFrame) -> dict:
    """mfu, attn_mfu, mbu, pass_overhead_s minimising the squared relative error of the roofline against df.time_s.
    attn_mfu is a parameter of its own only when prefill points have cached context (df.ctx > 0), where attention
    is separable from the GEMMs; otherwise it equals mfu (one efficiency for all matrix work)."""
    from scipy.optimize import least_squares

    c, a, m = ideal_terms(hw, model, df)
    t = df.time_s.to_numpy(dtype=float)
    check(bool(np.all(t > 0)), "profile", "a measured time is not positive (timer resolution?)")
    own_attn = bool(((df.phase == "prefill") & (df.ctx > 0)).any())

    def resid(x):  # x: log(1 / mfu), log(1 / mbu), overhead / fastest point, log(1 / attn_mfu)
        ia = math.exp(x[3]) if own_attn else math.exp(x[0])
        return (x[2] * t.min() + np.maximum(c * math.exp(x[0]) + a * ia, m * math.exp(x[1]))) / t - 1.0

    a0, b0 = np.log(np.min(t / (c + a))), np.log(np.min(t / m))  # upper bounds: every point >= the terms
    best = None
    for frac in (0.0, 0.1, 0.5):  # overhead as a fraction of the fastest point
        start = np.array([a0 + math.log(1 - frac), b0 + math.log(1 - frac), frac, a0 + math.log(1 - frac)])
        r = least_squares(resid, start, bounds=([-np.inf, -np.inf, 0.0, -np.inf], [np.inf, np.inf, 1.0, np.inf]),
                          xtol=1e-12, ftol=1e-12)
        if best is None or r.cost < best.cost:
            best = r
    mfu, mbu, over = math.exp(-best.x[0]), math.exp(-best.x[1]), float(best.x[2]) * t.min()
    attn_mfu = math.exp(-best.x[3]) if own_attn else mfu
    fitted = roofline_time(c, m, mfu, mbu, over, a, attn_mfu)
    rel = fitted / t - 1.0
    return {"mfu": mfu, "attn_mfu": attn_mfu, "mbu": mbu, "pass_overhead_s": over, "fitted_s": fitted,
            "rel_err": rel, "compute_bound": c / mfu + a / attn_mfu >= m / mbu, "attn_fitted": own_attn}


def check_table(s: Settings, cfg: DictConfig, path: Path) -> dict:
    """A short simulate() with cost.kind=table and the written CSV: the file must load and drive a run."""
    from pdgym.envs.sim import simulate
    from pdgym.envs.sim.config import sim_config

    data = to_container(cfg)
    sim = {k: data[k] for k in ("hardware", "model", "cluster", "workload") if k in data}
    cluster = dict(sim.get("cluster") or {})
    for engine in ("prefill", "decode", "colocated"):  # a table holds no weights: the check needs no memory fit
        if isinstance(cluster.get(engine), dict):
            cluster[engine] = {**cluster[engine], "kv_capacity_tokens": CHECK_KV_TOKENS}
    sim["cluster"] = cluster
    sim["workload"] = {**sim.get("workload", {}), "num_requests": s.check_requests}
    sim["cost"] = CostConfig(kind="table", params={"path": str(path)})
    res = simulate(sim_config(sim), seed=s.seed)
    met = res.metrics()
    return {k: met.get(k) for k in ("finished", "ttft_mean", "tpot_mean", "throughput_tok_s")}


def hardware_yaml(hw: HardwareProfile, fit: dict, s: Settings) -> str:
    prof = dataclasses.asdict(hw)
    prof.update(name=f"{hw.name}_profiled", mfu=float(f"{fit['mfu']:.4g}"), attn_mfu=float(f"{fit['attn_mfu']:.4g}"),
                mbu=float(f"{fit['mbu']:.4g}"),
                pass_overhead_s=float(f"{fit['pass_overhead_s']:.4g}"),
                source=f"{hw.source} | mfu, {'attn_mfu, ' if fit['attn_fitted'] else ''}mbu, pass_overhead_s fitted "
                       f"by pdgym-profile ({s.model.name}, {s.device} {s.dtype}, shrink {s.shrink}, ep {s.ep}, "
                       f"attention kernel {s.attn_kernel})")
    head = (f"# pdgym-profile fit for hardware {hw.name} (peaks as configured: flops_bf16 {hw.flops_bf16:.4g} FLOP/s, "
            f"hbm_bw {hw.hbm_bw:.4g} B/s).\n# Copy to conf/hardware/NAME.yaml, or merge mfu, attn_mfu, mbu, pass_overhead_s.\n")
    out_of_range = [k for k in ("mfu", "attn_mfu", "mbu") if not 0 < prof[k] <= 1]
    if out_of_range:
        head += (f"# WARNING: {', '.join(out_of_range)} outside (0, 1]: the configured peaks are below what was "
                 "measured; fix the peaks before using this profile.\n")
    return head + yaml.safe_dump(prof, sort_keys=False)


# --------------------------------------------------------------------------- the app
@hydra_cli("pdgym-profile", "profile", validate=settings)
def main(cfg: DictConfig) -> dict:
    import torch

    s = settings(cfg)
    out = run_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "fit.json").unlink(missing_ok=True)  # a reused run folder: its old result must not stand
    sh = s.shape
    print(f"profiling {s.model.name} on {s.device} ({s.dtype}): {s.layers} of {s.model.layers} layers, hidden "
          f"{sh.hidden}, heads {sh.heads}/{sh.kv_heads} x {sh.head_dim}, "
          + (f"{sh.experts} experts top-{sh.top_k} x {sh.expert_ffn}" if sh.experts else f"MLP {sh.ffn}"))
    df = measure(s)
    with atomic_path(out / "table.csv") as tmp:
        table_frame(df, s.model.name, s.hw.name).to_csv(tmp, index=False)
    check_run = check_table(s, cfg, out / "table.csv") if s.check_requests else None
    fit = fit_roofline(s.hw, timed_model(s.model, sh), df)
    df = df.assign(fitted_s=fit["fitted_s"], rel_err=fit["rel_err"],
                   bound=np.where(fit["compute_bound"], "compute", "memory"))
    with atomic_path(out / "measurements.csv") as tmp:
        df.to_csv(tmp, index=False)
    with atomic_path(out / "hardware_fit.yaml") as tmp:
        tmp.write_text(hardware_yaml(s.hw, fit, s))
    n_params = FIT_PARAMS + fit["attn_fitted"]
    if s.plots:
        from pdgym.agents.experiments.calibration import ctx_figure
        from pdgym.agents.plots import profile_fit

        part = "".join(f", {k} {v}" for k, v in (("ep", s.ep), ("shrink", s.shrink)) if v != 1)
        title = (f"{s.model.name}{part} on {s.device} {s.dtype} (hardware {s.hw.name}, attention {s.attn_kernel}): "
                 f"mfu {fit['mfu']:.3g}, attn_mfu {fit['attn_mfu']:.3g}, mbu {fit['mbu']:.3g}, overhead "
                 f"{fit['pass_overhead_s'] * 1e3:.3g} ms")
        with atomic_path(out / "profile.png") as tmp:  # prefill without context here; with it, prefill_ctx.png
            profile_fit(df[(df.phase == "decode") | (df.ctx == 0)], tmp, title)
        if len(s.prefill_ctx) > 1:
            pre = df[df.phase == "prefill"]
            with atomic_path(out / "prefill_ctx.png") as tmp:
                ctx_figure(pd.DataFrame({"n": pre.tokens_per_req, "c": pre.ctx, "time_s": pre.time_s,
                                         "fitted_s": pre.fitted_s}), tmp, title + ": points measured, lines fitted")
    rel = np.abs(fit["rel_err"])
    summary = {
        "hardware": s.hw.name, "model": s.model.name, "mfu": fit["mfu"], "attn_mfu": fit["attn_mfu"],
        "attn_fitted": fit["attn_fitted"], "attn_kernel": s.attn_kernel, "prefill_ctx": list(s.prefill_ctx),
        "mbu": fit["mbu"],
        "pass_overhead_s": fit["pass_overhead_s"], "rel_err_rms": float(np.sqrt(np.mean(fit["rel_err"] ** 2))),
        "rel_err_max": float(rel.max()),
        "rel_err_max_by_phase": {ph: float(rel[df.phase == ph].max()) for ph in ("prefill", "decode")},
        "points": len(df), "check_run": check_run,
        "device": s.device, "device_name": torch.cuda.get_device_name() if s.device == "cuda" else platform.processor()
        or platform.machine(), "dtype": s.dtype, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "timed_layers": s.layers, "ep": s.ep, "shape": dataclasses.asdict(sh), "warmup": s.warmup, "repeats": s.repeats,
        "decode_cuda_graph": bool(df.cuda_graph[df.phase == "decode"].all()),
        "moe_kernel": str(df.moe_kernel.iloc[0]),
        # three parameters (four with attn_mfu): with no more points (or one phase alone) the fit can be exact
        "determined": bool(len(df) > n_params and df.phase.nunique() == 2),
    }
    with atomic_path(out / "fit.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"fit: mfu {fit['mfu']:.4g}, attn_mfu {fit['attn_mfu']:.4g}{'' if fit['attn_fitted'] else ' (= mfu)'}, "
          f"mbu {fit['mbu']:.4g}, pass_overhead_s {fit['pass_overhead_s']:.4g} "
          f"(relative error rms {summary['rel_err_rms']:.1%}, max {summary['rel_err_max']:.1%})")
    if not summary["determined"]:
        print(f"warning: {len(df)} points ({', '.join(sorted(df.phase.unique()))}) for {n_params} parameters: the "
              "fit is underdetermined and its errors say nothing; give more profile.prefill_tokens / decode_batch "
              "points, of both phases")
    print(f"results in {out}")
    print(f"to simulate with the table, add to a pdgym-sim run of the same model ({s.model.name}) and hardware: "
          f"cost.kind=table +cost.params.path={out / 'table.csv'}")
    return summary


if __name__ == "__main__":
    main()
