"""PrefillDispatch-v0: the agent is the global prefill scheduler of a P/D cluster; decode runs a baseline.

`PrefillDispatchEnv` (its docstring documents the env in Gymnasium's sections) and the policy core it
shares with `AgentPolicy` (a trained agent as a PrefillScheduler inside `simulate()`); its reward is
envs/wait_meter.py's; a baseline scheduler teaches (behaviour cloning) through the shadow
simulator `DispatchRecorder` (envs/shadow.py). Each formulation has its core (envs/specs.py): timing and allocation
`DispatchCore` here, composition envs/prefill_compose.py's, route envs/prefix_route.py's, admit envs/slo_admit.py's.
"""

from __future__ import annotations

import math

import numpy as np
from pdgym.baselines import make_policy
from pdgym.baselines.pbaa import PBAA, CapacityModel, prefix_hits
from pdgym.baselines.shared import Allocator, Capacity
from pdgym.envs.arrival_window import ArrivalWindow
from pdgym.envs.base import INVALID_ACTION_RULE, TORCH_THREADS_NOTE, DecidingCore, PdgymEnv
from pdgym.envs.features import Feature, Layout, LayoutCore, check_rows, table
from pdgym.envs.shadow import shadow_teacher
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.points import POINTS
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.validation import check_bool, check_choice, check_float
from pdgym.envs.slo_admit import AttainmentMeter
from pdgym.envs.specs import option_values
from pdgym.envs.wait_meter import WaitMeter

ENV_ID = POINTS["prefill"].env_id  # pdgym/PrefillDispatch-v0
MAX_EPISODE_STEPS = POINTS["prefill"].max_episode_steps
CLIP = 5.0
_LOG256 = math.log1p(256)


class _Obs:
    """What the features of one observation read, computed once (`DispatchCore.context`)."""

    __slots__ = ("cap", "chunk", "core", "D", "healthy", "head", "ids", "j", "long", "n", "n_act", "nb", "now",
                 "req", "short", "sim", "slo", "tf", "work", "age")


def _rate(o: _Obs) -> float:
    return o.core._arrivals.load(o.now, o.core._cap_tok_s)


def _queue(o: _Obs):
    if not o.nb:
        return None
    K = o.core.K
    blk = np.zeros((K, 3))
    k = min(o.nb, K)
    blk[:k, 0] = 1.0
    blk[:k, 1] = o.work[:k] / o.chunk
    blk[:k, 2] = o.age[:k] / o.slo
    return blk.ravel()


def _hits(o: _Obs):
    if not o.nb:
        return None
    return np.concatenate([prefix_hits(o.sim, i, [o.head])[0] for i in range(o.n)]) / o.chunk


def _classes(o: _Obs, value) -> np.ndarray | None:
    """(short, long) of `value(ids)` where the class is non-empty, else 0."""
    if not o.nb:
        return None
    return np.array([value(ids) if ids else 0.0 for ids in (o.short, o.long)])


def _median(o: _Obs) -> float:
    if not o.nb:
        return 0.0
    med = o.core.classes.median
    return med / o.chunk if math.isfinite(med) else 0.0


def _passed_over(o: _Obs) -> float:
    if not o.nb or not o.long:
        return 0.0
    passed = o.core.classes.passed_over
    return sum(1 for r in o.long if r in passed) / len(o.long)


def _target(o: _Obs):
    t = o.core._target
    if not o.nb or t is None:
        return None
    v = np.zeros(o.n)
    v[t] = 1.0
    return v


def _last_forward(o: _Obs) -> np.ndarray:
    v = o.cap.last_forward() / o.tf
    v[np.isnan(v)] = 0.0  # no pass reported yet (np.nan_to_num, without its inf handling: none here)
    return v


