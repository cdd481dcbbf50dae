"""DecodeRouting-v0: the agent is the decode router of a decode tier; prefill runs a configured baseline.

`DecodeRoutingEnv` (its docstring documents the env in Gymnasium's sections), the policy core it
shares with `AgentPolicy` (a trained agent as a DecodeRouter inside `simulate()`); a baseline
router's plan is read for behaviour cloning through the shadow simulator `AdmissionDryRun`
(envs/shadow.py).
"""

from __future__ import annotations

import numpy as np
from pdgym.baselines import make_policy
from pdgym.baselines.balance_route import BRH
from pdgym.baselines.routers import feasible
from pdgym.baselines.shared import Projector
from pdgym.envs.base import INVALID_ACTION_RULE, TORCH_THREADS_NOTE, PdgymEnv
from pdgym.envs.decode_pick import Boundaries, DecodeCore, DecodeObs, Picker, bind_workers, br0_action
from pdgym.envs.features import Feature, Layout, LayoutCore, check_rows, table
from pdgym.envs.shadow import AdmissionDryRun
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.events import PassKind
from pdgym.envs.sim.observers import Observer
from pdgym.envs.sim.points import POINTS
from pdgym.envs.sim.policy import DecodeRouter
from pdgym.envs.sim.validation import check_bool, check_choice, check_float
from pdgym.envs.specs import option_values

ENV_ID = POINTS["decode"].env_id  # pdgym/DecodeRouting-v0
MAX_EPISODE_STEPS = POINTS["decode"].max_episode_steps
ORDERS = ("length", "arrival")
REWARDS = ("idle", "throughput", "imbalance")


class _Obs(DecodeObs):
    """DecodeObs plus what this formulation's features read (`RouterCore.observe`)."""

    __slots__ = ("i", "batch", "margin", "free_sum", "ones")


def _rest_mean(o: _Obs) -> float:
    """Mean load of the head and the requests after it (prefix sums: total minus the part before the head)."""
    c, i = o.core, o.i
    csum = c._csum
    rest_sum = int(csum[-1]) - (int(csum[i - 1]) if i > 0 else 0)
    return rest_sum / (len(c._cand) - i) / (4 * o.ts)


def _rest_max(o: _Obs) -> float:
    c = o.core
    rest_max = c.head_load if c._sufmax is None else int(c._sufmax[o.i])  # length order: the head is the max
    return rest_max / (4 * o.ts)


