"""IQR-aware lexicographic decode scheduling (SBS Algorithm 3; ALGORITHMS.md s3).

The requests entering decode at a step boundary (the pool) are sorted by total sequence length,
descending (the KV each brings: prompt + tokens produced), so the heaviest are placed while the
most choice is left. For each one: the KV loads K of all decode units give Q1, Q3 and the threshold
Q3 + k (Q3 - Q1) (Tukey's fence, k = 1.5); units at or under it are safe (every unit that can take
the request if none is); among the safe units that can take it (a free slot, KV room) the one with
the lexicographically smallest (B_i, K_i) wins: the fewest running requests, then the least KV.
The fence keeps requests off outlier units, the batch-size key spreads the per-request compute of
the barrier-synchronised step, and the KV key breaks ties toward the lighter unit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import DecodeRouter

from .registry import register
from .routers import LoadOrder

if TYPE_CHECKING:  # pragma: no cover
    from pdgym.envs.sim.view import SimView


def _quartiles(x: np.ndarray) -> tuple[float, float]:
    """Q1 and Q3 with linear interpolation (numpy.percentile's default), without its overhead."""
    v = np.sort(x)
    out = []
    for q in (0.25, 0.75):
        pos = q * (len(v) - 1)
        i = int(pos)
        j = min(i + 1, len(v) - 1)
        out.append(float(v[i] + (pos - i) * (v[j] - v[i])))
    return out[0], out[1]


def iqr_choice(batch: np.ndarray, kv: np.ndarray, ok: np.ndarray, k: float) -> int:
    """The unit for one request: lexicographically smallest (B, K) among the units that can take it
    (`ok`) and sit at or under the fence Q3 + k IQR of all units' KV (all of `ok` if none does)."""
    q1, q3 = _quartiles(kv)
    safe = ok & (kv <= q3 + k * (q3 - q1))
    cand = np.flatnonzero(safe if safe.any() else ok)
    return int(cand[np.lexsort((kv[cand], batch[cand]))[0]])


@register("decode", "iqr")
class IQRRouter(DecodeRouter):
    """SBS Algorithm 3: length pre-sort, Q3 + k IQR masking, lexicographic (batch size, KV) choice."""

    def __init__(self, k: float = 1.5):
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not k >= 0:
            raise ConfigError(f"policy.decode.k: got {k!r}; must be a number >= 0 (Tukey's fence: 1.5)")
        self.k = float(k)
        self._order = LoadOrder()

    def reset(self, sim):
        self._order = LoadOrder()

    def route(self, sim: SimView, inst: int) -> None:
        """Requests heaviest first; one that fits no free unit is passed over, so the next admission is
        the heaviest request that fits the largest free room, found by bisection (`LoadOrder`)."""
        d = sim.decode[inst]
        order = self._order
        order.sync(sim)
        while True:
            free = d.batch < d.batch_limit
            if not free.any():
                return
            _, e = order.first_fitting(sim, int((d.kv_cap - d.kv)[free].max()))
            if e is None:
                return
            ok = free & (d.kv - e[0] <= d.kv_cap)  # e[0] is minus the load
            sim.admit(e[2], inst, iqr_choice(d.batch, d.kv, ok, self.k))
            order.remove(e)
