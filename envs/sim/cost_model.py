"""The cost-model contract: one forward pass's work per DP unit -> seconds.

Every model sees the same four float vectors of length `dp` (one entry per DP unit):
prefill tokens, prefill attention token-pairs, decode requests and the KV tokens those
decodes read; and optionally a fifth, the prompts that end in the pass (their last token
runs the LM head). The instance's pass time is the barrier: the slowest unit sets it, so
`pass_time` returns fixed costs + max over units, and records how long the other
units sat idle (`last_idle_frac`). `pass_time` is the simulator's inner loop: each
model precomputes its constants in __init__ and spends a few NumPy ops per call.
The models: roofline.py (RooflineCost), curves.py (linear, piecewise linear, table); cost.py builds them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import numpy as np


class CostModel(abc.ABC):
    """Time of one forward pass of an instance with `dp` barrier-synchronised DP units."""

    last_idle_frac: float = 0.0  # mean over units of (max_unit - unit) / max_unit, last call
    last_unit: np.ndarray | None = None  # per-unit compute seconds of the last call (before the barrier max)
    decode_kernel: Callable | None = None  # engine=numba: (reqs, kv) -> a decode-only pass_time (compiled.py)
    prefill_kernel: Callable | None = None  # engine=numba: (tokens, attn, ends) -> a prefill-only pass_time
    route_kernel: Callable | None = None  # engine=numba: a decode instance's default least-KV round (compiled.py)
    finish_kernel: Callable | None = None  # engine=numba: a decode step's finishes (compiled.py)
    pass_time1: Callable | None = None  # one unit (dp = 1): (tokens, attn, reqs, kv, ends) floats -> pass_time's value

    def __init__(self, dp: int):
        self.dp = dp
        self._ones = np.ones(dp)  # x.dot(ones) is the cheapest sum of a small vector

    @abc.abstractmethod
    def pass_time(self, prefill_tokens: np.ndarray, prefill_attn: np.ndarray,
                  decode_reqs: np.ndarray, decode_kv: np.ndarray, prompt_ends: np.ndarray | None = None) -> float:
        """Seconds for one pass; each argument has one entry per DP unit, all >= 0.

        prefill_attn[d] = sum over the prompt pieces on unit d of
        piece_len * (prior_context + piece_len / 2) (prior_context: cached prefix and earlier
        chunks alike); decode_kv[d] = KV tokens read by the decode_reqs[d] requests (one new
        token each); prompt_ends[d] = prompts whose last token is in this pass (each runs the
        LM head once; a chunk that does not end its prompt runs none); None: no prompt ends.
        """

    def _barrier(self, unit: np.ndarray) -> float:
        self.last_unit = unit
        mx = float(unit.max())
        self.last_idle_frac = 1.0 - float(unit.dot(self._ones)) / (mx * self.dp) if mx > 0 else 0.0
        return mx