# The observation, declared once: [GLOBAL | one ROW per instance]. T_full is the cost model's time of a full-chunk
# pass (the offline profile), chunk the per-unit token budget, K = obs_requests, N instances of D DP units.
GLOBAL = (
    Feature("buffered", lambda o: o.nb and math.log1p(o.nb) / _LOG256, 0, 5, "log1p(buffered requests) / log1p(256)"),
    Feature("buffered_tokens", lambda o: o.nb and o.work.sum() / (o.D * o.chunk), 0, 5,
            "buffered prefill tokens / (D chunk)"),
    Feature("oldest_age", lambda o: o.nb and o.age[0] / o.slo, 0, 5, "oldest buffered age / SLO TTFT"),
    Feature("arrival_rate", _rate, 0, 5, "arrival token rate / cluster token capacity (N D chunk / T_full)",
            saturates=True),
    Feature("t_fwd", lambda o: o.cap.t_fwd / o.tf, 0, 5, "T_fwd / T_full"),
    Feature("since_release", lambda o: (o.now - o.core.last_release) / o.tf, 0, 5, "time since the last release / T_full",
            saturates=True),
    Feature("interval", lambda o: (o.cap.t_fwd + o.core._lnet) / max(o.n_act, 1) / o.tf, 0, 5,
            "(T_fwd + L_net) / healthy instances / T_full"),
    Feature("left_over", lambda o: o.nb and o.core.pbaa.n_left_over(o.sim.buffer) / o.nb, 0, 1,
            "share of the buffer left over from earlier cycles"),
    Feature("healthy_share", lambda o: o.n_act / o.n, 0, 1, "share of instances healthy"),
    Feature("candidate_prompt", lambda o: o.nb and o.work[o.j] / o.chunk, 0, 5,
            "candidate prompt / chunk (timing: the oldest buffered request)"),
    Feature("candidate_age", lambda o: o.nb and o.age[o.j] / o.slo, 0, 5, "candidate age / SLO TTFT"),
    Feature("candidate_wait", lambda o: o.nb and o.core.pbaa.wait_cycles(o.head) / (o.core.pbaa.n_limit + 1), 0, 5,
            "candidate wait cycles / (n_limit + 1)"),
    Feature("queue", _queue, 0, 5, "k-th oldest buffered request (k = 0..K-1): present, prompt / chunk, age / SLO TTFT",
            width="3 K"),
    Feature("prefix_hits", _hits, 0, 5, "candidate's prefix-cache hit tokens / chunk on unit d of instance i "
            "(entry i D + d)", width="N D", when="cache_aware"),
    Feature("median", _median, 0, 5, "median prompt / chunk", when="composition"),
    Feature("class_share", lambda o: _classes(o, lambda ids: len(ids) / o.nb), 0, 1, "share of the buffer short, long",
            width="2", when="composition"),
    Feature("class_tokens", lambda o: _classes(o, lambda ids: o.req.work[ids].sum() / (o.D * o.chunk)), 0, 5,
            "short, long buffered tokens / (D chunk)", width="2", when="composition"),
    Feature("class_age", lambda o: _classes(o, lambda ids: (o.now - o.req.arrival[ids[0]]) / o.slo), 0, 5,
            "oldest short, long age / SLO TTFT", width="2", when="composition"),
    Feature("passed_over", _passed_over, 0, 1, "share of the long prompts passed over by an earlier short release",
            when="composition"),
    Feature("target", _target, 0, 1, "the release goes to instance i (one-hot)", width="N", when="composition"),
)
ROW = (
    Feature("present", lambda o: [1.0] * o.n, 0, 1, "instance i present"),
    Feature("healthy", lambda o: o.healthy, 0, 1, "healthy"),
    Feature("busy", lambda o: o.cap.busy(), 0, 1,
            "busy (no EndForward since our last dispatch, a quiescence poll finds work)"),
    Feature("expected_free", lambda o: [o.cap.expected_free(i, o.now) / o.tf for i in range(o.n)], 0, 5,
            "expected time to free / T_full"),
    Feature("reported", lambda o: o.cap.reported().sum(axis=1) / (o.D * o.chunk), 0, 5,
            "reported device-queue tokens / (D chunk)"),
    Feature("last_forward", _last_forward, 0, 5, "last forward time / T_full"),
    Feature("c_avail", lambda o: np.maximum(o.cap.avail(), -CLIP * o.chunk) / o.chunk, -CLIP, 1,
            "C_avail of unit d / chunk (entry 6 + d)", width="D"),
)


