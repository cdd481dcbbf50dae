"""Hindsight admission for SLO tiers (issue 33 item 6; ALGORITHMS.md section 9): a clairvoyant row, not a policy.

Conductor's early rejection (slo_admission.py) rejects at arrival what its estimate says cannot meet the TTFT SLO;
this row rejects what does not meet its SLO in a replay of the run. At reset it replays the same seeded run
(`view.cfg`, `view.seed`: the same arrivals, prompts, true output lengths and predictions) with `base` (any
prefill policy: the board's best heuristic, e.g. conductor over SBS with the queue in EDF order) and the `others`
policies at the other decision points, then improves a reject set by local search over further replays: each
adds to the best set so far the share `frac` of that set's misses (TTFT or TPOT missed, or rejected) with the
largest prompt work per unit of class weight (the cheapest weight to give up), keeps the result when the replay's
weighted attainment rose and halves `frac` when it did not (`passes` replays). The real run rejects the best set
at arrival (reason `slo`, a miss) and hands the rest to `base`; the engine being deterministic, it scores the
best replay exactly, so the row is never below `base` on the same seed.

`revise: true` (a base that rejects at arrival: conductor, value_density, ...) adds a second search that can also
take rejections back: the rule's own arrival rejections become the reject set, replayed behind the rule's
dispatcher alone, and further passes alternate adding misses and taking back the rejections with the least work
per weight; the real run keeps whichever search scored best (issue 42: a learned admission agent that rejected
fewer requests than the rule reached the add-only row).

Rejecting everything that missed at once is worse than `base` (slo_pd_tiers seed 100: 375 rejections, 0.842
against 0.879): in a burst the late requests miss because of the early ones, and rejecting a few of them lets the
rest meet. The row knows the whole future of the run (every arrival and true output length, and the other
policies' decisions on that traffic), more than a short window; hence `oracle: true` is required. It bounds what
admission with foresight adds to `base`'s own ordering, not every policy.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.slo import attainment
from pdgym.envs.sim.validation import check, check_float

from .registry import make_policy, register
from .slo_admission import ArrivalGate, dispatcher


def missed(result) -> np.ndarray:
    """Ids of the requests of a finished run that did not attain their class's SLO (rejected ones included)."""
    r = result.requests
    fin = (r.status == "finished").to_numpy()
    ttft_ok, tpot_ok = attainment(fin, r.ttft.to_numpy(), r.tpot.to_numpy(), r["class"].cat.codes.to_numpy(),
                                  result.classes)
    return np.flatnonzero(~(ttft_ok & tpot_ok))


class Rejecting(ArrivalGate):
    """`base`, with the requests of `reject_set` rejected at arrival (new arrivals only, not bounced or
    preempted ones): a replay's prefill policy, and the real run's once the set is known."""

    name = "slo_hindsight_replay"

    def __init__(self, base: str | dict[str, Any] | PrefillScheduler = "auto", reject: frozenset[int] = frozenset()):
        super().__init__(base)
        self.reject_set = reject

    def rejects(self, sim, rid: int) -> bool:
        return rid in self.reject_set


