"""Cost models from measured or published curves: the EB linear form, the batching study's piecewise-linear
service curve, a measured timing table; and the EB form's fit to any cost model (linear_coefficients)."""

from __future__ import annotations

import csv
import io
import math
import types
import warnings
from collections.abc import Mapping

import numpy as np

from . import safe_files
from .cost_model import CostModel
from .notices import CostWarning
from .shell import app_command
from .validation import ConfigError, check

# Published EB calibration, H200 + Qwen3-8B (ALGORITHMS.md s5). a_mb and b_kv were not
# published: with kind=linear they are fitted from the roofline of the configured hardware.
EB_H200_QWEN3_8B = types.MappingProxyType({
    "a_p": 1.279e-3, "b_p": 2.485e-5, "a_d": 8.921e-3, "b_d": 4.586e-5,
    "c0": 2.494e-5, "c1": 5.193e-5, "c2": 1.478e-5,
})


class LinearCost(CostModel):
    """The EB form per unit: prefill a_p + b_p tokens, decode a_d + b_d reqs (+ b_kv kv),
    mixed a_mb + (c0 + c1 r + c2 r^2) (tokens + reqs) with r the decode share; the
    instance takes the max over units and nothing else. Idle units cost 0."""

    KEYS = ("a_p", "b_p", "a_d", "b_d", "b_kv", "a_mb", "c0", "c1", "c2")

    def __init__(self, dp: int, coef: Mapping[str, float]):
        super().__init__(dp)
        for name in self.KEYS:
            setattr(self, name, float(coef.get(name, 0.0)))

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends=None) -> float:
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


class PiecewiseLinearCost(CostModel):
    """The batching study's service curve per unit: c + a * max(0, b - b0), b = prefill tokens +
    decode requests; a unit without work costs 0; the instance takes the max."""

    def __init__(self, dp: int, c: float, a: float, b0: float):
        super().__init__(dp)
        self.c, self.a, self.b0 = c, a, b0

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends=None) -> float:
        b = prefill_tokens + decode_reqs
        unit = np.where(b > 0, self.c + self.a * np.maximum(b - self.b0, 0.0), 0.0)
        return self._barrier(unit)


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
                              f"it ({app_command('pdgym-profile')} model={model} hardware=...) or use a scenario of "
                              f"{named['model'][0]}")
        if hardware is not None and "hardware" in named and named["hardware"][0] != hardware:
            warnings.warn(f"{key}: {path} was timed on hardware {named['hardware'][0]}; the scenario runs {hardware}, "
                          f"and its passes take {named['hardware'][0]}'s times (right for one silicon, e.g. h100 -> "
                          f"h800; for {hardware}'s own: {app_command('pdgym-profile')} hardware={hardware})",
                          CostWarning, stacklevel=2)

    def pass_time(self, prefill_tokens, prefill_attn, decode_reqs, decode_kv, prompt_ends=None) -> float:
        dx = decode_kv if self.by_kv else decode_reqs
        unit = (np.where(prefill_tokens > 0, np.interp(prefill_tokens, self.xp, self.yp), 0.0)
                + np.where(decode_reqs > 0, np.interp(dx, self.xd, self.yd), 0.0))
        return self._barrier(unit)


def linear_coefficients(cost: CostModel, mean_prompt: float, mean_ctx: float) -> dict[str, float]:
    """Fit the EB linear form to any cost model by non-negative least squares, every unit equally loaded.

    Prefill phase of L = j x mean_prompt tokens (j whole prompts, j LM-head tokens): a_p + b_p L. Decode
    iteration of n requests with mean_ctx KV tokens each: a_d + b_d n. Mixed batch of T
    tokens with decode share r (prefill pieces from mean_prompt-token prompts):
    a_mb + (c0 + c1 r + c2 r^2) T. Returns a_p, b_p, a_d, b_d, a_mb, c0, c1, c2.
    """
    ones = np.ones(cost.dp)

    def t(pt, pa, dr, dk):  # prefill pieces of mean_prompt-token prompts: pt / mean_prompt of them end here
        return cost.pass_time(ones * pt, ones * pa, ones * dr, ones * dk, ones * (pt / mean_prompt))

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