class DispatchCore(LayoutCore, DecidingCore, PrefillScheduler):
    """The timing and allocation formulations' policy core (envs/base.py's PolicyCore): observation, mask, action
    and decision-epoch code shared by the env and AgentPolicy. Composition's is envs/prefill_compose.py's."""

    composition = False  # the composition features (when="composition") are ComposeCore's

    def __init__(self, mode: str = "timing", tick_s: float = 0.02, obs_requests: int = 16, window: int = 32,
                 n_limit: int = 3, overload: str = "reject", cache_aware: bool = False, mask_full: bool = True):
        check_choice(mode, "env.mode", option_values("prefill", "mode", "timing"))  # the formulations (envs/specs.py)
        check_float(tick_s, "env.tick_s", lo_open=True)
        check_rows(obs_requests, "env.obs_requests")
        for key, v in (("cache_aware", cache_aware), ("mask_full", mask_full)):
            check_bool(v, f"env.{key}")
        self.mode = mode
        self.tick_s = float(tick_s)
        self.K = obs_requests
        self.cache_aware = cache_aware
        self.mask_full = mask_full
        self.cap: Capacity
        self.pbaa: Allocator
        self._models(window, n_limit, overload, cache_aware)
        self.n = self.D = 0

    def _models(self, window: int, n_limit: int, overload: str, cache_aware: bool) -> None:
        """The capacity model and the allocator the scheduler keeps."""
        self.cap = CapacityModel(window, None)
        self.pbaa = PBAA(n_limit, overload, cache_aware=cache_aware)

    # -------------------------------------------------------------- sizes
    def bind(self, sim) -> None:
        self.set_dims(len(sim.prefill), sim.prefill[0].dp)

    def set_dims(self, n: int, dp: int) -> None:
        self.n, self.D = n, dp
        self.layout = Layout(GLOBAL, ROW, self, {"K": self.K, "N": n, "D": dp}, n)
        self.global_dim, self.slot_dim, self.obs_size = self.layout.global_dim, self.layout.slot_dim, self.layout.size
        self.n_actions = 1 + n if self.mode == "timing" else 2 + n * dp
        self.skip = self.n_actions - 1 if self.mode == "allocation" else None



    def action_meanings(self) -> list[str]:
        if self.mode == "timing":
            return ["hold", *(f"release the buffer to instance {i}" for i in range(self.n))]
        return ["hold", *(f"candidate to instance {i} unit {d}" for i in range(self.n) for d in range(self.D)),
                "skip the candidate"]

    def describe(self, sim, a: int) -> str:
        """The valid action `a` in words (pdgym-enjoy's decision lines)."""
        nb = len(sim.buffer)
        reqs = f"{nb} request{'s' if nb != 1 else ''}"
        if a == 0:
            return f"hold ({reqs} buffered)"
        if self.mode == "timing":
            return f"release the buffer ({reqs}) -> prefill {a - 1}"
        rid = self.candidate(sim)
        if a == self.skip:
            return f"SKIP req {rid} (stays buffered; the next one is offered)"
        inst, d = divmod(a - 1, self.D)
        return f"route req {rid} ({int(sim.req.work[rid])} tok) -> prefill {inst} unit {d}"

    def default_action(self, sim=None, mask=None) -> int:
        """Hold (always allowed); in composition mode, release the whole buffer (what SBS does)."""
        return 0

    # -------------------------------------------------------------- life cycle and epochs
    def reset(self, sim) -> None:
        self.cap.reset(sim)
        if (self.n, self.D) != (self.cap.n, self.cap.dp):
            self.set_dims(self.cap.n, self.cap.dp)
        self.pbaa.reset()
        self.last_release = 0.0
        self._tick_at = math.inf
        self._arrivals = ArrivalWindow()
        self._lnet = sim.cfg.cluster.net_latency_s
        self._slo = sim.cfg.slo.ttft_s
        chunk = float(self.cap.chunk_tokens)
        self._chunk = chunk
        self._cap_tok_s = self.n * self.D * chunk / self.cap.t_full
        self._healthy = sim.prefill_healthy[: self.n].copy()
        self._skipped = set()
        self.teacher = None
        self.intents: dict[int, tuple[int, int | None]] = {}
        self._rr: dict[int, int] = {}  # per instance: dispatches the engine placed round robin (teacher)
        self._proxy = None
        self._target = None  # composition: the instance SBS is releasing to, while the agent composes the release

    def decide(self, sim) -> None:
        self.decider.decide(self, sim)

    def _epoch(self, sim) -> None:
        if sim.buffer:
            self._begin(sim)
        if sim.buffer and self._tick_at == math.inf:
            self._tick_at = t = sim.now + self.tick_s
            sim.set_timer(t, "prefill", ("tick", t))

    def on_arrival(self, sim, rid: int) -> None:
        self._arrivals.note(sim, rid)
        if self.teacher is not None:
            self.teacher.on_arrival(self._proxy, rid)
        self._epoch(sim)

    def on_end_forward(self, sim, inst: int, fwd_time: float) -> None:
        self.cap.end_forward(sim, inst, fwd_time)
        if self.teacher is not None:
            self.teacher.on_end_forward(self._proxy, inst, fwd_time)
        self._epoch(sim)

    def on_topology_change(self, sim) -> None:
        healthy = sim.prefill_healthy[: self.n]
        for i in np.flatnonzero(healthy != self._healthy).tolist():
            self.cap.clear(i)  # a failed or a fresh instance: nothing of ours is on it
        self._healthy = healthy.copy()
        if self.teacher is not None:
            self.teacher.on_topology_change(self._proxy)
        self._epoch(sim)

    def on_timer(self, sim, tag) -> None:
        if tag[0] == "teacher":
            if self.teacher is not None:
                self.teacher.on_timer(self._proxy, tag[1])
                if self.intents and sim.buffer:
                    self._begin(sim)
            return
        if tag[1] == self._tick_at:
            self._tick_at = math.inf
        self._epoch(sim)

    def _begin(self, sim) -> None:
        self._skipped = set()
        self.poll(sim)
        self.decide(sim)

    def candidate(self, sim) -> int | None:
        """The request the next allocation action is about: the oldest buffered one not skipped."""
        skipped = self._skipped
        return next((r for r in sim.buffer if r not in skipped), None)

    # -------------------------------------------------------------- what the agent sees
    def poll(self, sim) -> None:
        """Quiescence poll of the instances the scheduler believes busy (as SBS does before releasing; in
        composition mode SBS polls for itself): once as each decision is reached (an epoch begins, or `apply`
        asks for the next decision of the same instant), never by observing or masking, which only read."""
        cap = self.cap
        for i in np.flatnonzero(cap.busy()).tolist():
            cap.poll(sim, i)

    def context(self, sim) -> _Obs:
        """What this observation's features read (GLOBAL, ROW), computed once."""
        o = _Obs()
        o.core, o.sim, o.cap, o.req, o.now = self, sim, self.cap, sim.req, sim.now
        o.chunk, o.slo, o.tf, o.n, o.D = self._chunk, self._slo, self.cap.t_full, self.n, self.D
        o.healthy = healthy = sim.prefill_healthy[: self.n]
        o.n_act = int(healthy.sum())
        buf = sim.buffer
        o.nb = nb = len(buf)
        if nb:
            ids = np.fromiter(buf, dtype=np.int64, count=nb)
            o.ids, o.work, o.age = ids, o.req.work[ids], o.now - o.req.arrival[ids]
            head = self.candidate(sim) if self.mode == "allocation" else int(ids[0])
            if head is None:
                head = int(ids[0])
            o.head = head
            o.j = 0 if head == ids[0] else int(np.flatnonzero(ids == head)[0])
        return o

    def observe(self, sim, mask=None) -> np.ndarray:
        return self.layout.build(self.context(sim), self.n)

    def mask(self, sim) -> np.ndarray:
        cap = self.cap
        healthy = sim.prefill_healthy[: self.n]
        m = np.zeros(self.n_actions, dtype=bool)
        m[0] = True
        if not sim.buffer:
            return m
        room = cap.avail() > 0 if self.mask_full else np.ones((self.n, self.D), bool)
        if self.mode == "timing":
            m[1:] = healthy & room.any(axis=1)
        elif self.candidate(sim) is not None:
            m[1:-1] = (room & healthy[:, None]).ravel()
            m[-1] = len(sim.buffer) - len(self._skipped) > 1
        return m

    # -------------------------------------------------------------- actions
    def apply(self, sim, a: int) -> bool:
        """Carry out the valid action `a` (resolve_action first); True if the epoch goes on (allocation mode: the
        next decision of the same instant, polled for)."""
        go_on = False
        if a and sim.buffer:
            if self.mode == "timing":
                self.pbaa.release(sim, a - 1, self.cap)
                self.last_release = sim.now
            else:
                rid = self.candidate(sim)
                if a == self.skip:
                    self._skipped.add(rid)
                else:
                    inst, d = divmod(a - 1, self.D)
                    sim.dispatch(rid, inst, d)
                    self.cap.dispatched(inst, d, int(sim.req.work[rid]), sim.now)
                    self.last_release = sim.now
                go_on = self.candidate(sim) is not None
        if go_on:
            self.poll(sim)
        return go_on

    def _engine_unit(self, sim, inst: int) -> int:
        """The DP unit the engine would give a request sent to `inst` without one
        (cluster.prefill.dp_dispatch: the least-loaded unit, or the instance's next in round robin)."""
        if sim.cfg.cluster.prefill.dp_dispatch == "round_robin":
            k = self._rr.get(inst, 0)
            self._rr[inst] = k + 1
            return k % self.D
        return int(np.argmin(sim.prefill[inst].load_tokens()))

    def teacher_action(self, sim, teacher: PrefillScheduler) -> int:
        """This env's action for what `teacher` (a prefill baseline, run in the shadow) would do now.

        The teacher sees every event through a recorder that notes its dispatches instead of
        doing them; a noted dispatch stays pending until the env carries it out. Timing:
        release to the instance of the oldest pending dispatch the mask allows, else hold.
        Allocation: place the candidate where the teacher sent it (the unit the engine would pick,
        `_engine_unit`, if it left the choice to the engine; the roomiest allowed unit of that instance
        if the mask forbids that one), else skip it if other dispatches are pending, else hold.
        """
        shadow_teacher(self, sim, teacher)
        buf = sim.buffer
        for r in [r for r in self.intents if r not in buf]:
            del self.intents[r]
        if not self.intents:
            return 0
        mask = self.mask(sim)
        if self.mode == "timing":
            return next((1 + i for i, _ in self.intents.values() if mask[1 + i]), 0)
        head = self.candidate(sim)
        if head in self.intents:
            inst, dp = self.intents[head]
            if dp is None:
                dp = self._engine_unit(sim, inst)
            a = 1 + inst * self.D + dp
            if mask[a]:
                return a
            row = mask[1 + inst * self.D: 1 + (inst + 1) * self.D]
            if row.any():
                c = np.where(row, self.cap.c_avail(inst), np.iinfo(np.int64).min)
                return 1 + inst * self.D + int(np.argmax(c))
        others = any(r != head and r not in self._skipped for r in self.intents)
        return self.skip if others and mask[self.skip] else 0