@register("prefill", "slo_hindsight")
class SLOHindsight(Rejecting):
    """Clairvoyant (needs oracle: true): reject at arrival what a replay of the run says misses its SLO; `base`
    dispatches the rest (module docstring)."""

    def __init__(self, base: str | dict[str, Any] = "auto", passes: int = 6, frac: float = 0.3,
                 others: dict[str, Any] | None = None, revise: bool = False):
        super().__init__(base)
        check(isinstance(revise, bool), "policy.prefill.revise", f"got {revise!r}; must be true or false")
        check(not revise or isinstance(self.base, ArrivalGate), "policy.prefill.revise",
              f"revises the reject set of a rule that rejects at arrival (conductor, value_density, ...); "
              f"got base {base if self.base is None else type(self.base).__name__}")
        self.revise = revise
        check(isinstance(passes, int) and not isinstance(passes, bool) and 1 <= passes <= 50,
              "policy.prefill.passes", f"got {passes!r}; must be an integer in [1, 50]")
        self.passes = passes
        self.frac = check_float(frac, "policy.prefill.frac", 0.0, 1.0, lo_open=True)
        self.others = dict(others or {})
        check(set(self.others) <= {"decode", "batching"}, "policy.prefill.others",
              f"got {sorted(self.others)}; allowed keys: decode, batching")

    def replay(self, cfg, seed: int, reject: frozenset[int], bare: bool = False):
        """One replay of the run with `reject` rejected at arrival (fresh policies: nothing shared); `bare`: behind
        the base rule's own dispatcher, without the rule's admission (revise)."""
        from pdgym.envs.sim import simulate

        pol = {k: make_policy(k, v) for k, v in self.others.items()}
        pol["prefill"] = Rejecting(self.inner_spec() if bare else self.base_spec, reject)
        return simulate(copy.deepcopy(cfg), pol, seed=seed)

    def inner_spec(self):
        """revise: the dispatcher behind the wrapped rule (a gate), as that rule names it (`auto` included)."""
        return make_policy("prefill", self.base_spec).base_spec

    def revise_set(self, sim, cost: np.ndarray, res, best: float) -> tuple[float, frozenset[int] | None]:
        """revise: the rule's own arrival rejections become the reject set, behind its dispatcher alone; passes
        alternate adding misses (most work per weight first) and taking back rejections (least first), each
        kept when the replay's weighted attainment rises, its share halved when not. Returns the best score and
        set (None: the rule's own run stayed best)."""
        r = res.requests
        own = np.flatnonzero(((r.reason == "slo") & (r.finish == r.arrival)).to_numpy())
        cur = frozenset(int(i) for i in own)
        out = self.replay(sim.cfg, sim.seed, cur, bare=True)
        att = out.metrics()["slo_attainment"]
        self.trace.append((len(cur), att))
        best_set = cur if att > best else None
        best, cur_att, cur_res = max(best, att), att, out
        fracs = [self.frac, self.frac]  # add, take back
        for k in range(self.passes):
            move = k % 2
            if move == 0:
                pool = np.setdiff1d(missed(cur_res), np.fromiter(cur, int, len(cur)))
                order = np.argsort(-cost[pool], kind="stable")
            else:
                pool = np.fromiter(cur, int, len(cur))
                order = np.argsort(cost[pool], kind="stable")
            if not len(pool):
                continue
            pick = frozenset(int(i) for i in pool[order[:max(1, int(np.ceil(fracs[move] * len(pool))))]])
            trial = cur | pick if move == 0 else cur - pick
            out = self.replay(sim.cfg, sim.seed, trial, bare=True)
            att = out.metrics()["slo_attainment"]
            self.trace.append((len(trial), att))
            if att > cur_att:
                cur, cur_att, cur_res = trial, att, out
                if att > best:
                    best, best_set = att, trial
            else:
                fracs[move] /= 2
        return best, best_set

    def reset(self, sim) -> None:
        if not sim.cfg.oracle:
            raise ConfigError("policy.prefill: slo_hindsight replays the run with its true output lengths (a "
                              "hindsight row); it needs oracle: true")
        req = sim.req
        cost = req.work / sim.classes.weight[req.cls]  # prompt work per unit of weight: the cheapest to give up first
        res = first = self.replay(sim.cfg, sim.seed, frozenset())
        best, best_set, frac = res.metrics()["slo_attainment"], frozenset(), self.frac
        self.trace = [(0, best)]  # (requests in the reject set, the replay's weighted attainment) of each replay
        for _ in range(self.passes):
            new = np.setdiff1d(missed(res), np.fromiter(best_set, int, len(best_set)))
            if not len(new):
                break
            take = new[np.argsort(-cost[new], kind="stable")[:max(1, int(np.ceil(frac * len(new))))]]
            trial = best_set | frozenset(int(i) for i in take)
            out = self.replay(sim.cfg, sim.seed, trial)
            att = out.metrics()["slo_attainment"]
            self.trace.append((len(trial), att))
            if att > best:
                best, best_set, res = att, trial, out
            else:  # worse: keep the best set (and its misses), take smaller steps
                frac /= 2
        if self.revise:
            score, revised = self.revise_set(sim, cost, first, self.trace[0][1])
            if revised is not None and score > best:  # the real run: the rule's dispatcher behind the revised set
                best, best_set = score, revised
                self.base = dispatcher(self.inner_spec(), sim)
        self.reject_set = best_set
        super().reset(sim)
