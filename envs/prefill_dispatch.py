"""PrefillDispatch-v0: the agent is the global prefill scheduler of a P/D cluster; decode runs a baseline.

Decision epochs: a request arrives (or bounces back), an instance reports EndForward, the
instance set changes, and a tick every `tick_s` seconds while requests are buffered. Epochs
with an empty buffer are skipped (there is nothing to decide).

Action modes (kwarg `mode`):
- "timing": Discrete(1 + N). 0 holds; 1 + i releases the whole buffer to instance i, where
  PBAA allocates it over the DP units (pending first, wait counters, flow control after
  `n_limit` cycles: `overload` = reject | throttle). One decision per epoch.
- "allocation": Discrete(2 + N x D). The buffered requests are offered one at a time, oldest
  first (the candidate); 0 holds (ends the epoch), 1 + i * D + d places the candidate on DP
  unit d of instance i, and the last action skips it (it stays buffered; the next one is
  offered). The epoch goes on at the same instant until the agent holds or every buffered
  request has been placed or skipped.
Masks (`action_masks()`): hold is always allowed; an instance (timing) or a unit (allocation)
is allowed when health checks call it healthy and, with `mask_full` (default), it has
capacity: C_avail > 0 on some unit (timing) or on that unit (allocation); skip is allowed
while another candidate follows. An action the mask forbids is taken as hold.

Observation (Box [-5, 5], float32): `obs_layout` = [global | one row per instance].
Global (12): log1p(buffered) / log1p(256), buffered tokens / (D chunk), oldest age / SLO
TTFT, arrival token rate / cluster token capacity (N D chunk / T_full), T_fwd / T_full,
time since the last release / T_full, (T_fwd + L_net) / N_active / T_full, share of the
buffer left over from earlier cycles, share of instances healthy, candidate prompt /
chunk, candidate age / SLO TTFT, candidate wait cycles / (n_limit + 1) (the candidate is
the oldest buffered request in timing mode); then `obs_requests` x (present, prompt /
chunk, age / SLO TTFT) for the oldest buffered requests; with `cache_aware`, the
candidate's prefix-cache hit tokens / chunk per (instance, unit).
Per instance (6 + D): present, healthy, busy (no EndForward since our last dispatch and a
quiescence poll finds work), expected time to free / T_full, reported device-queue tokens
/ (D chunk), last forward time / T_full, then C_avail / chunk per DP unit. T_full is the
cost model's time of a full-chunk pass (the offline profile); everything the agent sees is
what a real scheduler knows (`pdgym.baselines.pbaa.CapacityModel`).

Reward: for the interval between two decisions, minus the waiting time accrued by every
request still waiting for its first token (request-seconds), so an episode's return is
minus the sum of all TTFTs; a rejected request waits until its rejection and costs
`reject_penalty_s` more (default 10 x SLO TTFT); plus `throughput_weight` x first tokens
produced in the interval; all divided by `reward_scale`. Decisions at the same instant get 0.
An episode is one run of the scenario's workload (terminated at its end, truncated after
`max_steps` decisions). `info` carries the running metrics, and `summary` at the end.

`AgentPolicy(predict, **env_kwargs)` replays a trained agent as a PrefillScheduler through
`simulate()`, with the same observation and action code; `teacher_action(policy)` maps
what a baseline prefill scheduler would do now onto this env's action (behaviour cloning).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pdgym.baselines import make_policy
from pdgym.baselines.pbaa import PBAA, CapacityModel, prefix_hits
from pdgym.envs.scenario import init_from_env_kwargs, load_scenario, merge_sim_config
from pdgym.envs.sim import SimResult, Simulator
from pdgym.envs.sim import requests as R
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy import PrefillScheduler
from pdgym.envs.sim.validation import check, check_bool

ENV_ID = "pdgym/PrefillDispatch-v0"
MODES = ("timing", "allocation")
N_GLOBAL, N_INST = 12, 6
CLIP = 5.0
ENV_ONLY = ("scenario", "overrides", "config", "prefill", "decode", "batching", "throughput_weight",
            "reject_penalty_s", "reward_scale", "max_steps")


class _Recorder:
    """The simulator as a shadow teacher sees it: reads pass through, actions are recorded, not done."""

    def __init__(self, sim, intents: dict):
        self._sim = sim
        self._intents = intents

    def __getattr__(self, name):
        return getattr(self._sim, name)

    def dispatch(self, rid: int, inst: int, dp: int | None = None) -> None:
        self._intents[rid] = (inst, dp)

    def reject(self, rid: int, reason: str) -> None:
        """The env applies its own flow control."""

    def set_timer(self, t: float, owner: str, tag=None) -> None:
        self._sim.set_timer(t, "prefill", ("teacher", tag))

    def pause(self) -> None:
        """A teacher never pauses the run."""


class _Core(PrefillScheduler):
    """Observation, mask, action and decision-epoch code shared by the env and AgentPolicy."""

    name = "agent"

    def __init__(self, mode: str = "timing", tick_s: float = 0.02, obs_requests: int = 16, window: int = 32,
                 n_limit: int = 3, overload: str = "reject", cache_aware: bool = False, mask_full: bool = True):
        check(mode in MODES, "env.mode", f"got {mode!r}; allowed: {', '.join(MODES)}")
        check(isinstance(tick_s, (int, float)) and tick_s > 0, "env.tick_s", f"got {tick_s!r}; must be > 0 (seconds)")
        check(isinstance(obs_requests, int) and obs_requests >= 1, "env.obs_requests",
               f"got {obs_requests!r}; must be an integer >= 1")
        for key, v in (("cache_aware", cache_aware), ("mask_full", mask_full)):
            check_bool(v, f"env.{key}")
        self.mode = mode
        self.tick_s = float(tick_s)
        self.K = obs_requests
        self.cache_aware = cache_aware
        self.mask_full = mask_full
        self.cap = CapacityModel(window, None)
        self.pbaa = PBAA(n_limit, overload, cache_aware=cache_aware)
        self.n = self.D = 0

    # -------------------------------------------------------------- sizes
    def set_dims(self, n: int, dp: int) -> None:
        self.n, self.D = n, dp
        self.global_dim = N_GLOBAL + 3 * self.K + (n * dp if self.cache_aware else 0)
        self.slot_dim = N_INST + dp
        self.obs_size = self.global_dim + n * self.slot_dim
        self.n_actions = 1 + (n if self.mode == "timing" else n * dp + 1)
        self.skip = self.n_actions - 1 if self.mode == "allocation" else None

    @property
    def obs_layout(self) -> dict:
        return {"n_slots": self.n, "per_slot_dim": self.slot_dim, "global_dim": self.global_dim,
                "slots_first": False, "mask_index": 0}

    # -------------------------------------------------------------- life cycle and epochs
    def reset(self, sim) -> None:
        self.cap.reset(sim)
        if (self.n, self.D) != (self.cap.n, self.cap.dp):
            self.set_dims(self.cap.n, self.cap.dp)
        self.pbaa.reset()
        self.last_release = 0.0
        self._tick_at = math.inf
        self._arrivals: deque = deque(maxlen=64)  # (time, prompt tokens) of fresh arrivals
        self._lnet = sim.cfg.cluster.net_latency_s
        self._slo = sim.cfg.slo.ttft_s
        chunk = float(self.cap.chunk[0, 0])
        self._chunk = chunk
        self._cap_tok_s = self.n * self.D * chunk / self.cap.t_full
        self._healthy = sim.prefill_healthy[: self.n].copy()
        self._skipped = set()
        self.teacher = None
        self.intents: dict[int, tuple[int, int | None]] = {}
        self._proxy = None

    def decide(self, sim) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _epoch(self, sim) -> None:
        if sim.buffer:
            self._begin(sim)
        if sim.buffer and self._tick_at == math.inf:
            self._tick_at = t = sim.now + self.tick_s
            sim.set_timer(t, "prefill", ("tick", t))

    def on_arrival(self, sim, rid: int) -> None:
        req = sim.req
        if req.buf_t[rid] == req.arrival[rid]:  # fresh, not bounced or preempted
            self._arrivals.append((sim.now, int(req.prompt[rid])))
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
        self.decide(sim)

    def candidate(self, sim) -> int | None:
        """The request the next allocation action is about: the oldest buffered one not skipped."""
        skipped = self._skipped
        return next((r for r in sim.buffer if r not in skipped), None)

    # -------------------------------------------------------------- what the agent sees
    def _refresh(self, sim) -> None:
        """Quiescence poll of the instances the scheduler believes busy (as SBS does before releasing)."""
        cap = self.cap
        for i in np.flatnonzero(~cap.acked).tolist():
            cap.poll(sim, i)

    def observe(self, sim) -> np.ndarray:
        self._refresh(sim)
        cap, req, now = self.cap, sim.req, sim.now
        chunk, slo, tf = self._chunk, self._slo, cap.t_full
        g = np.zeros(self.global_dim, dtype=np.float64)
        buf = sim.buffer
        nb = len(buf)
        healthy = sim.prefill_healthy[: self.n]
        n_act = int(healthy.sum())
        if nb:
            ids = np.fromiter(buf, dtype=np.int64, count=nb)
            work = req.work[ids]
            age = now - req.arrival[ids]
            head = int(ids[0]) if self.mode == "timing" else self.candidate(sim)
            if head is None:
                head = int(ids[0])
            j = 0 if head == ids[0] else int(np.flatnonzero(ids == head)[0])
            g[0] = math.log1p(nb) / math.log1p(256)
            g[1] = work.sum() / (self.D * chunk)
            g[2] = age[0] / slo
            wait = self.pbaa.wait
            g[7] = sum(1 for r in wait if r in buf) / nb
            g[9] = work[j] / chunk
            g[10] = age[j] / slo
            g[11] = wait.get(head, 0) / (self.pbaa.n_limit + 1)
            k = min(nb, self.K)
            blk = g[N_GLOBAL:N_GLOBAL + 3 * self.K].reshape(self.K, 3)
            blk[:k, 0] = 1.0
            blk[:k, 1] = work[:k] / chunk
            blk[:k, 2] = age[:k] / slo
            if self.cache_aware:
                hits = np.concatenate([prefix_hits(sim, i, [head])[0] for i in range(self.n)])
                g[N_GLOBAL + 3 * self.K:] = hits / chunk
        arr = self._arrivals
        if len(arr) >= 2 and now > arr[0][0]:
            g[3] = sum(t for _, t in arr) / (now - arr[0][0]) / self._cap_tok_s
        g[4] = cap.t_fwd / tf
        g[5] = (now - self.last_release) / tf
        g[6] = (cap.t_fwd + self._lnet) / max(n_act, 1) / tf
        g[8] = n_act / self.n
        s = np.zeros((self.n, self.slot_dim), dtype=np.float64)
        s[:, 0] = 1.0
        s[:, 1] = healthy
        s[:, 2] = ~cap.acked
        s[:, 3] = [cap.expected_free(i, now) / tf for i in range(self.n)]
        s[:, 4] = cap.r_queued.sum(axis=1) / (self.D * chunk)
        s[:, 5] = np.nan_to_num(cap.last_fwd / tf)
        s[:, N_INST:] = np.maximum(cap.chunk - cap.u_flight - cap.r_queued, -CLIP * chunk) / chunk
        return np.clip(np.concatenate([g, s.ravel()]), -CLIP, CLIP).astype(np.float32)

    def mask(self, sim) -> np.ndarray:
        self._refresh(sim)
        cap = self.cap
        healthy = sim.prefill_healthy[: self.n]
        m = np.zeros(self.n_actions, dtype=bool)
        m[0] = True
        if not sim.buffer:
            return m
        room = (cap.chunk - cap.u_flight - cap.r_queued) > 0 if self.mask_full else np.ones((self.n, self.D), bool)
        if self.mode == "timing":
            m[1:] = healthy & room.any(axis=1)
        elif self.candidate(sim) is not None:
            m[1:-1] = (room & healthy[:, None]).ravel()
            m[-1] = len(sim.buffer) - len(self._skipped) > 1
        return m

    # -------------------------------------------------------------- actions
    def apply(self, sim, action: int) -> bool:
        """Carry out `action` (a forbidden one holds); True if the epoch goes on (allocation mode)."""
        a = int(action)
        go_on = False
        if 0 < a < self.n_actions and sim.buffer and self.mask(sim)[a]:
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
        return go_on

    def teacher_action(self, sim, teacher: PrefillScheduler) -> int:
        """This env's action for what `teacher` (a prefill baseline, run in the shadow) would do now.

        The teacher sees every event through a recorder that notes its dispatches instead of
        doing them; a noted dispatch stays pending until the env carries it out. Timing:
        release to the instance of the oldest pending dispatch the mask allows, else hold.
        Allocation: place the candidate where the teacher sent it (the engine's least-loaded
        unit if it left the choice to the engine; the roomiest allowed unit of that instance
        if the mask forbids that one), else skip it if other dispatches are pending, else hold.
        """
        if self.teacher is not teacher:
            self.teacher = teacher
            self.intents.clear()
            self._proxy = _Recorder(sim, self.intents)
            teacher.reset(self._proxy)
            for rid in list(sim.buffer):
                teacher.on_arrival(self._proxy, rid)
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
                dp = int(np.argmin(sim.prefill[inst].load_tokens()))
            a = 1 + inst * self.D + dp
            if mask[a]:
                return a
            row = mask[1 + inst * self.D: 1 + (inst + 1) * self.D]
            if row.any():
                c = np.where(row, self.cap.c_avail(inst), np.iinfo(np.int64).min)
                return 1 + inst * self.D + int(np.argmax(c))
        others = any(r != head and r not in self._skipped for r in self.intents)
        return self.skip if others and mask[self.skip] else 0


class _EnvAdapter(_Core):
    """Inside the env: stop the simulator at each epoch and let env.step act."""

    def decide(self, sim) -> None:
        sim.pause()


class AgentPolicy(_Core):
    """A trained agent as a PrefillScheduler: predict(obs, mask) -> action at every decision epoch.

    Takes the env's keyword arguments (the scenario-level ones are ignored: the simulator
    running this policy has its own), so `AgentPolicy(predict, **env_kwargs)` evaluates the
    agent through `simulate()` exactly like a baseline.
    """

    def __init__(self, predict: Callable[[np.ndarray, np.ndarray], int], **env_kwargs):
        init_from_env_kwargs(super().__init__, env_kwargs, ENV_ONLY)
        self.predict = predict

    def decide(self, sim) -> None:
        while sim.buffer and self.apply(sim, self.predict(self.observe(sim), self.mask(sim))):
            pass


class WaitMeter:
    """Integral over time of the number of arrived requests still waiting for their first token.

    Requests arrive in id order, so a window [lo, hi) holds every request that may still be
    waiting; the closed ones below it are folded into running sums.
    """

    def __init__(self, sim):
        self.sim = sim
        self.lo = self.hi = 0
        self.closed = 0.0  # waiting time of the requests below lo
        self.n_first = 0  # requests below lo that got a first token ...
        self.ttft_sum = 0.0  # ... and their TTFTs
        self.n_rejected = 0  # requests below lo rejected before their first token

    def total(self) -> tuple[float, int, int]:
        """(waiting time so far, first tokens so far, rejections before a first token so far)."""
        sim = self.sim
        req, now, n = sim.req, sim.now, sim.req.n
        arrival, first, state = req.arrival, req.first_token, req.state
        while self.hi < n and arrival[self.hi] <= now:
            self.hi += 1
        while self.lo < self.hi and (not math.isnan(first[self.lo]) or state[self.lo] == R.REJECTED):
            i = self.lo
            if math.isnan(first[i]):
                self.closed += req.finish[i] - arrival[i]
                self.n_rejected += 1
            else:
                w = first[i] - arrival[i]
                self.closed += w
                self.ttft_sum += w
                self.n_first += 1
            self.lo += 1
        sl = slice(self.lo, self.hi)
        f = first[sl]
        rej = state[sl] == R.REJECTED
        end = np.where(np.isnan(f), np.where(rej, req.finish[sl], now), f)
        got = ~np.isnan(f)
        return (self.closed + float((end - arrival[sl]).sum()), self.n_first + int(got.sum()),
                self.n_rejected + int((rej & ~got).sum()))


class PrefillDispatchEnv(gym.Env):
    """Gymnasium env: the agent schedules the prefill side (module docstring for the details)."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, scenario: str = "ds_v3_h800_3p1d", overrides=(), config: dict | None = None,
                 mode: str = "timing", tick_s: float = 0.02, obs_requests: int = 16, window: int = 32,
                 n_limit: int = 3, overload: str = "reject", cache_aware: bool = False, mask_full: bool = True,
                 decode=None, batching=None, throughput_weight: float = 0.0, reject_penalty_s: float | None = None,
                 reward_scale: float = 1.0, max_steps: int | None = None):
        sc = load_scenario(scenario, list(overrides))
        self.sim_config = merge_sim_config(sc.sim, config)
        self.agent = _EnvAdapter(mode=mode, tick_s=tick_s, obs_requests=obs_requests, window=window,
                                 n_limit=n_limit, overload=overload, cache_aware=cache_aware, mask_full=mask_full)
        self.policy_specs = {"decode": decode if decode is not None else sc.policy.get("decode"),
                             "batching": batching if batching is not None else sc.policy.get("batching")}
        for k, v in self.policy_specs.items():
            make_policy(k, v)  # fail now on a bad spec
        check(isinstance(throughput_weight, (int, float)) and throughput_weight >= 0, "env.throughput_weight",
               f"got {throughput_weight!r}; must be >= 0")
        check(reject_penalty_s is None or reject_penalty_s >= 0, "env.reject_penalty_s",
               f"got {reject_penalty_s!r}; must be >= 0 (or null: 10 x SLO TTFT)")
        check(isinstance(reward_scale, (int, float)) and reward_scale > 0, "env.reward_scale",
               f"got {reward_scale!r}; must be > 0")
        check(max_steps is None or (isinstance(max_steps, int) and max_steps >= 1), "env.max_steps",
               f"got {max_steps!r}; must be an integer >= 1 (or null)")
        self.throughput_weight = float(throughput_weight)
        self.reject_penalty_s = (10.0 * self.sim_config.slo.ttft_s if reject_penalty_s is None
                                 else float(reject_penalty_s))
        self.reward_scale = float(reward_scale)
        self.max_steps = max_steps
        probe = Simulator(self.sim_config, None, seed=0)  # validates the config; gives the cluster's size
        if not probe.disaggregated:
            raise ConfigError(f"env.scenario: {scenario} is colocated; PrefillDispatch needs "
                              "cluster.topology=disaggregated")
        self.agent.set_dims(len(probe.prefill), probe.prefill[0].dp)
        self.obs_layout = self.agent.obs_layout
        self.observation_space = spaces.Box(-CLIP, CLIP, shape=(self.agent.obs_size,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.agent.n_actions)
        self.sim: Simulator | None = None

    # -------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        sim_seed = int(self.np_random.integers(0, 2**31 - 1))
        pols = {k: make_policy(k, v) for k, v in self.policy_specs.items() if v is not None}
        self.sim = Simulator(self.sim_config, {"prefill": self.agent, **pols}, seed=sim_seed)
        self._steps = 0
        self._done = self.sim.run()
        self.meter = WaitMeter(self.sim)
        self._mark = self.meter.total()
        return self.agent.observe(self.sim), self._info()

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("PrefillDispatch: call reset() before step()")
        if self._done:
            raise RuntimeError("PrefillDispatch: the episode has ended; call reset()")
        sim = self.sim
        if not self.agent.apply(sim, action):
            self._done = sim.run()
        self._steps += 1
        w, nf, nr = self.meter.total()
        w0, nf0, nr0 = self._mark
        self._mark = (w, nf, nr)
        reward = (-(w - w0) - self.reject_penalty_s * (nr - nr0) + self.throughput_weight * (nf - nf0))
        truncated = self.max_steps is not None and self._steps >= self.max_steps and not self._done
        return self.agent.observe(sim), float(reward / self.reward_scale), self._done, truncated, self._info()

    def action_masks(self) -> np.ndarray:
        if self.sim is None or self._done:
            m = np.zeros(self.agent.n_actions, dtype=bool)
            m[0] = True
            return m
        return self.agent.mask(self.sim)

    def teacher_action(self, teacher: PrefillScheduler) -> int:
        """The action reproducing what prefill baseline `teacher` would do now (see _Core.teacher_action)."""
        if self.sim is None or self._done:
            return 0
        return self.agent.teacher_action(self.sim, teacher)

    # -------------------------------------------------------------- helpers
    def _info(self) -> dict:
        sim, m = self.sim, self.meter
        w, nf, nr = self._mark
        info = {"sim_time": sim.now, "buffered": len(sim.buffer), "first_tokens": nf, "rejected_waiting": nr,
                "wait_s_total": w, "ttft_mean": m.ttft_sum / m.n_first if m.n_first else 0.0,
                "decisions": self._steps}
        if self._done:
            info["summary"] = SimResult(sim).summary()
        return info


def make_env(**kwargs) -> PrefillDispatchEnv:
    """A PrefillDispatch-v0 env with the given keyword arguments (see PrefillDispatchEnv)."""
    return PrefillDispatchEnv(**kwargs)