class PrefillDispatchEnv(PdgymEnv):
    """## Description

    The agent is the global prefill scheduler of a P/D-disaggregated cluster (the SBS / PBAA setting, ALGORITHMS.md
    s2-3): requests wait in the scheduler's buffer, and the agent decides when to release them to which prefill
    instance (and, in allocation mode, to which DP unit). Decode runs a configured baseline router. Decision epochs:
    a request arrives (or bounces back), an instance reports EndForward, the instance set changes, and a tick every
    `tick_s` seconds while requests are buffered; epochs with an empty buffer are skipped (there is nothing to
    decide). Everything the agent sees is what a real scheduler knows (`pdgym.baselines.pbaa.CapacityModel`).

    One env per scenario: `gym.make("pdgym/PrefillDispatch-v0", scenario="ds_v3_h800_3p1d_long")`;
    the disaggregated scenarios of `pdgym.envs.scenario.scenario_names()` apply (ds_v3_h800_3p1d,
    ds_v3_h800_3p1d_chunk5k, ds_v3_h800_3p1d_long, pd_ratio_1p1d / 1p3d / 2p2d / 3p1d, decode_tier_*).

    ## Action Space

    `mode="timing"` (default): `Discrete(1 + N)`; 0 holds, 1 + i releases the whole buffer to instance i,
    where PBAA allocates it over the DP units (pending first, wait counters, flow control after `n_limit`
    cycles: `overload` = reject | throttle). One decision per epoch.
    `mode="allocation"`: `Discrete(2 + N D)`; the buffered requests are offered one at a time, oldest
    first (the candidate); 0 holds (ends the epoch), 1 + i D + d places the candidate on DP unit d of
    instance i, and the last action skips it (it stays buffered; the next one is offered). The epoch goes
    on at the same instant until the agent holds or every buffered request was placed or skipped.
    `mode="composition"`: `Discrete(3)`; SBS keeps the timing (its interval, readiness and watchdog) and a
    decision comes at each of its releases: 0 sends the whole buffer (what SBS does), 1 its short prompts,
    2 its long prompts, split at the median prompt of the last 256 arrivals (pdgym.baselines.length_classes:
    a pass lasts as long as its longest DP unit, so short prompts released with a long one wait for it).
    `mode="route"` (envs/prefix_route.py: its observation table, no other option): `Discrete(N D)`, no hold; each
    arrival is one decision, i D + d sends it at once to unit d of instance i (healthy instances); one observation
    row per unit (N D rows): the candidate's cached-prefix hit there, backlog, pass state, cache occupancy.
    `mode="admit"` (envs/slo_admit.py: its observation table and reward; P/D or colocated): `Discrete(2)`; each fresh
    arrival is one decision, 0 admits it to `base` (sbs / round_robin), 1 rejects it; the reward is the weighted SLO
    attainment earned (an episode's return is its `slo_attainment`); options `base`, `obs_requests` (8), `slack`.
    `action_masks()`: hold is always allowed; an instance (timing) or a unit (allocation) when health
    checks call it healthy and, with `mask_full` (default), it has capacity (C_avail > 0 on some unit /
    on that unit); skip while another candidate follows; in composition mode a class when it has a
    buffered request. `get_action_meanings()` names each action.

    Invalid actions: {rule} Here the default action is hold (route: the least-loaded allowed unit).

    ## Observation Space

    `Box(low, high, (G + N R,), float32)`, [global (G entries) | one row of R entries per instance], G = 12 + 3 K
    (+ N D with `cache_aware`; + 8 + N in composition mode), R = 6 + D, K = `obs_requests`; `obs_layout` describes
    it and each entry lies in its feature's [min, max]. T_full is the cost model's time of a full-chunk pass (the
    offline profile), chunk the per-unit token budget. The table is generated from the declaration (GLOBAL, ROW;
    envs/features.py); an index's [+ ...] term counts only when that optional feature is on.

    {features}

    ## Rewards

    For the interval between two decisions, minus the waiting time accrued by every request still waiting for its
    first token (request-seconds), so an episode's return is minus the sum of all TTFTs; a rejected request waits
    until its rejection and costs `reject_penalty_s` more (default 10 x SLO TTFT); plus `throughput_weight` x first
    tokens produced in the interval; all divided by `reward_scale`. Decisions at the same instant get 0.

    ## Starting State

    An empty cluster at t = 0; `reset` runs the simulator to the first decision epoch. On a trace workload the
    episode replays a window of the trace drawn from `trace_split` (default "train"); the seed draws the window and
    the simulator's random streams (see `TraceWindow`).

    ## Episode End

    Terminated when every request of the episode's workload is resolved. Truncated after `max_episode_steps`
    decisions (registered default {max_steps}; gym.make's TimeLimit) or on a stall: an agent that keeps holding lets
    no request progress, and after `stall_s` (60) simulated seconds without an output token or a resolved request
    the episode is truncated with info["stalled"] = True (the waiting cost accrued until then is in the rewards).
    info carries running metrics (buffered, first_tokens, rejected_waiting, wait_s_total, ttft_mean, decisions,
    invalid_actions) and, when the env ends the episode (terminated or stalled), the run's `summary` (DESIGN
    section 5 keys; `env.unwrapped.summary()` after TimeLimit's truncation).

    ## Arguments

    Episode: `scenario` ("ds_v3_h800_3p1d"), `overrides` (Hydra-style, e.g. ["workload.num_requests=600"]), `config`
    (nested dict merged over it), `trace_split` ("train" | "val" | "test" | None), `stall_s` (60.0), `render_mode`
    (None | "ansi" | "rgb_array"); reward: `throughput_weight` (0.0), `reject_penalty_s` (None: 10 x SLO TTFT),
    `reward_scale` (1.0); other points: `decode`, `batching` (None: the scenario's); observation and actions (the
    policy core's, also taken by AgentPolicy): `mode` ("timing"), `tick_s` (0.02), `obs_requests` (16), `window`
    (32), `n_limit` (3), `overload` ("reject"), `cache_aware` (False), `mask_full` (True).

    {torch}

    `AgentPolicy(predict, **env_kwargs)` replays a trained agent as a PrefillScheduler through
    `simulate()` with the same observation and action code; `teacher_action(policy)` maps what a
    baseline prefill scheduler would do now onto this env's action (behaviour cloning).

    ## Version History

    - v0: first version (base contract: one invalid-action rule, stall detection, seeded trace
      windows, render modes).
    """

    ENV_ID = ENV_ID
    POINT = "prefill"
    DEFAULT_SCENARIO = "ds_v3_h800_3p1d"

    def __init__(self, scenario: str = "ds_v3_h800_3p1d", *, decode=None, batching=None,
                 throughput_weight: float = 0.0, reject_penalty_s: float | None = None, reward_scale: float = 1.0,
                 **kwargs):
        self.throughput_weight = check_float(throughput_weight, "env.throughput_weight")
        if reject_penalty_s is not None:
            check_float(reject_penalty_s, "env.reject_penalty_s")
        self.reward_scale = check_float(reward_scale, "env.reward_scale", lo_open=True)
        self._admit = kwargs.get("mode") == "admit"  # SLO admission: colocated clusters too, its own reward
        super().__init__(scenario, **kwargs)
        pol = self.scenario_policies
        self.policy_specs = {"decode": decode if decode is not None else pol.get("decode"),
                             "batching": batching if batching is not None else pol.get("batching")}
        for k, v in self.policy_specs.items():
            make_policy(k, v)  # fail now on a bad spec
        self.reject_penalty_s = (10.0 * self.sim_config.slo.ttft_s if reject_penalty_s is None
                                 else float(reject_penalty_s))

    # -------------------------------------------------------------- PdgymEnv hooks
    def _check_cluster(self, probe):
        if not probe.disaggregated and not self._admit:
            raise ConfigError(f"env.scenario: {self.scenario} is colocated; PrefillDispatch needs "
                              "cluster.topology=disaggregated")

    def _policies(self):
        return {"prefill": self.core, **{k: make_policy(k, v) for k, v in self.policy_specs.items() if v is not None}}

    def _begin(self):
        self._decision_mask = None
        done = self.sim.run()
        self.meter = WaitMeter(self.sim)
        self.slo_meter = AttainmentMeter(self.sim) if self._admit else None
        self._mark = self.meter.total()
        return done

    def _act(self, a):
        self._decision_mask = None  # a new decision follows: its mask is computed once, when first asked
        return False if self.core.apply(self.sim, a) else self.sim.run()  # True: the next decision of the same instant

    def _reward(self):
        if self.slo_meter is not None:  # admit mode: the weighted SLO attainment earned (envs/slo_admit.py)
            return float(self.slo_meter.step() / self.reward_scale)
        w, nf, nr = self.meter.total()
        w0, nf0, nr0 = self._mark
        self._mark = (w, nf, nr)
        reward = -(w - w0) - self.reject_penalty_s * (nr - nr0) + self.throughput_weight * (nf - nf0)
        return float(reward / self.reward_scale)

    def _observe(self):
        return self.core.observe(self.sim)

    def action_masks(self) -> np.ndarray:
        self._require_reset("action_masks")
        if self._done:
            m = np.zeros(self.core.n_actions, dtype=bool)
            m[0] = True
            return m
        if self._decision_mask is None:  # the caller asks before step() and step() asks again: one computation
            self._decision_mask = self.core.mask(self.sim)
        return self._decision_mask.copy()

    def _describe(self, a) -> str:
        return self.core.describe(self.sim, int(a))

    def default_action(self) -> int:
        return self.core.default_action(self.sim, None)

    def _info_extra(self):
        m = self.meter
        w, nf, nr = self._mark
        return {"buffered": len(self.sim.buffer), "first_tokens": nf, "rejected_waiting": nr, "wait_s_total": w,
                "ttft_mean": m.ttft_sum / m.n_first if m.n_first else 0.0}

    def teacher_action(self, teacher: PrefillScheduler) -> int:
        """The action reproducing what prefill baseline `teacher` would do now (see DispatchCore.teacher_action)."""
        if self.sim is None or self._done:
            return 0
        return self.core.teacher_action(self.sim, teacher)


PrefillDispatchEnv.__doc__ = PrefillDispatchEnv.__doc__.format(rule=INVALID_ACTION_RULE, torch=TORCH_THREADS_NOTE,
                                                               max_steps=MAX_EPISODE_STEPS,
                                                               features=table(GLOBAL, ROW, "instance i"))


AgentPolicy = PrefillDispatchEnv.agent_policy  # envs/base.py: the formulation's core answered by predict(obs, mask)


def make_env(**kwargs) -> PrefillDispatchEnv:
    """The raw env (no wrappers, so its attributes are at hand): no TimeLimit, so episodes run until
    they terminate or stall. gym.make(ENV_ID, **kwargs) adds the registered max_episode_steps."""
    return PrefillDispatchEnv(**kwargs)
