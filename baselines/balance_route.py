"""BalanceRoute: decode routing under a barrier, BR-0 (prediction free) and BR-H (lookahead) (ALGORITHMS.md s6).

A decode step waits for its heaviest worker, so the router fills each worker's safe margin
m_w = L_max - L_w (filling it cuts the barrier idle one for one) and avoids overflowing it (an
overflow raises every other worker's deficit). For a candidate set S adding Delta tokens to worker w:

    BR-0:  F_w(S) = min(Delta, m_w) - (N - 1) max(0, Delta - m_w)
    BR-H:  F_w^H(S) = sum_{h=1..H} gamma^(h-1) [alpha min(Delta, m_w(h)) - beta max(0, Delta - m_w(h))]

with m_w(h) = L_max(t+h) - L_w(t+h) from projected loads. BR-0 is BR-H with H = 1, alpha = 1,
beta = N - 1 and the current loads (h = 1 is the step about to run, whose loads are today's), and the
code is one router with those settings.

A round (one step boundary, `route`):
- Stage 1, while the free slots exceed `stage1_free` x (N x B): the worker with the most free slots
  (ties: larger margin) takes the single pool request with the largest F.
- Stage 2: repeatedly the worker keyed highest by (free slots, min_h m_w(h)) takes the subset S of
  the K-request head window (pool by length descending, or the K oldest: `order`), |S| <= its free
  slots, with the largest F, found exactly: F is concave in Delta, so the best reachable sum is the
  largest one at or below the peak of F or the smallest one above it; per-cardinality reachable-sum
  bitsets (Python ints, R_q |= R_{q-1} << s per item, q descending) give both, and the subset is
  recovered by walking the per-item snapshots back. If the best F is not positive the worker still
  takes the single best request (no starvation: a worker with slots never idles while the window has
  a request that fits it). Admitting Delta adds it to L_w(t+h) for every h.
Admissions never exceed a worker's slots or KV capacity (`sim.admit`'s rule: KV + load <= capacity).

BR-H projections: each active request carries tau_hat, its expected in-window remaining steps from a
predictor (pdgym.baselines.predictors), refreshed every `refresh` tokens and decremented by one per
step between; a refresh is accepted only when P >= q_min (else tau_hat = H); floor 1 while active
(reaching it forces a refresh). `first_weight` (pdgym's, not in the paper; null: the spec's gamma^0 = 1) weighs
the step about to run apart from the window: with the spec's weights it carries 1 of about 1 / (1 - gamma), and
at small N the oracle then overfills today for departures it foresees (docs/fidelity.md, br_imbalance); the
router's `stats` count the picks that overflow today's margin. `hold_full: true` is an alternative reading: a tau_hat of H ("present
through the whole window": the request outlives it, or the predictor is not confident) is held until
the next refresh instead of decremented, so no departure is projected at h = H - s that no prediction
made. br_imbalance measures both (brh_*_hold rows): holding helps the deployable predictors on the
long-context heavy-tailed tier and hurts them on the Azure tier, so the default is the literal spec.
A request counts at step t + h (h = 1..H) iff h <= tau_hat, with load L + h - 1.
The N x H projection is built once per round with two bincounts and updated in place.

Defaults come from the sweeps of `pdgym-repro br_imbalance repro.sweep=true` (documented in
conf/policy/decode/br0.yaml and brh.yaml): stage1_free 0.25, window K 12, order arrival, H 48,
gamma 0.9, refresh 16, q_min 0.7.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import DecodeRouter
from pdgym.envs.sim.requests import DECODE
from pdgym.envs.sim.validation import check_float, check_int

from .predictors import expected_steps, make_predictor
from .registry import register
from .routers import LoadOrder, active_arrays, pool_arrays

if TYPE_CHECKING:  # pragma: no cover
    from pdgym.envs.sim.view import SimView

ORDERS = ("length", "arrival")


# --------------------------------------------------------------------------- score and subset search
def f_score(delta, margins: np.ndarray, weights: np.ndarray, alpha: float, beta: float):
    """F^H for one or many Delta values (scalar or 1-D array) against margins m(h) with weights gamma^(h-1)."""
    d = np.asarray(delta, dtype=np.float64)[..., None]
    return (alpha * np.minimum(d, margins) - beta * np.maximum(d - margins, 0.0)) @ weights


class Score:
    """F^H of one worker as a function of Delta, with its peak (F is concave, piecewise linear in Delta).

    The peak is the breakpoint m(h) past which the slope sum_h gamma^(h-1) (alpha if Delta < m(h) else
    -beta) turns non-positive; with H = 1 it is the margin itself and F is evaluated in plain Python.
    """

    __slots__ = ("_m1", "alpha", "beta", "m", "peak", "w")

    @classmethod
    def flat(cls, margin: int, weights: np.ndarray, alpha: float, beta: float) -> Score:
        """H = 1 from the Python int margin, no array built (`many` builds the one-entry margins when asked):
        the same Score as `Score(np.array([margin], float), ...)`."""
        s = cls.__new__(cls)
        s.m, s.w, s.alpha, s.beta = None, weights, alpha, beta
        s._m1 = float(margin)
        s.peak = max(margin, 0)
        return s

    def __init__(self, margins: np.ndarray, weights: np.ndarray, alpha: float, beta: float):
        self.m, self.w, self.alpha, self.beta = margins, weights, alpha, beta
        if margins.shape[0] == 1:
            self._m1 = float(margins[0])  # H = 1: the weight is gamma^0 = 1
            self.peak = max(int(margins[0]), 0)
            return
        self._m1 = None
        # on Python floats (H = 16-64 entries: cheaper than NumPy's calls), the operations of
        # o = argsort(m, stable); passed = cumsum(w[o]); slope = alpha (passed[-1] - passed) - beta passed;
        # peak = m[o[argmax(slope <= 0)]] (index 0 when none is), the cumulative sum added in the same order
        m, wl = margins.tolist(), weights.tolist()
        o = sorted(range(len(m)), key=m.__getitem__)
        passed, acc = [], 0.0
        for i in o:
            acc += wl[i]
            passed.append(acc)
        first = next((j for j, p in enumerate(passed) if alpha * (acc - p) - beta * p <= 0), 0)
        self.peak = max(int(m[o[first]]), 0)  # the slope just past each sorted breakpoint turns non-positive

    def __call__(self, x: int) -> float:
        m = self._m1
        if m is None:  # f_score's operations on one Python float: the same H-entry vectors and dot
            d, mm = float(x), self.m
            return float((self.alpha * np.minimum(d, mm) - self.beta * np.maximum(d - mm, 0.0)) @ self.w)
        return self.alpha * min(x, m) - self.beta * max(x - m, 0.0)

    def many(self, xs: np.ndarray) -> np.ndarray:
        if self.m is None:
            self.m = np.array([self._m1])
        return f_score(xs, self.m, self.w, self.alpha, self.beta)


def best_single_flat(win: list[tuple[int, int]], cap: int, margin: int, alpha: float, beta: float) -> int:
    """`best_subset(sizes, 1, cap, Score.flat(margin, ...))`'s pick for one free slot and H = 1, without the Score and
    the lists: the position of the first load that is the largest <= the peak or the smallest above it (<= cap, the
    better F of the two, the lower one on a tie), or -1 when no load fits `cap`."""
    peak = margin if margin > 0 else 0
    lo = hi = None
    lo_i = hi_i = -1
    for j, (_, s) in enumerate(win):
        if s <= cap:
            if s <= peak:
                if lo is None or s > lo:
                    lo, lo_i = s, j
            elif hi is None or s < hi:
                hi, hi_i = s, j
    if lo is None or hi is None:
        return hi_i if lo is None else lo_i
    m = float(margin)  # Score.__call__ with H = 1
    f_lo = alpha * min(lo, m) - beta * max(lo - m, 0.0)
    f_hi = alpha * min(hi, m) - beta * max(hi - m, 0.0)
    return hi_i if f_hi > f_lo else lo_i


def best_subset(sizes: list[int], max_card: int, cap: int, score: Score) -> tuple[list[int], float]:
    """Non-empty subset of `sizes` with |S| <= max_card and sum <= cap maximising the concave `score(sum)`.
    Returns (indices, score), or ([], -inf) if no single item fits `cap`.

    Exact: over the reachable sums of non-empty subsets, the optimum of a concave function is the
    largest sum <= its peak or the smallest sum > its peak. Per-cardinality bitsets R_q (bit x set = some
    q-item subset sums to x) are truncated at min(cap, peak + max size): the smallest sum above the peak
    is never beyond peak + max size (drop items from any larger subset until it crosses the peak).
    Among subsets with the chosen sum, the one with the most items is taken (more requests served).
    """
    k = len(sizes)
    c = min(max_card, k)
    if c <= 0:
        return [], -np.inf
    peak = score.peak
    if c == 1:  # one free slot: the best single item, by the same concavity argument
        lo = hi = None  # the largest size <= peak and the smallest > peak, both <= cap
        for s in sizes:
            if s <= cap:
                if s <= peak:
                    if lo is None or s > lo:
                        lo = s
                elif hi is None or s < hi:
                    hi = s
        cands = [x for x in (lo, hi) if x is not None]
        if not cands:
            return [], -np.inf
        vals = [score(x) for x in cands]
        i = 1 if len(vals) == 2 and vals[1] > vals[0] else 0
        return [sizes.index(cands[i])], float(vals[i])
    limit = min(cap, peak + max(sizes))
    if limit <= 0:
        return [], -np.inf
    mask = (1 << (limit + 1)) - 1
    rs = [1] + [0] * c
    snaps = []
    for s in sizes:
        if s <= limit:
            for q in range(c, 0, -1):
                if rs[q - 1]:
                    rs[q] |= (rs[q - 1] << s) & mask
        snaps.append(rs[:])
    union = 0
    for q in range(1, c + 1):
        union |= rs[q]
    if not union:
        return [], -np.inf
    cands = []
    lo = union & ((1 << (min(peak, limit) + 1)) - 1)
    if lo:
        cands.append(lo.bit_length() - 1)
    hi = union >> (peak + 1)
    if hi:
        cands.append((hi & -hi).bit_length() - 1 + peak + 1)
    vals = [score(x) for x in cands]
    i = 1 if len(vals) == 2 and vals[1] > vals[0] else 0
    total = cands[i]
    q = max(q for q in range(1, c + 1) if (rs[q] >> total) & 1)
    chosen = []
    for j in range(k - 1, -1, -1):
        if q == 0:
            break
        before = snaps[j - 1] if j > 0 else [1] + [0] * c
        if not (before[q] >> total) & 1:  # not reachable without item j: it is in the subset
            chosen.append(j)
            total -= sizes[j]
            q -= 1
    return chosen[::-1], float(vals[i])


# --------------------------------------------------------------------------- the routers
class _BalanceRoute(DecodeRouter):
    """Stage 1 / Stage 2 admission against an N x H projection of worker loads (see module doc)."""

    flat_state = True  # H = 1 keeps the loads as Python ints (False: the N x H array path, the same decisions)

    def __init__(self, stage1_free: float = 0.25, window: int = 12, order: str = "arrival"):
        self.stage1_free = check_float(stage1_free, "policy.decode.stage1_free", 0, 1)
        self.window = check_int(window, "policy.decode.window", 1)
        if order not in ORDERS:
            raise ConfigError(f"policy.decode.order: got {order!r}; allowed: {', '.join(ORDERS)}")
        self.order = order
        self.horizon = 1
        self.alpha, self.beta = 1.0, None
        self.weights = np.ones(1)
        self._order = LoadOrder()

    @property
    def stats(self) -> dict:
        picks, over, tokens = self._counts
        return {"picks": picks, "overflow_picks": over, "overflow_tokens": tokens}

    def _beta(self, d) -> float:
        return float(d.dp - 1) if self.beta is None else self.beta

    def projection(self, sim: SimView, inst: int) -> np.ndarray:
        """L_w(t+h), an N x H int64 array; BR-0: today's loads."""
        return sim.decode[inst].kv[:, None].copy()

    def admitted(self, sim: SimView, rid: int) -> None:
        """Hook: `rid` was just admitted by this router."""

    def reset(self, sim: SimView) -> None:
        self._order = LoadOrder()
        # picks: admissions to one worker in a round (a Stage 1 request or a Stage 2 subset); overflow_*: those
        # whose Delta exceeded today's margin m_w(1), and by how much in all. Measurements for the reproductions
        # (a lookahead that overfills today: docs/fidelity.md, br_imbalance); the router does not read them.
        self._counts = [0, 0, 0]  # picks, overflow_picks, overflow_tokens (`stats`)

    def route(self, sim: SimView, inst: int) -> None:
        """One round. Stage 2 reads only its window: the K oldest pool entries (`islice` of the pool) or
        the K heaviest (`LoadOrder`); Stage 1 scores the whole pool, as the algorithm says, and builds
        the pool arrays only when it runs (more than `stage1_free` of the slots free)."""
        d = sim.decode[inst]
        pool = sim.pool
        if not pool:
            return
        proj = self.projection(sim, inst)
        # Per-worker state as Python numbers: a round makes a few picks over N = 16-64 workers, where a NumPy
        # call costs more than the loop it replaces. H = 1 (BR-0) keeps the loads as a list too; H > 1 keeps the
        # N x H projection in NumPy. The same integers and float operations as the array form, so the same picks.
        flat = proj.shape[1] == 1 and self.flat_state
        if flat:
            pl = proj[:, 0].tolist()
            lmax1 = max(pl)
        else:
            lmax = proj.max(axis=0)
        free = (d.batch_limit - d.batch).tolist()
        room = (d.kv_cap - d.kv).tolist()
        opens = [i for i, f in enumerate(free) if f > 0]  # workers with a free slot still taking, in index order
        total_free = sum(free)
        alpha, beta, wts = self.alpha, self._beta(d), self.weights
        by_length = self.order == "length"
        if by_length:
            order = self._order
            order.sync(sim)
        prompt, done = sim.req.prompt, sim.req.done
        head = None  # Stage 2's arrival-order window source: (id, load) of the pool's first entries, this round
        whole = None  # Stage 1's (ids, loads, alive) over the whole pool, in `order`
        stage1_until = self.stage1_free * d.dp * d.batch_limit
        K = self.window
        counts = self._counts
        ninf = -np.inf

        def take(w: int, items: list[tuple[int, int]]) -> list[bool]:
            """Admit (id, load) pairs to worker w; which were admitted."""
            nonlocal total_free, lmax1
            delta = 0
            taken = []
            for rid, load in items:
                ok = sim.admit(rid, inst, w)
                taken.append(ok)
                if ok:
                    self.admitted(sim, rid)
                    delta += load
                    free[w] -= 1
                    total_free -= 1
            if flat:
                if delta:
                    over = delta - (lmax1 - pl[w])
                    counts[0] += 1
                    if over > 0:
                        counts[1] += 1
                        counts[2] += over
                    pl[w] += delta
                    if pl[w] > lmax1:
                        lmax1 = pl[w]
            else:
                if delta:
                    over = delta - int(lmax[0] - proj[w, 0])
                    counts[0] += 1
                    if over > 0:
                        counts[1] += 1
                        counts[2] += over
                proj[w] += delta
                np.maximum(lmax, proj[w], out=lmax)
            room[w] -= delta
            if free[w] <= 0:
                opens.remove(w)
            return taken

        while pool and opens:
            # the open worker keyed highest by free * 1e12 + lowest margin (first among equals)
            best, w = ninf, -1
            if flat:
                for i in opens:
                    key = free[i] * 1e12 + (lmax1 - pl[i])
                    if key > best:
                        best, w = key, i
                one = free[w] == 1 and total_free <= stage1_until  # Stage 2 with one free slot: best_single_flat
                score = None if one else Score.flat(lmax1 - pl[w], wts, alpha, beta)
            else:
                margins = lmax - proj
                lowest = margins.min(axis=1).tolist()
                for i in opens:
                    key = free[i] * 1e12 + lowest[i]
                    if key > best:
                        best, w = key, i
                score = Score(margins[w].astype(np.float64), wts, alpha, beta)
            if total_free > stage1_until:  # Stage 1: bulk fill, one request at a time from the whole pool
                if whole is None:
                    rids, loads = pool_arrays(sim)
                    if by_length:
                        o = np.argsort(-loads, kind="stable")
                        rids, loads = rids[o], loads[o]
                    whole = rids, loads, np.ones(len(rids), dtype=bool)
                rids, loads, alive = whole
                cand = np.flatnonzero(alive & (loads <= room[w]))
                if not len(cand):
                    opens.remove(w)
                    continue
                p = int(cand[int(np.argmax(score.many(loads[cand])))])
                if take(w, [(int(rids[p]), int(loads[p]))])[0]:
                    alive[p] = False
                continue
            if by_length:  # the K heaviest
                entries = order.head(sim, K)
                win = [(e[2], -e[0]) for e in entries]
            else:
                if head is None:  # once a round: Stage 2 admits at most total_free more, so the first K still
                    # pooled at any later pick are among these K + total_free (a round only deletes from the pool)
                    ids = np.fromiter(islice(pool, K + total_free), dtype=np.int64)
                    head = list(zip(ids.tolist(), (prompt[ids] + done[ids]).tolist()))
                win = head[:K]
            if score is None:  # H = 1, one free slot (Stage 2's usual pick): the same choice, without the Score
                j = best_single_flat(win, room[w], lmax1 - pl[w], alpha, beta)
                if j < 0:
                    opens.remove(w)
                    continue
                taken = take(w, [win[j]])
                if by_length:
                    if taken[0]:
                        order.remove(entries[j])
                elif win[j][0] not in pool:
                    del head[j]
                continue
            sizes = [load for _, load in win]
            chosen, best = best_subset(sizes, free[w], room[w], score)
            if chosen and best <= 0 and len(chosen) > 1:  # no-starvation rule: the single best request anyway
                chosen, _ = best_subset(sizes, 1, room[w], score)
            if not chosen:
                opens.remove(w)  # nothing in the window fits this worker's KV
                continue
            taken = take(w, [win[i] for i in chosen])
            if by_length:
                for i, ok in zip(chosen, taken):
                    if ok:
                        order.remove(entries[i])
            else:
                for i in reversed(chosen):  # admitted ones left the pool (a dry run's stay: envs/shadow.py)
                    if win[i][0] not in pool:
                        del head[i]


