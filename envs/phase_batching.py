"""PhaseBatching-v0: the agent is the batching policy of one colocated instance.

Action modes (kwarg `mode`):
- "phase": before every iteration, for each DP unit with a real choice, pick its batch:
  0 prefill (prefill-only batch under the unit's token budget), 1 decode (every running
  request steps), 2 mixed (decode-maximal: all decodes plus prompt pieces filling the budget).
  `action_masks()` marks infeasible phases (nothing to prefill, nothing decoding). Units with a
  single feasible phase take it without asking when `skip_forced` (default).
- "threshold": once per cycle and unit, pick theta from `theta_grid` (Discrete) or from
  [theta_min, theta_max] (`continuous=True`, Box [-1, 1] mapped linearly); with `choose_mode`
  also EB vs MB (Discrete: actions G..2G-1 mean MB; Box: a second component > 0 means MB). EB runs the EB phase machine
  (baselines/exclusive_batching.py) with that theta; a cycle ends when a refill ends (EB) or
  after `mb_cycle_iters` iterations (MB).

Observation (Box [0, 1], float32, size 9 + 11 x max_dp, padded units masked by `present`):
global: decode ratio estimate mu_O / (mu_L + mu_O), log2(mu_O) / 12, log2(mu_L) / 14, hazard
p0 x mu_O / 2, IFR slope eta x mu_O^2 / 10, stats fitted, current theta, current mode (1 = MB),
waiting per slot / 4 over the instance; per unit: present, deciding, running / slots, waiting /
slots / 4, free slots / slots, free KV fraction, prefilling / slots, decoding / slots, last batch
one-hot (prefill, decode, mixed). Output-length statistics come only from completed requests.

Reward: for the interval since the previous decision, (completed requests, or output tokens with
reward="tokens") per second of simulated time, minus `slo_penalty` x (completed requests that
missed the TTFT or TPOT SLO) per second, times `reward_scale`. Decisions taken at the same
instant (several DP units) get 0 and the interval carries over. An episode is one run of the
scenario's workload (terminated at its end; truncated after `max_steps` decisions if set).

`AgentPolicy(predict, **env_kwargs)` replays a trained agent as a BatchingPolicy through
`simulate()`, with the same observation and action code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pdgym.baselines import make_policy
from pdgym.baselines.exclusive_batching import DECODE, EB, MB, REFILL, OutputStats, UnitState
from pdgym.envs.scenario import init_from_env_kwargs, load_scenario, merge_sim_config
from pdgym.envs.sim import Simulator
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import Batch
from pdgym.envs.sim.validation import check_float, check_int

ENV_ID = "pdgym/PhaseBatching-v0"
PREFILL_A, DECODE_A, MIXED_A = 0, 1, 2
N_GLOBAL, N_UNIT = 9, 11
MODES = ("phase", "threshold")
DEFAULT_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8)
ENV_ONLY = ("scenario", "overrides", "config", "prefill", "batching", "reward", "slo_penalty", "reward_scale",
            "max_steps")


class AgentState(UnitState):
    __slots__ = ("iters_left", "last", "mb", "pending", "theta")

    def __init__(self):
        super().__init__()
        self.theta = 0.1
        self.mb = False
        self.iters_left = 0
        self.pending = True  # a decision is due (threshold mode: start of a cycle)
        self.last = -1  # last batch kind (0 prefill, 1 decode, 2 mixed)


class _AgentBatching(EB):
    """The shared observation / action code; `decide(sim, inst, units)` is the agent hook."""

    def __init__(self, mode: str = "phase", theta_grid=DEFAULT_GRID, choose_mode: bool = False,
                 continuous: bool = False, theta_min: float = 0.01, theta_max: float = 0.8,
                 mb_cycle_iters: int = 32, max_dp: int = 8, instance: int = 0, skip_forced: bool = True,
                 fallback="mb"):
        super().__init__(theta=0.1)
        if mode not in MODES:
            raise ConfigError(f"env.mode: got {mode!r}; allowed: {', '.join(MODES)}")
        self.mode = mode
        try:
            grid = tuple(float(t) for t in theta_grid)
        except (TypeError, ValueError):
            grid = ()
        if not grid or not all(0 < t < 1 for t in grid):
            raise ConfigError(f"env.theta_grid: got {theta_grid!r}; must be a non-empty list of values in (0, 1)")
        self.grid = grid
        for name, v in (("choose_mode", choose_mode), ("continuous", continuous), ("skip_forced", skip_forced)):
            if not isinstance(v, bool):
                raise ConfigError(f"env.{name}: got {v!r}; must be true or false")
        self.choose_mode, self.continuous, self.skip_forced = choose_mode, continuous, skip_forced
        self.theta_min = check_float(theta_min, "env.theta_min", 0.0, 1.0, lo_open=True, hi_open=True)
        self.theta_max = check_float(theta_max, "env.theta_max", self.theta_min, 1.0, hi_open=True)
        self.mb_cycle_iters = check_int(mb_cycle_iters, "env.mb_cycle_iters")
        self.max_dp = check_int(max_dp, "env.max_dp")
        self.instance = check_int(instance, "env.instance", 0)
        self.fallback = make_policy("batching", fallback)
        self.mixed = MB()
        self.stats = OutputStats()
        self.obs_size = N_GLOBAL + N_UNIT * self.max_dp
        if mode == "phase":
            self.n_actions = 3
        else:
            self.n_actions = len(grid) * (2 if choose_mode else 1)

    # -------------------------------------------------------------- spaces
    def observation_space(self) -> spaces.Box:
        return spaces.Box(0.0, 1.0, shape=(self.obs_size,), dtype=np.float32)

    def action_space(self) -> spaces.Space:
        if self.mode == "threshold" and self.continuous:
            return spaces.Box(-1.0, 1.0, shape=(2 if self.choose_mode else 1,), dtype=np.float32)
        return spaces.Discrete(self.n_actions)

    # -------------------------------------------------------------- life cycle
    def reset(self, sim):
        super().reset(sim)
        C = sim.colocated[self.instance] if self.instance < len(sim.colocated) else None
        if C is None:
            raise ConfigError(f"env.instance: got {self.instance}; the scenario has {len(sim.colocated)} colocated "
                              "instances")
        if C.dp > self.max_dp:
            raise ConfigError(f"env.max_dp: got {self.max_dp}; instance {self.instance} has dp={C.dp}")
        self.fallback.reset(sim)
        self.mixed.reset(sim)
        self.stats.reset(sim)
        self.queue: list[int] = []  # units awaiting a decision, in order
        self.masks: dict[int, np.ndarray] = {}
        self.plan: dict[int, int | None] | None = None  # phase mode: this iteration's batch kinds

    def new_state(self):
        return AgentState()

    def current_theta(self, st):
        return st.theta

    def on_timer(self, sim, tag):
        self.fallback.on_timer(sim, tag)

    def decide(self, sim, inst: int, units: list[int]) -> bool:
        """Get decisions for `units` (apply each with `apply`); False if they are deferred (pause)."""
        raise NotImplementedError

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

    def mask(self, unit: int) -> np.ndarray:
        if self.mode == "phase":
            return self.masks.get(unit, np.ones(3, dtype=bool))
        return np.ones(self.n_actions, dtype=bool)

    def apply(self, sim, inst: int, unit: int, action) -> None:
        """Record the agent's action for `unit` (phase: this iteration; threshold: this cycle)."""
        if self.mode == "phase":
            a = int(action)
            if not (0 <= a < 3) or not self.masks[unit][a]:
                raise ValueError(f"PhaseBatching: action {a} is masked for unit {unit}")
            self.plan[unit] = a
            return
        st = self.unit_state(inst, unit)
        if self.continuous:
            a = np.asarray(action, dtype=float).reshape(-1)
            st.theta = self.theta_min + 0.5 * (float(np.clip(a[0], -1, 1)) + 1) * (self.theta_max - self.theta_min)
            st.mb = bool(self.choose_mode and a[1] > 0)
        else:
            a = int(action)
            if not (0 <= a < self.n_actions):
                raise ValueError(f"PhaseBatching: action {a} out of range [0, {self.n_actions})")
            st.theta = self.grid[a % len(self.grid)]
            st.mb = a >= len(self.grid)
        st.pending = False
        if st.mb:
            st.iters_left = self.mb_cycle_iters
        else:  # EB from here: finish chunks in flight, then let theta decide the next refill
            st.phase = REFILL if sim.colocated[inst].units[unit].prefilling else DECODE
            st.target = 0

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
        return not self.queue or self.decide(sim, inst, list(self.queue))

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
        was_refill = st.phase == REFILL
        b = EB.next_batch(self, sim, inst, unit)
        if was_refill and st.phase == DECODE:
            st.pending = True  # a refill ended: the next cycle's theta is due
        if b is not None:
            st.last = PREFILL_A if b.prefill else DECODE_A
        return b

    # -------------------------------------------------------------- observation
    def observe(self, sim, inst: int, unit: int) -> np.ndarray:
        C = sim.colocated[inst]
        s = self.stats
        mu_o = s.mu_o or 128.0
        mu_l = s.mu_l or 1024.0
        st = self.unit_state(inst, unit)
        waiting = sum(len(u.waiting) for u in C.units)
        slots = sum(u.slots for u in C.units)
        g = [mu_o / (mu_l + mu_o), math.log2(mu_o) / 12, math.log2(mu_l) / 14,
             (s.p0 or 1.0 / mu_o) * mu_o / 2, s.eta * mu_o * mu_o / 10, float(s.fitted),
             st.theta if self.mode == "threshold" else 0.0, float(st.mb), waiting / slots / 4]
        rows = np.zeros((self.max_dp, N_UNIT))
        for i, u in enumerate(C.units):
            last = self.unit_state(inst, i).last
            sl = u.slots
            rows[i, :8] = (1.0, float(i == unit), u.n_running / sl, len(u.waiting) / sl / 4, u.free_slots / sl,
                           1.0 - u.kv_used / u.kv_cap, len(u.prefilling) / sl, u.n_decoding / sl)
            if last >= 0:
                rows[i, 8 + last] = 1.0
        return np.clip(np.concatenate([np.asarray(g), rows.ravel()]), 0.0, 1.0).astype(np.float32)


