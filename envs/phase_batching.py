"""PhaseBatching-v0: the agent is the batching policy of one colocated instance.

`PhaseBatchingEnv` (its docstring documents the env in Gymnasium's sections) and the policy core it
shares with `AgentPolicy` (a trained agent as a BatchingPolicy inside `simulate()`). The threshold
mode drives the EB phase machine of baselines/exclusive_batching.py, held by the core and used through
its read API (baselines/shared.py, PhaseMachine): the core is a BatchingPolicy of its own, not a subclass.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces
from pdgym.baselines import make_policy
from pdgym.baselines.exclusive_batching import DECODE, EB, MB, REFILL, OutputStats
from pdgym.baselines.shared import PhaseMachine
from pdgym.envs.base import INVALID_ACTION_RULE, TORCH_THREADS_NOTE, DecidingCore, PdgymEnv
from pdgym.envs.features import Feature, Layout, LayoutCore, table
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.points import POINTS
from pdgym.envs.sim.policy import Batch, BatchingPolicy, MixedBatching
from pdgym.envs.sim.validation import check_bool, check_choice, check_float, check_int
from pdgym.envs.specs import option_values

ENV_ID = POINTS["batching"].env_id  # pdgym/PhaseBatching-v0
MAX_EPISODE_STEPS = POINTS["batching"].max_episode_steps
PREFILL_A, DECODE_A, MIXED_A = 0, 1, 2
PHASES = ("prefill", "decode", "mixed")
DEFAULT_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8)
DEFAULT_THETA = 0.1  # EB's default threshold: what an invalid threshold action falls back to


class _Obs:
    """What the features of one observation read, computed once (`BatchingCore.observe_unit`)."""

    __slots__ = ("core", "inst", "mu_l", "mu_o", "st", "stats", "unit", "units")


_ONE_HOT = {-1: (0.0, 0.0, 0.0), PREFILL_A: (1.0, 0.0, 0.0), DECODE_A: (0.0, 1.0, 0.0), MIXED_A: (0.0, 0.0, 1.0)}


# The observation, declared once: [GLOBAL | one ROW per DP unit of the instance, max_dp rows]. mu_O, mu_L: output /
# prompt length estimates from completed requests only (EB*'s statistics; before the first fit 128 and 1024).
GLOBAL = (
    Feature("decode_ratio", lambda o: o.mu_o / (o.mu_l + o.mu_o), 0, 1, "decode ratio mu_O / (mu_L + mu_O)"),
    Feature("mu_o", lambda o: math.log2(o.mu_o) / 12, 0, 1, "log2(mu_O) / 12"),
    Feature("mu_l", lambda o: math.log2(o.mu_l) / 14, 0, 1, "log2(mu_L) / 14"),
    Feature("p0", lambda o: (o.stats.p0 or 1.0 / o.mu_o) * o.mu_o / 2, 0, 1, "hazard p0 x mu_O / 2"),
    Feature("eta", lambda o: o.stats.eta * o.mu_o * o.mu_o / 10, 0, 1, "IFR slope eta x mu_O^2 / 10"),
    Feature("fitted", lambda o: float(o.stats.fitted), 0, 1, "statistics fitted"),
    Feature("theta", lambda o: o.st.theta if o.core.mode == "threshold" else 0.0, 0, 1,
            "current theta of the deciding unit (threshold mode)"),
    Feature("mb", lambda o: float(o.st.mb), 0, 1, "current mode of the deciding unit (1 = MB)"),
    Feature("waiting", lambda o: sum(len(u.waiting) for u in o.units) / sum(u.slots for u in o.units) / 4, 0, 1,
            "waiting requests per slot / 4, whole instance"),
)
ROW = (  # per_row: fn(o, i, u), u = unit i (a Python object: one pass over the units, not one per feature)
    Feature("present", lambda o, i, u: 1.0, 0, 1, "unit u present", per_row=True),
    Feature("deciding", lambda o, i, u: float(i == o.unit), 0, 1, "unit u is the one deciding", per_row=True),
    Feature("running", lambda o, i, u: u.n_running / u.slots, 0, 1, "running / slots", per_row=True),
    Feature("waiting", lambda o, i, u: len(u.waiting) / u.slots / 4, 0, 1, "waiting / slots / 4", per_row=True),
    Feature("free_slots", lambda o, i, u: u.free_slots() / u.slots, 0, 1, "free slots / slots", per_row=True),
    Feature("free_kv", lambda o, i, u: 1.0 - u.kv_used / u.kv_cap, 0, 1, "free KV fraction", per_row=True),
    Feature("prefilling", lambda o, i, u: len(u.prefilling) / u.slots, 0, 1, "prefilling / slots", per_row=True),
    Feature("decoding", lambda o, i, u: u.n_decoding / u.slots, 0, 1, "decoding / slots", per_row=True),
    Feature("last", lambda o, i, u: _ONE_HOT[o.core.unit_state(o.inst, i).last], 0, 1,
            "last batch one-hot (prefill, decode, mixed)", width="3", per_row=True),
)


class AgentState:
    """The agent's side of one DP unit (EB's own phase state stays in the phase machine)."""

    __slots__ = ("iters_left", "last", "mb", "pending", "theta")

    def __init__(self):
        self.theta = DEFAULT_THETA  # what the agent set (the phase machine runs it: EB.set_theta)
        self.mb = False
        self.iters_left = 0
        self.pending = True  # a decision is due (threshold mode: start of a cycle)
        self.last = -1  # last batch kind (0 prefill, 1 decode, 2 mixed)


class BatchingCore(LayoutCore, DecidingCore, BatchingPolicy):
    """The policy core of every PhaseBatching formulation (envs/base.py's PolicyCore): the observation / action
    code shared by the env and its AgentPolicy. At an iteration of instance `instance` the units that need a
    decision are queued (`queue`); each decision is about the first queued unit (the `*_unit` methods take any)."""

    def __init__(self, mode: str = "phase", theta_grid=DEFAULT_GRID, choose_mode: bool = False,
                 continuous: bool = False, theta_min: float = 0.01, theta_max: float = 0.8,
                 mb_cycle_iters: int = 32, max_dp: int = 8, instance: int = 0, skip_forced: bool = True,
                 fallback="mb"):
        self.eb: PhaseMachine = EB(theta=DEFAULT_THETA)
        check_choice(mode, "env.mode", option_values("batching", "mode", "phase"))  # the formulations (envs/specs.py)
        self.mode = mode
        try:
            grid = tuple(float(t) for t in theta_grid)
        except (TypeError, ValueError):
            grid = ()
        if not grid or not all(0 < t < 1 for t in grid):
            raise ConfigError(f"env.theta_grid: got {theta_grid!r}; must be a non-empty list of values in (0, 1)")
        self.grid = grid
        for name, v in (("choose_mode", choose_mode), ("continuous", continuous), ("skip_forced", skip_forced)):
            check_bool(v, f"env.{name}")
        self.choose_mode, self.continuous, self.skip_forced = choose_mode, continuous, skip_forced
        self.theta_min = check_float(theta_min, "env.theta_min", 0.0, 1.0, lo_open=True, hi_open=True)
        self.theta_max = check_float(theta_max, "env.theta_max", self.theta_min, 1.0, hi_open=True)
        self.mb_cycle_iters = check_int(mb_cycle_iters, "env.mb_cycle_iters")
        self.max_dp = check_int(max_dp, "env.max_dp")
        self.instance = check_int(instance, "env.instance", 0)
        self.fallback = make_policy("batching", fallback)
        self.mixed = MB()
        self.stats = OutputStats()
        self.layout = Layout(GLOBAL, ROW, self, {}, self.max_dp)
        self.obs_size = self.layout.size
        if mode == "phase":
            self.n_actions = 3
        else:
            self.n_actions = len(grid) * (2 if choose_mode else 1)
        self._all_allowed = np.ones(self.n_actions, dtype=bool)

    # -------------------------------------------------------------- spaces
    def spaces(self) -> tuple[spaces.Box, spaces.Space]:
        obs = self.layout.box()
        if self.mode == "threshold" and self.continuous:
            return obs, spaces.Box(-1.0, 1.0, shape=(2 if self.choose_mode else 1,), dtype=np.float32)
        return obs, spaces.Discrete(self.n_actions)


    def action_meanings(self) -> list[str]:
        if self.mode == "phase":
            return [f"{p} batch" for p in PHASES]
        if self.continuous:
            return [f"theta: -1..1 maps to {self.theta_min}..{self.theta_max}",
                    "mode: > 0 runs MB for the cycle, else EB"][: 2 if self.choose_mode else 1]
        return [f"{'MB' if a >= len(self.grid) else 'EB'} theta={self.grid[a % len(self.grid)]}"
                for a in range(self.n_actions)]

    def describe_unit(self, inst: int, unit: int, action) -> str:
        """The valid action for `unit` in words (pdgym-enjoy's decision lines)."""
        who = f"colocated {inst} unit {unit}"
        if self.mode == "phase":
            return f"{who}: run a {PHASES[int(action)]} batch"
        if self.continuous:
            a = np.asarray(action, dtype=float).reshape(-1)
            theta = self.theta_min + 0.5 * (float(a[0]) + 1) * (self.theta_max - self.theta_min)
            mb = bool(self.choose_mode and a[1] > 0)
        else:
            theta, mb = self.grid[int(action) % len(self.grid)], int(action) >= len(self.grid)
        return f"{who}: {'MB for the cycle' if mb else 'EB'}, theta = {theta:.3g}"

    def unit_default(self, unit: int):
        """Phase: mixed, else decode, else prefill (the first the mask allows). Threshold: EB with
        the grid's theta closest to EB's default (continuous: that theta, EB)."""
        if self.mode == "phase":
            m = self.unit_mask(unit)
            return next(a for a in (MIXED_A, DECODE_A, PREFILL_A) if m[a])
        if self.continuous:
            x = 2 * (DEFAULT_THETA - self.theta_min) / (self.theta_max - self.theta_min) - 1
            return np.array([np.clip(x, -1, 1), -1.0][: 2 if self.choose_mode else 1], dtype=np.float32)
        return int(np.argmin([abs(t - DEFAULT_THETA) for t in self.grid]))

    def bind(self, sim) -> None:
        self.check_instance(sim)

    def check_instance(self, sim) -> None:
        C = sim.colocated[self.instance] if self.instance < len(sim.colocated) else None
        if C is None:
            raise ConfigError(f"env.instance: got {self.instance}; the scenario has {len(sim.colocated)} colocated "
                              "instances")
        if C.dp > self.max_dp:
            raise ConfigError(f"env.max_dp: got {self.max_dp}; instance {self.instance} has dp={C.dp}")

    # -------------------------------------------------------------- life cycle
    def reset(self, sim):
        self.eb.reset(sim)
        self._agent: dict[tuple[int, int], AgentState] = {}
        self.check_instance(sim)
        self.fallback.reset(sim)
        self.mixed.reset(sim)
        self.stats.reset(sim)
        self.queue: list[int] = []  # units awaiting a decision, in order
        self.masks: dict[int, np.ndarray] = {}
        self.plan: dict[int, int | None] | None = None  # phase mode: this iteration's batch kinds

    def unit_state(self, inst: int, unit: int) -> AgentState:
        st = self._agent.get((inst, unit))
        if st is None:
            st = self._agent[(inst, unit)] = AgentState()
        return st

    def on_timer(self, sim, tag):
        self.fallback.on_timer(sim, tag)

    # -------------------------------------------------------------- the decision about the first queued unit
    def _head(self) -> int:
        return self.queue[0] if self.queue else 0

    def mask(self, sim) -> np.ndarray:
        return self.unit_mask(self._head())

    def observe(self, sim, mask=None) -> np.ndarray:
        return self.observe_unit(sim, self.instance, self._head())

    def default_action(self, sim=None, mask=None):
        return self.unit_default(self._head())

    def describe(self, sim, action) -> str:
        return self.describe_unit(self.instance, self._head(), action)

    def apply(self, sim, action) -> bool:
        """Carry out the valid action for the first queued unit; True while other units await a decision."""
        self.apply_unit(sim, self.instance, self.queue[0], action)
        self.queue.pop(0)
        return bool(self.queue)

    # -------------------------------------------------------------- masks and batches
    def phase_mask(self, sim, inst, unit) -> np.ndarray:
        u = sim.colocated[inst].units[unit]
        m = np.zeros(3, dtype=bool)
        m[PREFILL_A] = bool(sim.fill_prefill(inst, unit, u.chunk_tokens))
        if u.n_decoding:
            m[DECODE_A] = True
            m[MIXED_A] = u.chunk_tokens > u.n_decoding and bool(
                sim.fill_prefill(inst, unit, u.chunk_tokens - u.n_decoding))
        return m

    def unit_mask(self, unit: int) -> np.ndarray:
        """The unit's allowed actions (read-only: copy before changing it)."""
        m = self.masks.get(unit) if self.mode == "phase" else None
        return m if m is not None else self._all_allowed

    def apply_unit(self, sim, inst: int, unit: int, action) -> None:
        """Record the valid action (resolve_action first) for `unit` (phase: this iteration; threshold: this cycle)."""
        if self.mode == "phase":
            self.plan[unit] = int(action)
            return
        st = self.unit_state(inst, unit)
        if self.continuous:
            a = np.asarray(action, dtype=float).reshape(-1)
            st.theta = self.theta_min + 0.5 * (float(a[0]) + 1) * (self.theta_max - self.theta_min)
            st.mb = bool(self.choose_mode and a[1] > 0)
        else:
            a = int(action)
            st.theta = self.grid[a % len(self.grid)]
            st.mb = a >= len(self.grid)
        st.pending = False
        self.eb.set_theta(inst, unit, st.theta)
        if st.mb:
            st.iters_left = self.mb_cycle_iters
        else:  # EB from here: finish chunks in flight, then let theta decide the next refill
            self.eb.resume(inst, unit, refill=bool(sim.colocated[inst].units[unit].prefilling))

    def next_batch(self, sim, inst, unit):
        if inst != self.instance:
            return self.fallback.next_batch(sim, inst, unit)
        C = sim.colocated[inst]
        if unit == 0:
            self.stats.ingest(sim)
            if not self._prepare(sim, inst, C):
                return None  # paused for the agent; the sim replays this iteration
        return self.phase_batch(sim, inst, unit) if self.mode == "phase" else self.threshold_batch(sim, inst, unit)

    def _prepare(self, sim, inst, C) -> bool:
        """At the start of an iteration: collect the units that need a decision and ask for them."""
        if self.mode == "phase":
            if self.plan is None:
                self.plan, self.masks, need = {}, {}, []
                for i in range(C.dp):
                    m = self.phase_mask(sim, inst, i)
                    self.masks[i] = m
                    k = int(m.sum())
                    if k == 0 or (k == 1 and self.skip_forced):
                        self.plan[i] = int(np.argmax(m)) if k else None
                    else:
                        need.append(i)
                self.queue = need
        else:
            self.queue = [i for i in range(C.dp) if self.unit_state(inst, i).pending]
        return not self.queue or self.decider.decide(self, sim)  # False: deferred (the env's pause)

    def phase_batch(self, sim, inst, unit) -> Batch | None:
        a = self.plan.get(unit)
        if unit == sim.colocated[inst].dp - 1:
            self.plan = None
        st = self.unit_state(inst, unit)
        st.last = -1 if a is None else a
        u = sim.colocated[inst].units[unit]
        if a == PREFILL_A:
            return Batch(prefill=sim.fill_prefill(inst, unit, u.chunk_tokens))
        if a == DECODE_A:
            return Batch(decode=True)
        if a == MIXED_A:
            return self.mixed.next_batch(sim, inst, unit)
        return None

    def threshold_batch(self, sim, inst, unit) -> Batch | None:
        st = self.unit_state(inst, unit)
        if st.mb:
            b = self.mixed.next_batch(sim, inst, unit)
            if b is not None:
                st.iters_left -= 1
                st.pending = st.iters_left <= 0
                st.last = MIXED_A if b.prefill and b.decode else (PREFILL_A if b.prefill else DECODE_A)
            return b
        machine = self.eb.unit_state(inst, unit)
        was_refill = machine.phase == REFILL
        b = self.eb.next_batch(sim, inst, unit)
        if was_refill and machine.phase == DECODE:
            st.pending = True  # a refill ended: the next cycle's theta is due
        if b is not None:
            st.last = PREFILL_A if b.prefill else DECODE_A
        return b

    # -------------------------------------------------------------- observation
    def observe_unit(self, sim, inst: int, unit: int) -> np.ndarray:
        o = _Obs()
        o.core, o.inst, o.unit, o.units, o.stats = self, inst, unit, sim.colocated[inst].units, self.stats
        o.mu_o = self.stats.mu_o or 128.0
        o.mu_l = self.stats.mu_l or 1024.0
        o.st = self.unit_state(inst, unit)
        return self.layout.build(o, len(o.units), o.units)


class PhaseBatchingEnv(PdgymEnv):
    """## Description

    The agent is the batching policy of one colocated instance (prefill and decode share its DP units;
    ALGORITHMS.md s5, exclusive vs mixed batching): before an iteration it picks what each unit runs
    (phase mode), or once per cycle it sets the threshold of the EB phase machine (threshold mode).
    Other colocated instances run the `batching` baseline; arrivals are spread by the `prefill` baseline.

    One env per scenario: `gym.make("pdgym/PhaseBatching-v0", scenario="coloc_h100_qwen3_8b")`; the
    colocated scenarios of `pdgym.envs.scenario.scenario_names()` apply (coloc_<hardware>_<model> for
    a100_80g, ascend_910b / 910c, b300, h100, h200, h800, l40s, rtx_pro_6000 with qwen3_8b or
    qwen3_30b_a3b, the rtx_pro_6000 shift_conc / shift_dist variants, pd_ratio_coloc2 / coloc4).

    ## Action Space

    `mode="phase"` (default): `Discrete(3)`, for each DP unit with a real choice: 0 prefill (a
    prefill-only batch under the unit's token budget), 1 decode (every running request steps), 2 mixed
    (decode-maximal: all decodes plus prompt pieces filling the budget). `action_masks()` marks the
    infeasible phases (nothing to prefill, nothing decoding); with `skip_forced` (default) units with a
    single feasible phase take it without asking.
    `mode="threshold"`: once per cycle and unit, theta from `theta_grid`: `Discrete(G)`, or with
    `choose_mode` `Discrete(2 G)` (actions G..2G-1 run MB for the cycle); `continuous=True`:
    `Box(-1, 1, (1,))` mapped linearly onto [theta_min, theta_max] (`choose_mode`: `(2,)`, a second
    component > 0 means MB). EB cycles end when a refill ends, MB cycles after `mb_cycle_iters`
    iterations. `get_action_meanings()` names each action (or Box component).

    Invalid actions: {rule} Here the default action is mixed, else decode, else prefill (phase), and EB
    with the grid's theta closest to 0.1 (threshold).

    ## Observation Space

    `Box(0, 1, (G + R max_dp,), float32)`, [global (G = 9 entries) | one row of R = 11 entries per unit of the
    instance], padding rows zero; `obs_layout` describes it. mu_O, mu_L: output / prompt length estimates from
    completed requests only (EB*'s statistics; before the first fit 128 and 1024). The table is generated from the
    declaration (GLOBAL, ROW; envs/features.py).

    {features}

    ## Rewards

    For the interval since the previous decision, (completed requests, or output tokens with
    `reward="tokens"`) per second of simulated time, minus `slo_penalty` x (completed requests that
    missed the TTFT or TPOT SLO) per second, times `reward_scale`. Decisions taken at the same instant
    (several DP units) get 0 and the interval carries over.

    ## Starting State

    An empty instance at t = 0 (closed-loop scenarios release `workload.concurrency` requests at once);
    `reset` runs the simulator to the first decision. On a trace workload the episode replays a window
    of the trace drawn from `trace_split` (see `TraceWindow`); the seed draws it and the simulator's
    random streams.

    ## Episode End

    Terminated when every request of the episode's workload is resolved. Truncated after
    `max_episode_steps` decisions (registered default {max_steps}; gym.make's TimeLimit) or when
    decisions let no request progress for `stall_s` simulated seconds (info["stalled"]). info carries
    running metrics (completed, rps, throughput_tok_s, ttft_mean, slo_violations, unit, decisions,
    invalid_actions) and, when the env ends the
    episode (terminated or stalled), the run's `summary` (DESIGN section 5 keys;
    `env.unwrapped.summary()` after TimeLimit's truncation).

    ## Arguments

    Episode: `scenario` ("coloc_h200_qwen3_8b"), `overrides` (Hydra-style, e.g.
    ["workload.num_requests=600"]), `config` (nested dict merged over it), `trace_split` ("train" |
    "val" | "test" | None), `stall_s` (60.0), `render_mode` (None | "ansi" | "rgb_array"); reward:
    `reward` ("requests" | "tokens"), `slo_penalty` (0.0), `reward_scale` (1.0); other policies:
    `prefill` ("round_robin"), `batching` ("mb": the other instances); observation and actions (the
    policy core's, also taken by AgentPolicy): `mode` ("phase"), `theta_grid` ({grid}), `choose_mode`
    (False), `continuous` (False), `theta_min` (0.01), `theta_max` (0.8), `mb_cycle_iters` (32),
    `max_dp` (8), `instance` (0), `skip_forced` (True).

    {torch}

    `AgentPolicy(predict, **env_kwargs)` replays a trained agent as a BatchingPolicy through
    `simulate()` with the same observation and action code.

    ## Version History

    - v0: first version (base contract: one invalid-action rule, stall detection, seeded trace
      windows, render modes; the threshold mode composes EB instead of subclassing it).
    """

    ENV_ID = ENV_ID
    POINT = "batching"
    DEFAULT_SCENARIO = "coloc_h200_qwen3_8b"
    NO_DECISION_HINT = ("; with skip_forced=True (the default) a unit with one feasible phase is not asked, which on a "
                        "batch limit of 1 is every unit: pass skip_forced=False")

    def __init__(self, scenario: str = "coloc_h200_qwen3_8b", *, prefill="round_robin", batching="mb",
                 reward: str = "requests", slo_penalty: float = 0.0, reward_scale: float = 1.0, **kwargs):
        self.prefill_spec = prefill
        make_policy("prefill", prefill)  # fail at construction on a bad spec
        check_choice(reward, "env.reward", ("requests", "tokens"))
        self.reward_kind = reward
        self.slo_penalty = check_float(slo_penalty, "env.slo_penalty")
        self.reward_scale = check_float(reward_scale, "env.reward_scale", lo_open=True)
        self._fallback = batching
        self._unit = 0
        super().__init__(scenario, **kwargs)

    # -------------------------------------------------------------- PdgymEnv hooks
    def _check_cluster(self, probe):
        if not probe.colocated:
            raise ConfigError(f"env.scenario: {self.scenario} is disaggregated; PhaseBatching needs "
                              "cluster.topology=colocated")

    @classmethod
    def _core_options(cls, options):
        """The env's `batching` (the other instances' policy) is the core's `fallback`."""
        return {**options, "fallback": options["batching"]} if "batching" in options else options

    def _make_core(self, options):
        return self.build_core({**options, "batching": self._fallback})

    def _policies(self):
        return {"prefill": make_policy("prefill", self.prefill_spec), "batching": self.core}

    def _begin(self):
        self._t_mark, self._n_mark, self._tok_mark = 0.0, 0, 0
        self._ttft_sum, self._viol = 0.0, 0
        return self.sim.run()

    def _act(self, a):
        core = self.core
        return False if core.apply(self.sim, a) else self.sim.run()

    def _reward(self) -> float:
        sim = self.sim
        dt = sim.now - self._t_mark
        if dt <= 0:
            return 0.0
        done = sim.completed
        new = done[self._n_mark:]
        req = sim.req
        slo = sim.cfg.slo
        viol = 0
        if len(new):  # new: an id array (sim.completed's slice)
            idx = new
            ttft = req.first_token[idx] - req.arrival[idx]
            out = req.output[idx]
            tpot = np.where(out > 1, (req.finish[idx] - req.first_token[idx]) / np.maximum(out - 1, 1), 0.0)
            viol = int(((ttft > slo.ttft_s) | (tpot > slo.tpot_s)).sum())
            self._ttft_sum += float(ttft.sum())
            self._viol += viol
        gained = len(new) if self.reward_kind == "requests" else sim.tokens_out - self._tok_mark
        r = (gained - self.slo_penalty * viol) / dt * self.reward_scale
        self._t_mark, self._n_mark, self._tok_mark = sim.now, len(done), sim.tokens_out
        return float(r)

    def _observe(self):
        core = self.core
        self._unit = core.queue[0] if core.queue and not self._done else 0
        return core.observe_unit(self.sim, core.instance, self._unit)

    def action_masks(self) -> np.ndarray:
        self._require_reset("action_masks")
        core = self.core
        if self._done or not core.queue:
            return np.ones(core.n_actions if not core.continuous else 1, dtype=bool)
        return core.unit_mask(core.queue[0]).copy()

    def _describe(self, a) -> str:
        return self.core.describe_unit(self.core.instance, self._unit, a)

    def default_action(self):
        return self.core.unit_default(self._unit)

    def teacher_action(self, teacher) -> int:
        """For behaviour cloning (threshold mode, discrete actions): the action that runs `teacher` for the next
        cycle. EB with a fixed theta: EB at the grid's theta closest to it; MB (choose_mode): MB for the cycle.
        EB* and EB+ set theta from what they observe of the run, which a teacher outside the run does not see."""
        core = self.core
        if core.mode != "threshold" or core.continuous:
            raise ConfigError("teacher: PhaseBatching replays a baseline only with env option mode=threshold and "
                              "discrete actions (continuous=false); run a batching baseline with pdgym-sim")

        def nearest(theta: float) -> int:
            return int(np.argmin([abs(t - theta) for t in core.grid]))

        if isinstance(teacher, MixedBatching):
            if not core.choose_mode:
                raise ConfigError("teacher: MB as a teacher needs env option choose_mode=true")
            return len(core.grid) + nearest(DEFAULT_THETA)
        if type(teacher) is not EB:
            raise ConfigError(f"teacher: got {teacher.name!r}; PhaseBatching replays eb (a fixed theta) or mb")
        return nearest(teacher.theta)

    def _info_extra(self):
        sim = self.sim
        t = max(sim.now, 1e-12)
        n = len(sim.completed)
        return {"completed": n, "rps": n / t, "throughput_tok_s": sim.tokens_out / t,
                "ttft_mean": self._ttft_sum / self._n_mark if self._n_mark else 0.0,
                "slo_violations": self._viol, "unit": self._unit}


PhaseBatchingEnv.__doc__ = PhaseBatchingEnv.__doc__.format(rule=INVALID_ACTION_RULE, torch=TORCH_THREADS_NOTE,
                                                           max_steps=MAX_EPISODE_STEPS, grid=list(DEFAULT_GRID),
                                                           features=table(GLOBAL, ROW, "unit u"))


AgentPolicy = PhaseBatchingEnv.agent_policy  # envs/base.py: the formulation's core answered by predict(obs, mask)


def make_env(**kwargs) -> PhaseBatchingEnv:
    """The raw env (no wrappers, so its attributes are at hand): no TimeLimit, so episodes run until
    they terminate or stall. gym.make(ENV_ID, **kwargs) adds the registered max_episode_steps."""
    return PhaseBatchingEnv(**kwargs)