@register("decode", "br0")
class BR0(_BalanceRoute):
    """BalanceRoute BR-0: prediction-free margin filling with exact subset selection."""


@register("decode", "brh")
class BRH(_BalanceRoute):
    """BalanceRoute BR-H: the BR-0 rounds scored over an H-step lookahead of projected loads."""

    def __init__(self, horizon: int = 48, gamma: float = 0.9, alpha: float = 1.0, beta: float | None = None,
                 first_weight: float | None = None, refresh: int = 16, q_min: float = 0.7, predictor: str = "survival",
                 train_trace: str | None = "workload", train_rows: list[int] | None = None,
                 train_samples: int = 20000, min_samples: int = 3, hold_full: bool = False,
                 stage1_free: float = 0.25, window: int = 12, order: str = "arrival"):
        super().__init__(stage1_free, window, order)
        self.horizon = check_int(horizon, "policy.decode.horizon", 1)
        self.gamma = check_float(gamma, "policy.decode.gamma", 0, 1, lo_open=True)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ConfigError(f"policy.decode.alpha: got {alpha!r}; must be > 0")
        if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta < 0):
            raise ConfigError(f"policy.decode.beta: got {beta!r}; must be >= 0 (or null for N - 1)")
        self.alpha = float(alpha)
        self.beta = None if beta is None else float(beta)
        self.refresh = check_int(refresh, "policy.decode.refresh", 1)
        self.q_min = check_float(q_min, "policy.decode.q_min", 0, 1)
        if not isinstance(hold_full, bool):
            raise ConfigError(f"policy.decode.hold_full: got {hold_full!r}; allowed: true, false")
        self.hold_full = hold_full
        self.weights = self.gamma ** np.arange(self.horizon, dtype=np.float64)
        if first_weight is not None:  # pdgym's, not the spec's: the step about to run weighs this instead of 1
            self.weights[0] = check_float(first_weight, "policy.decode.first_weight", 0, lo_open=True)
        self.predictor = make_predictor(predictor, train_trace, train_rows, train_samples, min_samples)

    def reset(self, sim):
        super().reset(sim)
        self.predictor.bind(sim, self.horizon)
        n = sim.req.n
        self._tau = np.zeros(n)  # tau_hat at the last refresh
        self._t_ref = np.full(n, -1, dtype=np.int64)  # decode step of the last refresh, -1 = none yet
        self._live: dict[int, tuple] = {}  # instance -> (pool object, its active ids at its last projection)
        self._new: dict[int, list[int]] = {}  # instance -> ids this router admitted there since

    def admitted(self, sim, rid):
        self._t_ref[rid] = -1
        if sim.req.state[rid] == DECODE:  # not a dry run's admission (envs/shadow.py: the request stays pooled)
            self._new.setdefault(int(sim.req.decode_inst[rid]), []).append(rid)

    def active(self, sim, inst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`active_arrays` kept across rounds: the ids active at this instance's last projection that still decode
        there, plus those this router admitted there since (the only other way in). Rebuilt from the instance's
        sets when the count disagrees with its batch (an admission not seen, a planning copy's pool) or the pool
        object changed. The order differs from active_arrays'; the projection does not depend on it (integer
        loads summed exactly, per-request predictions)."""
        d = sim.decode[inst]
        req = sim.req
        new = self._new.pop(inst, None)
        last = self._live.get(inst)
        rids = None
        if last is not None and last[0] is sim.pool:
            rids = last[1]
            if new:
                rids = np.concatenate((rids, np.array(new, dtype=np.int64)))
            rids = rids[(req.state[rids] == DECODE) & (req.decode_inst[rids] == inst)]
            if len(rids) != int(d.batch.sum()):
                rids = None
        if rids is None:
            rids = active_arrays(sim, inst)[0]
        self._live[inst] = (sim.pool, rids)
        age = req.done_at_admit[rids] + (d.steps - req.admit_step[rids])
        return rids, req.worker[rids].astype(np.int64), age

    def projection(self, sim, inst):
        d = sim.decode[inst]
        H = self.horizon
        rids, workers, age = self.active(sim, inst)
        t = d.steps
        t_ref = self._t_ref[rids]
        since = t - t_ref
        tau = self._tau[rids] - since
        if self.hold_full:  # tau_hat = H held: through the whole window (outlives it, or not confident)
            tau = np.where(self._tau[rids] >= H, float(H), tau)
        due = (t_ref < 0) | (since >= self.refresh) | (tau < 1)
        if due.any():
            p, mu = self.predictor.window(sim, rids[due], age[due])
            fresh = expected_steps(p, mu, H, self.q_min)
            self._tau[rids[due]] = fresh
            self._t_ref[rids[due]] = t
            tau[due] = fresh
        k = np.minimum(np.maximum(tau.astype(np.int64), 1), H)  # present at h = 1 .. k (np.clip: the same, slower)
        load = sim.req.prompt[rids] + age
        idx = workers * H + (k - 1)
        cnt = np.bincount(idx, minlength=d.dp * H).reshape(d.dp, H)
        tot = np.bincount(idx, weights=load, minlength=d.dp * H).reshape(d.dp, H)
        c_ge = np.cumsum(cnt[:, ::-1], axis=1)[:, ::-1]  # requests present at h
        l_ge = np.cumsum(tot[:, ::-1], axis=1)[:, ::-1]
        return (l_ge + c_ge * np.arange(H)).astype(np.int64)