class _EnvAdapter(_AgentBatching):
    """Inside the env: defer decisions to env.step by pausing the simulator."""

    def decide(self, sim, inst, units):
        sim.pause()
        return False


class AgentPolicy(_AgentBatching):
    """A trained agent as a BatchingPolicy: predict(obs, mask) -> action for each decision.

    Takes the env's keyword arguments (the scenario-level ones are ignored: the simulator that
    runs this policy has its own), so `AgentPolicy(model_predict, **env_kwargs)` evaluates the
    agent through `simulate()` exactly like a baseline.
    """

    name = "agent"

    def __init__(self, predict: Callable[[np.ndarray, np.ndarray], int], **env_kwargs):
        extra = {"fallback": env_kwargs["batching"]} if "batching" in env_kwargs else {}
        init_from_env_kwargs(super().__init__, env_kwargs, ENV_ONLY, **extra)
        self.predict = predict

    def decide(self, sim, inst, units):
        for i in units:
            self.apply(sim, inst, i, self.predict(self.observe(sim, inst, i), self.mask(i)))
        self.queue = []
        return True


class PhaseBatchingEnv(gym.Env):
    """Gymnasium env: the agent batches one colocated instance (module docstring for the details)."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, scenario: str = "coloc_h200_qwen3_8b", overrides=(), config: dict | None = None,
                 mode: str = "phase", theta_grid=DEFAULT_GRID, choose_mode: bool = False, continuous: bool = False,
                 theta_min: float = 0.01, theta_max: float = 0.8, mb_cycle_iters: int = 32, max_dp: int = 8,
                 instance: int = 0, skip_forced: bool = True, prefill="round_robin", batching="mb",
                 reward: str = "requests", slo_penalty: float = 0.0, reward_scale: float = 1.0,
                 max_steps: int | None = None):
        self.sim_config = merge_sim_config(load_scenario(scenario, list(overrides)).sim, config)
        self.agent = _EnvAdapter(mode=mode, theta_grid=theta_grid, choose_mode=choose_mode, continuous=continuous,
                                 theta_min=theta_min, theta_max=theta_max, mb_cycle_iters=mb_cycle_iters,
                                 max_dp=max_dp, instance=instance, skip_forced=skip_forced, fallback=batching)
        self.prefill_spec = prefill
        make_policy("prefill", prefill)  # fail at construction on a bad spec
        if reward not in ("requests", "tokens"):
            raise ConfigError(f"env.reward: got {reward!r}; allowed: requests, tokens")
        self.reward_kind = reward
        self.slo_penalty = check_float(slo_penalty, "env.slo_penalty")
        self.reward_scale = check_float(reward_scale, "env.reward_scale", lo_open=True)
        self.max_steps = check_int(max_steps, "env.max_steps", allow_none=True)
        self.observation_space = self.agent.observation_space()
        self.action_space = self.agent.action_space()
        self.sim: Simulator | None = None
        self._unit = 0

    # -------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        sim_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.sim = Simulator(self.sim_config, {"prefill": make_policy("prefill", self.prefill_spec),
                                               "batching": self.agent}, seed=sim_seed)
        self._steps = 0
        self._t_mark, self._n_mark, self._tok_mark = 0.0, 0, 0
        self._ttft_sum, self._n_seen, self._viol = 0.0, 0, 0
        self._done = self.sim.run()
        return self._obs(), self._info()

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("PhaseBatching: call reset() before step()")
        if self._done:
            raise RuntimeError("PhaseBatching: the episode has ended; call reset()")
        ag, sim = self.agent, self.sim
        ag.apply(sim, ag.instance, self._unit, action)
        ag.queue.pop(0)
        if not ag.queue:
            self._done = sim.run()
        self._steps += 1
        reward = self._reward()
        truncated = self.max_steps is not None and self._steps >= self.max_steps and not self._done
        return self._obs(), reward, self._done, truncated, self._info()

    def action_masks(self) -> np.ndarray:
        if self._done or self.sim is None or not self.agent.queue:
            return np.ones(self.agent.n_actions if not self.agent.continuous else 1, dtype=bool)
        return self.agent.mask(self.agent.queue[0]).copy()

    # -------------------------------------------------------------- helpers
    def _obs(self) -> np.ndarray:
        ag = self.agent
        self._unit = ag.queue[0] if ag.queue and not self._done else 0
        return ag.observe(self.sim, ag.instance, self._unit)

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
        if new:
            idx = np.asarray(new)
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

    def _info(self) -> dict:
        sim = self.sim
        n = len(sim.completed)
        t = max(sim.now, 1e-12)
        return {"sim_time": sim.now, "completed": n, "rps": n / t, "throughput_tok_s": sim.tokens_out / t,
                "ttft_mean": self._ttft_sum / self._n_mark if self._n_mark else 0.0,
                "slo_violations": self._viol, "decisions": self._steps, "unit": self._unit}


def make_env(**kwargs) -> PhaseBatchingEnv:
    """A PhaseBatching-v0 env with the given keyword arguments (see PhaseBatchingEnv)."""
    return PhaseBatchingEnv(**kwargs)
