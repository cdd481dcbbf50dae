"""How close torch's FP8 GEMMs come to the FP8 peak at the DeepSeek-V3 routed-expert shape (a GPU measurement).

    python data/calibration/fp8_gemm_probe.py        (a CUDA GPU with FP8: Hopper or later)

The prefill slice (ds_v3_prefill_slice.py) quantises activations inside the timed pass, in separate kernels, as
a plain torch engine would; a production engine fuses that quantisation into the kernel before. This probe times
the GEMMs alone on pre-quantised inputs: 16 experts x 768 rows, 7168 -> 4096 (one device's gate / up projection
at the full 3K chunk, DP 8 / EP 16), per expert and grouped, per-tensor and row-wise scales, with and without
fast accumulation; and one large dense GEMM as the ceiling. CUDA-graph replay, median of 20 after 3 warm-ups
(pdgym-profile's `time_call`, so pdgym must be importable). Prints one line per variant (TFLOP/s); results:
data/calibration/SOURCES.md.
"""

from __future__ import annotations

import sys

EXPERTS, ROWS, K, N = 16, 768, 7168, 4096  # the routed experts' gate / up GEMM of one device at the full chunk
DENSE = (8192, 7168, 18432)  # a large dense GEMM: the ceiling


def variants(torch):
    """(name, FLOPs, callable) for every GEMM variant timed."""
    dev, f8 = "cuda", torch.float8_e4m3fn
    x = torch.randn(EXPERTS * ROWS, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(EXPERTS, N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5
    offs = torch.arange(ROWS, EXPERTS * ROWS + 1, ROWS, device=dev, dtype=torch.int32)
    xq, wq = x.to(f8), w.to(f8)
    one = torch.ones((), device=dev)
    flops = 2.0 * EXPERTS * ROWS * K * N
    out = [("bf16 grouped_mm", flops, lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))]

    def per_expert(fast: bool, rowwise: bool):
        sa = torch.ones(ROWS, 1, device=dev) if rowwise else one
        sb = torch.ones(1, N, device=dev) if rowwise else one
        return lambda: [torch._scaled_mm(xq[e * ROWS:(e + 1) * ROWS], wq[e].t(), scale_a=sa, scale_b=sb,
                                         out_dtype=torch.bfloat16, use_fast_accum=fast) for e in range(EXPERTS)]

    for fast in (False, True):
        for rowwise in (False, True):
            out.append((f"fp8 per-expert scaled_mm fast_accum={fast} rowwise={rowwise}", flops,
                        per_expert(fast, rowwise)))
    if hasattr(torch, "_scaled_grouped_mm"):
        sa, sb = torch.ones(EXPERTS * ROWS, device=dev), torch.ones(EXPERTS, N, device=dev)
        out.append(("fp8 _scaled_grouped_mm rowwise fast_accum=True", flops,
                    lambda: torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sa, sb, offs=offs,
                                                     out_dtype=torch.bfloat16, use_fast_accum=True)))
    m, k, n = DENSE
    a = torch.randn(m, k, device=dev).to(f8)
    b = torch.randn(n, k, device=dev).to(f8).t()
    for fast in (False, True):
        out.append((f"fp8 dense {m}x{k}x{n} fast_accum={fast}", 2.0 * m * k * n,
                    lambda fast=fast: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                       use_fast_accum=fast)))
    ab, bb = a.to(torch.bfloat16), b.to(torch.bfloat16)
    out.append((f"bf16 dense {m}x{k}x{n}", 2.0 * m * k * n, lambda: ab @ bb))
    return out


def main() -> int:
    import torch
    from pdgym.agents.apps.profile import time_call

    if not torch.cuda.is_available():
        print("fp8_gemm_probe: error: needs a CUDA GPU with FP8 (Hopper or later)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__)
    for name, flops, fn in variants(torch):
        try:
            print(f"{name}: {flops / time_call(torch, fn, 'cuda', 3, 20, graph=True) / 1e12:.0f} TFLOP/s")
        except (RuntimeError, NotImplementedError) as e:  # a variant this torch / GPU lacks: said, not fatal
            print(f"{name}: not available ({str(e).splitlines()[0][:120]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
