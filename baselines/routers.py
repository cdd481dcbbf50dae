"""Classic decode routers (ALGORITHMS.md s6): random, round robin, power of two choices, join shortest queue.

Least KV load is the engine default `least_kv` (pdgym.envs.sim.policy.LeastLoadedAdmission). Every
router here admits the pool in arrival order (FCFS) and only chooses the worker; a request that fits
no worker (KV) is skipped and stays pooled, and a round ends when no worker has a free slot. They are
work-conserving, so at saturation (one freed slot per finishing request) they cannot choose at all:
the imbalance they leave is what BalanceRoute's request selection removes.

The helpers at the top are the state views the decode-side policies share (BalanceRoute, IQR, the
DecodeRouting env): pool arrays, current per-request loads of active requests, and two lazy readers of
the pool (`pool_in_order`, `LoadOrder`) so that a round costs what it admits or looks at, never the
whole pool: under overload the pool grows without bound while each round admits a few requests.
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING

import numpy as np
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import DecodeRouter, pool_in_order
from sortedcontainers import SortedList

from .registry import register

if TYPE_CHECKING:  # pragma: no cover
    from pdgym.envs.sim.decode import DecodeInstance
    from pdgym.envs.sim.view import SimView


# --------------------------------------------------------------------------- shared state views
def pool_arrays(sim: SimView) -> tuple[np.ndarray, np.ndarray]:
    """Pool request ids in arrival order and their loads (prompt + tokens produced: the KV they bring)."""
    rids = np.fromiter(sim.pool, dtype=np.int64, count=len(sim.pool))
    req = sim.req
    return rids, req.prompt[rids] + req.done[rids]


class LoadOrder:
    """The decode pool ordered by load (prompt + tokens produced), heaviest first, ties in pool order,
    kept across rounds in a sorted list, so a round reads only the pool's new entries and the entries
    it admits or looks at, and finds the first request that fits a given room by bisection.

    New entries are found from the end of the pool (a dict in insertion order) back to the first one
    already indexed; an entry is identified by (id, `req.buf_t`), its last buffering time, which a
    request that left the pool and came back (preempted and prefilled again) has changed. Entries
    that left the pool otherwise are dropped when met. A different pool object (a planning copy of
    the simulator) re-indexes from scratch. Keys are (-load, sequence, id, buf_t).
    """

    def __init__(self):
        self._pool = None

    def sync(self, sim: SimView) -> None:
        """Index the entries that entered the pool since the last call."""
        if sim.pool is not self._pool:
            self._pool, self.keys, self._seen, self._seq = sim.pool, SortedList(), {}, 0
        req, seen, pool = sim.req, self._seen, sim.pool
        buf_t = req.buf_t
        new = []
        for rid in reversed(pool):
            t = float(buf_t[rid])
            if seen.get(rid) == t:
                break
            new.append((rid, t))
        seq = self._seq
        entries = []
        for rid, t in reversed(new):
            seen[rid] = t
            entries.append((-int(req.prompt[rid] + req.done[rid]), seq, rid, t))
            seq += 1
        self._seq = seq
        self.keys.update(entries)

    def at(self, sim: SimView, i: int) -> tuple | None:
        """The first entry at or after position i that is still pooled (dropping those that are not)."""
        keys, pool, seen = self.keys, sim.pool, self._seen
        while i < len(keys):
            e = keys[i]
            if e[2] in pool and seen.get(e[2]) == e[3]:
                return e
            del keys[i]
        return None

    def first_fitting(self, sim: SimView, room: int) -> tuple[int, tuple | None]:
        """Position and entry of the heaviest pooled request with load <= room (earliest on ties)."""
        i = self.keys.bisect_left((-room, -1))
        return i, self.at(sim, i)

    def head(self, sim: SimView, k: int) -> list[tuple]:
        """The k heaviest pooled entries."""
        out, i = [], 0
        while len(out) < k and (e := self.at(sim, i)) is not None:
            out.append(e)
            i += 1
        return out

    def remove(self, e: tuple) -> None:
        """Forget an entry just admitted."""
        self.keys.remove(e)


def active_arrays(sim: SimView, inst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Active requests of decode instance `inst`: ids, workers and tokens produced so far (their age).

    `req.done` of an active request is only refreshed at finish or preemption; the live count is
    done_at_admit + (steps since admission).
    """
    d = sim.decode[inst]
    n = int(d.batch.sum())
    rids = np.fromiter(chain.from_iterable(d.active), dtype=np.int64, count=n)
    req = sim.req
    age = req.done_at_admit[rids] + (d.steps - req.admit_step[rids])
    return rids, req.worker[rids].astype(np.int64), age