def _projected(o: _Obs) -> np.ndarray:
    proj = o.core._proj
    H = proj.shape[1]
    return proj[:, [max(H // 4, 1) - 1, max(H // 2, 1) - 1, H - 1]] / o.S


# The observation, declared once: [GLOBAL | one ROW per worker, max_workers rows]. S = batch_limit x token_scale,
# B = batch limit, N = workers, L_w = KV tokens of worker w, L_max = max_w L_w.
GLOBAL = (
    Feature("pool", lambda o: len(o.sim.pool) / (o.n * o.B), 0, 8, "pool size / (N B)"),
    Feature("rest_mean", _rest_mean, 0, 8, "mean load of the head and the requests after it / (4 token_scale)"),
    Feature("rest_max", _rest_max, 0, 8, "max load of the head and the requests after it / (4 token_scale)"),
    Feature("head_load", lambda o: o.core.head_load / (4 * o.ts), 0, 8,
            "head load (prompt + tokens produced) / (4 token_scale)"),
    Feature("head_done", lambda o: float(o.sim.req.done[o.core.head]) / o.ts, 0, 8, "head tokens produced / token_scale"),
    Feature("head_wait", lambda o: o.sim.now - float(o.sim.req.first_token[o.core.head]), 0, 8,
            "head wait since its first token (s)"),
    Feature("l_max", lambda o: o.lmax / o.S, 0, 8, "L_max / S"),
    Feature("l_mean", lambda o: o.kv_sum / o.n / o.S, 0, 8, "mean L_w / S"),  # = kv.mean(), the same bits
    Feature("free_slots", lambda o: o.free_sum / (o.n * o.B), 0, 1,
            "free-slot fraction of the instance"),
    Feature("admitted", lambda o: o.core.n_admitted / o.B, 0, 8, "admissions this boundary / B"),
    Feature("workers", lambda o: o.n / o.core.max_workers, 0, 1, "N / max_workers"),
    Feature("end_allowed", lambda o: float(o.mask[o.core.end]), 0, 1, "END / SKIP allowed"),
)
ROW = (
    Feature("present", lambda o: o.ones, 0, 1, "worker w present (0 on padding rows)"),
    Feature("load", lambda o: o.kv / o.S, 0, 8, "L_w / S"),
    Feature("batch", lambda o: o.batch, 0, 1, "batch / B"),
    Feature("free", lambda o: 1.0 - o.batch, 0, 1, "free slots / B"),
    Feature("margin", lambda o: o.margin, 0, 8, "safe margin (L_max - L_w) / S"),
    Feature("margin_after", lambda o: o.margin - o.core.head_load / o.S, -1, 8,
            "margin after the head (L_max - L_w - head load) / S"),
    Feature("fits", lambda o: o.mask[:o.n], 0, 1, "worker can take the head (its mask bit)"),
    Feature("free_kv", lambda o: 1.0 - o.kv / o.d.kv_cap, 0, 1, "free KV fraction"),
    Feature("projected", _projected, 0, 8, "projected load L_w(t + h) / S at h = H/4, H/2, H", width="3",
            when="horizon"),
)
N_GLOBAL = len(GLOBAL)  # every global feature is one entry
N_WORKER = sum(1 for f in ROW if f.when is None)  # a worker's row without the optional horizon features


class RouterCore(LayoutCore, DecodeCore, DecodeRouter):
    """The worker formulation's policy core (envs/base.py's PolicyCore): decisions, masks, observations, admissions,
    shared by the env and its AgentPolicy. The pick formulation's is envs/decode_pick.py's Picker."""

    def __init__(self, order: str = "length", max_workers: int | None = None, token_scale: float = 1024.0,
                 horizon_features: str | None = None, horizon: int = 48, train_trace: str | None = "workload",
                 skip: bool = True, action: str = "worker"):
        check_choice(action, "env.action", ("worker",))  # action="pick" builds a Picker (envs/decode_pick.py)
        self.skip = check_bool(skip, "env.skip")
        check_choice(order, "env.order", ORDERS)
        self.order = order
        self.max_workers = check_rows(max_workers, "env.max_workers", allow_none=True)
        self.token_scale = check_float(token_scale, "env.token_scale", lo_open=True)
        self.projector: Projector | None = None
        if horizon_features is not None:
            try:
                self.projector = BRH(horizon=horizon, predictor=horizon_features, train_trace=train_trace)
            except ConfigError as exc:
                raise ConfigError(str(exc).replace("policy.decode.", "env.").replace(".predictor:",
                                                                                      ".horizon_features:")) from None
        self.horizon = self.projector is not None

    # -------------------------------------------------------------- spaces
    def bind_size(self, n_workers: int) -> None:
        bind_workers(self, n_workers)
        self.layout = Layout(GLOBAL, ROW, self, {}, self.max_workers)
        self.per_worker, self.obs_size = self.layout.slot_dim, self.layout.size
        self.end = self.max_workers
        self.n_actions = self.max_workers + (2 if self.skip else 1)



    def action_meanings(self) -> list[str]:
        return [f"worker {w}" for w in range(self.max_workers)] + ["END", "SKIP"][: self.n_actions - self.max_workers]

    def describe(self, sim, a: int) -> str:
        """The valid action `a` in words (pdgym-enjoy's decision lines)."""
        where = f" of decode {self.inst}" if len(sim.decode) > 1 else ""
        if a == self.end:
            return f"END (no more admissions to decode {self.inst} until its next step)"
        if a == self.end + 1:
            return f"SKIP req {self.head} ({self.head_load} tok; stays pooled this step)"
        return f"route req {self.head} ({self.head_load} tok) -> worker {a}{where}"

    def default_action(self, sim, mask: np.ndarray) -> int:
        """END when allowed, else the least-loaded worker that fits (the mask never leaves neither)."""
        if mask[self.end]:
            return self.end
        d = sim.decode[self.inst]
        return int(np.argmin(np.where(mask[:d.dp], d.kv, np.iinfo(np.int64).max)))

    # -------------------------------------------------------------- life cycle
    def reset(self, sim):
        if not sim.decode:  # a colocated cluster (md1_single_slot): no decode instance to route to
            raise ConfigError("policy: a decode-routing agent needs decode instances; this scenario's cluster is "
                              "colocated (give a disaggregated scenario)")
        self.bind_size(max(d.dp for d in sim.decode))
        if self.projector is not None:
            self.projector.reset(sim)
        self._ones = np.ones(0)  # the "present" column (read-only use)
        self.bounds = Boundaries(self.open_boundary)  # the boundary whose candidate order is kept; closed ones
        self.head: int | None = None
        self.inst = 0
        self.n_admitted = 0

    def open_boundary(self, sim, inst: int) -> None:
        """First decision of a boundary: order the pool once (nothing enters it until the step runs).

        Arrays only (a boundary usually ends after a few of the pool's requests): the candidates, their
        loads, prefix sums (the pool summary from a position on is the total minus a prefix) and, in
        arrival order, suffix maxima (in length order the head's own load is the maximum of the rest)."""
        rids = np.fromiter(sim.pool, dtype=np.int64, count=len(sim.pool))
        loads = sim.req.prompt[rids] + sim.req.done[rids]
        if self.order == "length":
            o = np.argsort(-loads, kind="stable")
            rids, loads = rids[o], loads[o]
        self._cand = rids
        self._loads = loads
        self._csum = np.cumsum(loads)
        self._neg = -loads if self.order == "length" else None  # ascending: bisect for the first that fits
        self._sufmax = np.maximum.accumulate(loads[::-1])[::-1] if self.order != "length" else None
        self._pos = 0
        self.n_admitted = 0
        self._proj = self.projector.projection(sim, inst) if self.projector is not None else None

    def next_decision(self, sim, inst: int) -> bool:
        """Find the head for instance `inst`; False when this boundary has no decision left.

        A boundary is (instance, step count, time): an idle instance woken by a new pool request at a
        later time gets a fresh one, and a closed boundary of an instance with nothing running is
        reopened (its pool changed), so no request is ever stranded.
        """
        if not self.bounds.enter(sim, inst):
            return False
        self.inst = inst
        d = sim.decode[inst]
        lim = d.batch_limit  # the largest KV room of a worker with a free slot, on Python ints (a few workers)
        rooms = [c - k for b, k, c in zip(d.batch.tolist(), d.kv.tolist(), d.kv_cap.tolist()) if b < lim]
        if rooms:
            room = max(rooms)
            loads, n, pos = self._loads, len(self._loads), self._pos
            if pos < n and loads[pos] > room:  # requests that fit no worker now stay pooled for a later step
                if self._neg is not None:
                    pos = max(pos, int(np.searchsorted(self._neg, -room, side="left")))
                else:
                    fit = np.flatnonzero(loads[pos:] <= room)
                    pos = pos + int(fit[0]) if len(fit) else n
            if pos < n:
                self.head = int(self._cand[pos])
                self.head_load = int(loads[pos])
                self._pos = pos + 1
                return True
            self._pos = n
        self.close(sim, inst)
        return False

    def close(self, sim, inst: int) -> None:
        self.bounds.close(sim, inst)
        self.head = None

    def mask(self, sim) -> np.ndarray:
        d = sim.decode[self.inst]
        m = np.zeros(self.n_actions, dtype=bool)
        m[:d.dp] = feasible(d, self.head_load)
        m[self.end:] = any(d.batch.tolist())  # = bool(d.batch.any()), without a NumPy reduction
        return m

    def act(self, sim, action: int) -> None:
        """Admit the head to worker `action`, end the boundary (END) or leave the head pooled (SKIP)."""
        a = int(action)
        inst = self.inst
        if a == self.end:
            self.close(sim, inst)
            return
        if a == self.end + 1:
            self.head = None
            return
        d = sim.decode[inst]
        if not (0 <= a < d.dp) or not sim.admit(self.head, inst, a):
            raise ValueError(f"DecodeRouting: action {a} is masked (worker full or no KV room for the head)")
        self.n_admitted += 1
        if self._proj is not None:
            self._proj[a] += self.head_load
            self.projector.admitted(sim, self.head)
        self.head = None

    # -------------------------------------------------------------- observation
    def observe(self, sim, mask: np.ndarray) -> np.ndarray:
        o = _Obs().fill(self, sim, mask)
        kv = o.kv
        o.batch = o.d.batch / o.B
        o.margin = (o.lmax - kv) / o.S
        o.i = self._pos - 1  # the head's position: the summary covers the head and the requests after it
        # the free slots summed on Python ints as DecodeObs.fill sums the KV (exact: the same float); the row
        # columns all float64 (one conversion in Layout.build)
        o.free_sum = float(o.n * o.B - sum(o.d.batch.tolist()))
        if len(self._ones) != o.n:
            self._ones = np.ones(o.n)
        o.ones = self._ones
        return self.layout.build(o, o.n)


class _StepMeter:
    """Accounts each executed step of one decode instance (kv is its KV at step start)."""

    def __init__(self, ref_tput: float):
        self.ref = ref_tput
        self.reset()

    def reset(self):
        self.idle = 0.0  # sum over steps of sum_w (L_max - L_w) / (N L_max)
        self.tput = 0.0  # sum over steps of tokens / dur / ref
        self.steps = 0
        self.imb = 0.0  # sum over steps of L_max - L_min

    def add(self, dur: float, batch: np.ndarray, kv: np.ndarray) -> None:
        # One call per decode step of every instance: Python's reductions over the DP workers' few values cost
        # a quarter of NumPy's per-call overhead, and give the same floats (token counts are integers: every
        # sum is exact in any order).
        loads = kv.tolist()
        mx = max(loads)
        if mx > 0:
            self.idle += 1.0 - (sum(loads) / len(loads)) / mx
        self.imb += mx - min(loads)
        self.tput += sum(batch.tolist()) / dur / self.ref
        self.steps += 1


class _StepMeters(Observer):
    """Feeds every decode step to its instance's meter (the reward reads them)."""

    def __init__(self, meters: list[_StepMeter]):
        self.meters = meters

    def on_pass_start(self, sim, p):
        if p.kind == PassKind.DECODE:
            self.meters[p.inst].add(p.dur, p.decode_reqs, p.decode_kv)


class DecodeRoutingEnv(PdgymEnv):
    """## Description

    The agent is the decode router of a decode tier (BalanceRoute's setting, ALGORITHMS.md s6): at
    each step boundary of a decode instance with a non-empty pool and a free slot it admits pooled
    requests one at a time to the instance's DP-attention workers, which then step together behind
    a barrier (the step lasts as long as its heaviest worker). Prefill runs a configured baseline.
    The pool is ordered by length, descending (`order="length"`, BalanceRoute's window order) or by
    arrival (`order="arrival"`); the head is the first request in that order that some worker can take.

    One env per scenario: `gym.make("pdgym/DecodeRouting-v0", scenario="decode_tier_ht_n16")`; the
    disaggregated scenarios of `pdgym.envs.scenario.scenario_names()` apply (decode_tier_n8 / n16 / n32,
    decode_tier_ht_n8 / n16 / n32, decode_tier_iqr_n32, ds_v3_h800_3p1d*, pd_ratio_*p*d).

    ## Action Space

    `Discrete(max_workers + 2)` (`skip=True`, default) or `Discrete(max_workers + 1)` (`skip=False`):
    w < max_workers puts the head on worker w; max_workers (END) closes admissions until the next
    step; max_workers + 1 (SKIP) leaves the head pooled for this step and offers the next request,
    which gives the agent BalanceRoute's request selection. `action_masks()` allows the workers with a
    free slot and KV room for the head, and END / SKIP unless the instance has no running request
    (ending then would idle it). `get_action_meanings()` names each action.

    Invalid actions: {rule} Here the default action is END when allowed, else the least-loaded worker
    that fits.

    `action="pick"` (envs/decode_pick.py) is the other formulation: the env names the worker whose turn it
    is, as BalanceRoute's loop does (most free slots, then the largest safe margin), and the agent picks its
    requests among K = `window` candidates (the K oldest pooled requests; while more than `stage1_free` of
    the slots are free, the K that score best for it), then says DONE or END: `Discrete(window + 2)`, an
    observation of one row per candidate (its load, BR-0's score F_w(load), whether it fits, the margin
    after it, its age). BR-0 played through it is BR-0 (`teacher_action`, tested: identical runs).

    ## Observation Space

    `Box(low, high, (G + R max_workers,), float32)`, [global (G = 12 entries) | one row of R entries per worker],
    R = 8 (+ 3 with `horizon_features`); padding rows are zero; `obs_layout` describes it and each entry lies in
    its feature's [min, max]. S = batch_limit x `token_scale`, B = batch limit, N = workers, L_w = KV tokens of
    worker w, L_max = max_w L_w. The table is generated from the declaration (GLOBAL, ROW; envs/features.py).

    {features}

    The projection is BR-H's (`horizon_features` names its predictor: oracle, survival or memo; `horizon` = H
    steps).

    ## Rewards

    `reward="idle"` (default): for every decode step executed since the previous action, minus its
    barrier idle as a fraction of the step's worst case, sum_w (L_max - L_w) / (N L_max) (the step
    reads L_w KV tokens on worker w and waits for the heaviest); 0 for decisions inside one boundary.
    The fraction is scale-free, so holding requests back does not pay (a thinly loaded tier is
    maximally unbalanced). `reward="throughput"`: for every executed step, its output tokens per
    second over a reference (N B tokens in the step time of a balanced, full tier with S KV tokens
    per worker). `reward="imbalance"`: for every executed step, minus its L_max - L_min over S (the board's
    primary metric, imbalance_mean, summed; meant with work-conserving admissions, action="pick", where holding
    requests back is not an action). Each times `reward_scale`.

    ## Starting State

    An empty cluster at t = 0; `reset` runs the simulator to the first decision. On a trace
    workload the episode replays a window of the trace drawn from `trace_split` (default "train");
    the seed draws the window and the simulator's random streams (see `TraceWindow`).

    ## Episode End

    Terminated when every request of the episode's workload is resolved (finished or rejected).
    Truncated after `max_episode_steps` decisions (registered default {max_steps}; gym.make's
    TimeLimit) or when decisions let no request progress for `stall_s` simulated seconds
    (info["stalled"]). info carries running metrics (imbalance_mean, idle_frac_mean,
    throughput_tok_s, pool, finished, decode_steps, decisions, invalid_actions) and, when the env ends the
    episode (terminated or stalled), the run's `summary` (DESIGN section 5 keys;
    `env.unwrapped.summary()` after TimeLimit's truncation).

    ## Arguments

    Episode: `scenario` ("decode_tier_n16"), `overrides` (Hydra-style, e.g.
    ["workload.num_requests=600"]), `config` (nested dict merged over it), `trace_split` ("train" |
    "val" | "test" | None), `stall_s` (60.0), `render_mode` (None | "ansi" | "rgb_array"); reward:
    `reward` ("idle" | "throughput" | "imbalance"), `reward_scale` (1.0); other points: `prefill` ("round_robin"),
    `batching` (None); observation and actions (the policy core's, also taken by AgentPolicy):
    `order` ("length"), `max_workers` (None: the tier's), `token_scale` (1024.0), `horizon_features`
    (None | oracle | survival | memo), `horizon` (48), `train_trace` ("workload"), `skip` (True), `action`
    ("worker" | "pick"; with "pick": `window` (12), `stage1_free` (0.25), `max_workers`, `token_scale`,
    `work_conserving` (False; True masks END: every boundary admits until no worker is open or the pool is empty),
    `horizon_features` (None | survival | memo: the named worker's expected margin and departures in `horizon`
    steps, by BR-H's forecast from the running requests' ages), `horizon` (48), `train_trace` ("workload")).

    {torch}

    `AgentPolicy(predict, **env_kwargs)` runs a trained agent as a DecodeRouter through `simulate()`
    with the same observation and action code; `teacher_action(policy)` gives the action that follows
    a baseline router's plan for the current boundary (behaviour cloning).

    ## Version History

    - v0: first version (base contract: one invalid-action rule, stall detection, seeded trace
      windows, render modes).
    """

    ENV_ID = ENV_ID
    POINT = "decode"
    DEFAULT_SCENARIO = "decode_tier_n16"

    def __init__(self, scenario: str = "decode_tier_n16", *, prefill="round_robin", batching=None,
                 reward: str = "idle", reward_scale: float = 1.0, **kwargs):
        self.prefill_spec, self.batching_spec = prefill, batching
        make_policy("prefill", prefill)  # fail at construction on a bad spec
        make_policy("batching", batching)
        check_choice(reward, "env.reward", REWARDS)
        self.reward_kind = reward
        self.reward_scale = check_float(reward_scale, "env.reward_scale", lo_open=True)
        self._teacher = None
        super().__init__(scenario, **kwargs)

    # -------------------------------------------------------------- PdgymEnv hooks
    def _check_cluster(self, probe):
        if not probe.decode:
            raise ConfigError("env.scenario: DecodeRouting needs a disaggregated cluster (decode instances)")

    def _make_core(self, options):
        check_choice(options.get("action", "worker"), "env.action", option_values("decode", "action", "worker"))
        return super()._make_core(options)

    def _size_core(self, probe):
        super()._size_core(probe)
        d0 = probe.decode[0]
        S = d0.batch_limit * self.core.token_scale
        full = np.full(d0.dp, float(d0.batch_limit))
        self._ref_tput = d0.dp * d0.batch_limit / d0.cost.pass_time(d0.zeros, d0.zeros, full, np.full(d0.dp, S))
        self._S = S

    def _policies(self):
        return {"prefill": make_policy("prefill", self.prefill_spec),
                "batching": make_policy("batching", self.batching_spec), "decode": self.core}

    def _begin(self):
        self.meters = [_StepMeter(self._ref_tput) for _ in self.sim.decode]
        self.sim.observe(_StepMeters(self.meters))
        self._mark = (0.0, 0.0, 0.0)
        self._teacher = None
        return self._advance()

    def _act(self, a):
        r, sim = self.core, self.sim
        return False if r.apply(sim, a) else self._advance()

    def _reward(self):
        idle = sum(m.idle for m in self.meters)
        tput = sum(m.tput for m in self.meters)
        imb = sum(m.imb for m in self.meters)
        d_idle, d_tput, d_imb = idle - self._mark[0], tput - self._mark[1], imb - self._mark[2]
        self._mark = (idle, tput, imb)
        r = -d_idle if self.reward_kind == "idle" else d_tput if self.reward_kind == "throughput" else -d_imb / self._S
        return float(r * self.reward_scale)

    def _observe(self):
        r = self.core
        if self._done or r.head is None:
            self._mask = self._end_only()
            return np.zeros(self.core_observation_space.shape, dtype=np.float32)
        self._mask = r.mask(self.sim)
        return r.observe(self.sim, self._mask)

    def action_masks(self) -> np.ndarray:
        self._require_reset("action_masks")
        if self._done:
            return self._end_only()
        return self._mask.copy()

    def _describe(self, a) -> str:
        return self.core.describe(self.sim, int(a))

    def default_action(self) -> int:
        if self._done or self.sim is None:
            return self.core.end
        return self.core.default_action(self.sim, self._mask)

    def _info_extra(self):
        sim = self.sim
        steps = sum(m.steps for m in self.meters)
        return {"decode_steps": steps, "pool": len(sim.pool), "throughput_tok_s": sim.tokens_out / max(sim.now, 1e-12),
                "imbalance_mean": sum(m.imb for m in self.meters) / steps if steps else 0.0,
                "idle_frac_mean": sum(m.idle for m in self.meters) / steps if steps else 0.0}

    # -------------------------------------------------------------- behaviour cloning
    def teacher_action(self, teacher: DecodeRouter) -> int:
        """The action that follows `teacher`'s plan for this boundary (a dry run of its route() on a copy).

        The head goes where the teacher put it; a head the teacher left pooled is skipped while the plan
        has requests left, and the boundary ends when the plan is used up. With skip=False such a head
        takes the worker of the unplaced planned request closest in load (the env cannot skip it). A
        teacher is exact through the env when the env's order lists its picks (skip=True: always).
        """
        sim, r = self.sim, self.core
        if self._done:
            return r.end
        if isinstance(r, Picker):
            return self._pick_teacher(teacher)
        if self._teacher is None or self._teacher[0] is not teacher:
            teacher.reset(sim)
            self._teacher = (teacher, None, {})
        key = (r.inst, sim.decode[r.inst].steps, sim.now)
        if self._teacher[1] != key:
            dry = AdmissionDryRun(sim, r.inst)  # draws from sim.rng, as the teacher would inside simulate()
            teacher.route(dry, r.inst)
            self._teacher = (teacher, key, dry.plan)
        plan = self._teacher[2]
        m = self._mask
        w = plan.pop(r.head, None)
        if w is None and plan:
            if r.skip and m[r.end + 1]:
                return r.end + 1
            loads = sim.req.prompt + sim.req.done
            w = plan.pop(min(plan, key=lambda q: abs(int(loads[q]) - r.head_load)))
        if w is not None and m[w]:
            return int(w)
        return r.default_action(sim, m)

    def _pick_teacher(self, teacher: DecodeRouter) -> int:
        """The pick formulation's teacher: BR-0 only, whose action is computed from the state (br0_action)."""
        if getattr(teacher, "name", None) != "br0":
            raise ConfigError(f"agent.bc.teacher: the pick formulation (env.action=pick) clones br0, not "
                              f"{getattr(teacher, 'name', teacher)!r}")
        r = self.core
        key = (r.inst, self.sim.decode[r.inst].steps, self.sim.now, r.w)
        if self._teacher is None or self._teacher[0] != key or r.took == 0:
            self._teacher = (key, [])
        return br0_action(r, self.sim, self._mask, self._teacher[1])

    # -------------------------------------------------------------- helpers
    def _end_only(self) -> np.ndarray:
        m = np.zeros(self.core.n_actions, dtype=bool)
        m[self.core.end] = True
        return m

    def _advance(self) -> bool:
        """Run the simulator to the next decision (False) or the end of the run (True)."""
        sim = self.sim
        done = sim.run()
        while not done and self.core.head is None:  # a pause with no pending decision cannot happen,
            done = sim.run()  # but a stray pause (another policy) must not stall the env
        return done


DecodeRoutingEnv.__doc__ = DecodeRoutingEnv.__doc__.format(rule=INVALID_ACTION_RULE, torch=TORCH_THREADS_NOTE,
                                                           max_steps=MAX_EPISODE_STEPS,
                                                           features=table(GLOBAL, ROW, "worker w"))


AgentPolicy = DecodeRoutingEnv.agent_policy  # envs/base.py: the formulation's core answered by predict(obs, mask)


def make_env(**kwargs) -> DecodeRoutingEnv:
    """The raw env (no wrappers, so its attributes are at hand): no TimeLimit, so episodes run until
    they terminate or stall. gym.make(ENV_ID, **kwargs) adds the registered max_episode_steps."""
    return DecodeRoutingEnv(**kwargs)