def feasible(d, load: int) -> np.ndarray:
    """Workers with a free slot and room for `load` KV tokens: the engine's admission rule (`d.fits`)."""
    return d.fits(load)


class _FCFSRouter(DecodeRouter):
    """Admit the pool in arrival order; subclasses pick one worker among the feasible ones."""

    def route(self, sim: SimView, inst: int) -> None:
        d = sim.decode[inst]
        prompt, done = sim.req.prompt, sim.req.done
        any_free = bool((d.batch < d.batch_limit).any())
        too_big = None  # smallest load that fit no worker this round: larger ones cannot fit either
        for rid in pool_in_order(sim):
            if not any_free:
                return
            load = int(prompt[rid] + done[rid])
            if too_big is not None and load >= too_big:
                continue
            free = d.batch < d.batch_limit
            ok = free & (d.kv + load <= d.kv_cap)
            if ok.any():
                sim.admit(rid, inst, self.pick(sim, d, np.flatnonzero(ok)))
                any_free = bool((d.batch < d.batch_limit).any())
            else:
                too_big = load

    def pick(self, sim: SimView, d: DecodeInstance, cand: np.ndarray) -> int:
        raise NotImplementedError


@register("decode", "random")
class RandomRouter(_FCFSRouter):
    """Each request to a uniformly random worker that fits it (the policies' seeded generator)."""

    def pick(self, sim, d, cand):
        return int(cand[sim.rng.integers(len(cand))])


@register("decode", "round_robin")
class RoundRobinRouter(_FCFSRouter):
    """Workers in turn, skipping those that cannot take the request."""

    def reset(self, sim):
        self._next = [0] * len(sim.decode)

    def pick(self, sim, d, cand):
        nxt = self._next[d.idx]
        i = int(np.searchsorted(cand, nxt))
        w = int(cand[i % len(cand)])
        self._next[d.idx] = (w + 1) % d.dp
        return w


@register("decode", "power_of_two")
class PowerOfTwoRouter(_FCFSRouter):
    """Power of two choices: sample two feasible workers, take the one with less KV (ties: fewer requests)."""

    def pick(self, sim, d, cand):
        if len(cand) == 1:
            return int(cand[0])
        a, b = cand[sim.rng.choice(len(cand), size=2, replace=False)]
        return int(a) if (d.kv[a], d.batch[a]) <= (d.kv[b], d.batch[b]) else int(b)


@register("decode", "jsq")
class JoinShortestQueueRouter(_FCFSRouter):
    """Join the shortest queue: the worker with the fewest active requests (ties broken at random)."""

    def pick(self, sim, d, cand):
        b = d.batch[cand]
        best = cand[b == b.min()]
        return int(best[sim.rng.integers(len(best))]) if len(best) > 1 else int(best[0])


@register("decode", "least_kv_immediate")
class ImmediateLeastKVRouter(_FCFSRouter):
    """Immediate dispatch to the least-loaded worker as a per-arrival dispatcher does it (SBS's baseline):
    each request goes to the worker with the least KV in the latest load report, which the workers send
    every `report_every` decode steps; the dispatcher does not count its own dispatches since, so the
    requests of a report period herd onto the same worker. (`least_kv` sees every admission at once.)
    Slots and KV room are still checked live: a full worker refuses and the next one in the report wins."""

    def __init__(self, report_every: int = 1):
        if isinstance(report_every, bool) or not isinstance(report_every, int) or report_every < 1:
            raise ConfigError(f"policy.decode.report_every: got {report_every!r}; must be an integer >= 1 (steps)")
        self.report_every = report_every

    def reset(self, sim):
        self._report = {}  # instance -> (step of the report, KV per worker)

    def route(self, sim, inst):
        d = sim.decode[inst]
        last = self._report.get(inst)
        if last is None or d.steps - last[0] >= self.report_every:
            self._report[inst] = (d.steps, d.kv.copy())
        self._kv = self._report[inst][1]
        super().route(sim, inst)

    def pick(self, sim, d, cand):
        return int(cand[np.argmin(self._kv[cand])])
