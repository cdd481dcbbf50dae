"""PdgymEnv: the contract the three pdgym Gymnasium envs share.

A subclass supplies its reward and the decision's bookkeeping; its formulations' policy cores (the observation /
mask / action code each shares with `AgentPolicy`, so a trained agent runs through `simulate()` exactly as it ran
in the env) follow one contract, `PolicyCore` below, and are named in envs/specs.py's SPECS: `build_core` makes the
env's (PAUSE answers: the decision pauses the run for env.step), `agent_policy` the agent's (AgentDecider:
predict(obs, mask) answers). Everything else lives here once:

- Scenario loading: `scenario` (conf/scenario/NAME.yaml, `scenario_names()`), Hydra-style
  `overrides` ("workload.num_requests=600") and a nested `config` dict merged over them.
- Seeding and trace windows: `reset(seed=s)` seeds `np_random`, which draws the simulator's seed
  and, on a trace workload, the episode's window of the trace (`trace_split`, see `TraceWindow`).
  The same seed repeats an episode exactly; `reset()` continues the stream.
- The invalid-action rule (INVALID_ACTION_RULE below), counted in info["invalid_actions"].
- Episode end: terminated when every request of the episode is resolved; truncated by the
  registered `max_episode_steps` (gym.make wraps the env in TimeLimit) or by a stall
  (`stall_s`); info["summary"] (the DESIGN section 5 metrics of the run so far) when the env
  ends the episode itself, `summary()` any time (e.g. after TimeLimit's truncation).
- The action mask where clients look (envs/masks.py): `action_masks()` (SB3), info["action_mask"] at reset and
  step, and with `mask_in_obs=True` a Dict observation ({obs_key: observation, mask_key: mask}).
- `obs_layout` (one property), `spaces()` of the core, `get_action_meanings()`, and
  `render_mode` "ansi" / "rgb_array" (envs/render.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pdgym.envs import render as V
from pdgym.envs.masks import MASK_KEY, OBS_KEY, check_keys, masked_obs, masked_space
from pdgym.envs.scenario import load_scenario, merge_sim_config, trace_splits
from pdgym.envs.sim import SimResult, Simulator
from pdgym.envs.sim.config import ConfigError, SimConfig, check
from pdgym.envs.sim.notices import EnvWarning
from pdgym.envs.sim.points import POINTS
from pdgym.envs.sim.validation import UnknownOptionError, check_choice, check_float
from pdgym.envs.specs import SPECS, check_formulation, core_class
from pdgym.envs.splits import split_rows

INVALID_ACTION_RULE = """An action that is not a member of `action_space` (Gymnasium's `contains`: -1, n, 10**9 and
0.5 are not members of Discrete(n); a Box action is cast to float32 and must have the box's shape and
lie inside it) or that `action_masks()` forbids is replaced by `default_action()` and counted in
info["invalid_actions"] (a running count over the episode). The env never raises on an action;
`AgentPolicy` applies the same rule at evaluation (its `invalid_actions` attribute)."""

TORCH_THREADS_NOTE = """Training with PyTorch on these envs: call torch.set_num_threads(1) first (plain SB3 PPO on
DecodeRouting-v0 ran 357 steps/s with 2 torch threads and 1,116 with one; the small policy networks
gain nothing from intra-op threads and the simulator needs the core)."""


def resolve_action(space: spaces.Space, mask: np.ndarray | None, action: Any, default) -> tuple[Any, bool]:
    """(the action to carry out, whether `action` was invalid) under INVALID_ACTION_RULE.

    `default` is called only for an invalid action (a callable returning the env's default action).
    """
    if isinstance(space, spaces.Box):
        try:
            a = np.asarray(action, dtype=np.float32)
        except (TypeError, ValueError):
            return default(), True
        return (a, False) if space.contains(a) else (default(), True)
    if isinstance(action, (int, np.integer)):  # the common case, without Discrete.contains' generality
        a = int(action)
        ok = space.start <= a < space.start + space.n
    else:
        ok = space.contains(action)
        a = int(action) if ok else 0
    if ok and (mask is None or mask[a - space.start]):
        return a, False
    return default(), True


class _PointBudgets(Mapping):
    """Decision point name -> its `decisions_per_request` (envs/sim/points.py), read from POINTS when asked, so a
    point added to the table has its entry here."""

    def __getitem__(self, name: str) -> float | None:
        return POINTS[name].decisions_per_request

    def __iter__(self):
        return iter(POINTS)

    def __len__(self) -> int:
        return len(POINTS)


# Decisions an agent may make in one simulate() run, per request of the run (DecisionBudget), per decision point.
# An agent's decisions per request can explode without simulated time moving: a router that SKIPs the whole pool at
# every step boundary makes about pool-size decisions per step, so an untrained agent's evaluation on
# decode_tier_n16 ran past 300 s on one seed. What the envs need: see docs/agents.md ("Bounded evaluation").
# PhaseBatching has none: each of its decisions is one pass of a unit, which moves simulated time, so the
# simulated-time horizon (evaluate.agent_horizon) bounds it. The values live in POINTS (decisions_per_request).
DECISIONS_PER_REQUEST: Mapping[str, float | None] = _PointBudgets()


class DecisionBudget:
    """An agent's `predict` bounded to `per_request` x the run's requests decisions in one simulate() run.

    `start(sim)` binds it to a run; past the budget it pauses the simulator once (`spent` is then True and
    the caller ends the run as stalled: evaluate.run_bounded) and answers every further call of the same
    event with an action outside the action space, which INVALID_ACTION_RULE turns into the env's default
    action (END a decode boundary, hold a prefill buffer) without running the network, so the event ends
    quickly. `per_request=None` counts without a bound."""

    def __init__(self, predict, per_request: float | None):
        self.predict, self.per_request = predict, per_request
        self.sim, self.limit, self.used, self.spent = None, None, 0, False

    def start(self, sim) -> None:
        self.sim, self.used, self.spent = sim, 0, False
        self.limit = None if self.per_request is None else int(self.per_request * max(sim.req.n, 1))

    def __call__(self, obs, mask):
        self.used += 1
        if self.limit is not None and self.used > self.limit:
            if not self.spent:
                self.spent = True
                self.sim.pause()
            return -1
        return self.predict(obs, mask)

    def why(self) -> str:
        return (f"{self.limit} decisions for {self.sim.req.n} requests, the budget of {self.per_request:g} per "
                "request (decisions per request exploded: e.g. a router skipping the whole pool at every step)")


class PolicyCore(Protocol):
    """The one contract of a formulation's policy core: the observation / mask / action code its env and its
    `AgentPolicy` share, so a trained agent runs through `simulate()` exactly as it ran in the env.

    A core is the simulator's policy at its decision point (a PrefillScheduler, DecodeRouter or BatchingPolicy)
    and sets up each decision itself; when one is due it calls `self.decider.decide(self, sim)`. At a decision:
    `mask(sim)` the allowed actions, `observe(sim, mask)` the observation, `default_action(sim, mask)` what an
    invalid action becomes (INVALID_ACTION_RULE), `apply(sim, action)` carries out a valid action and says
    whether another decision follows at the same instant (the core has then set it up), `describe(sim, action)`
    the action in words. `spaces()`, `action_meanings()` and `obs_layout` describe it (envs/features.py's
    LayoutCore). `bind(sim)` fixes its sizes from the cluster's shape (the env calls it once, with the view of a
    probe run, before `spaces()`; as a policy it binds again in its `reset(sim)`: an AgentPolicy has no env); `n_actions`
    is then its number of discrete actions. `name`, `invalid_actions`
    and `predict` are what evaluation reads of an AgentPolicy (DecidingCore has them). Each formulation's core is
    named in envs/specs.py's SPECS; tests/test_specs.py writes one from scratch against this protocol alone."""

    decider: Decider
    name: str
    n_actions: int
    invalid_actions: int
    predict: Callable | None

    def bind(self, sim) -> None: ...
    def spaces(self) -> tuple[spaces.Space, spaces.Space]: ...
    def action_meanings(self) -> list[str]: ...
    def observe(self, sim, mask: np.ndarray | None) -> np.ndarray: ...
    def mask(self, sim) -> np.ndarray: ...
    def apply(self, sim, action) -> bool: ...
    def default_action(self, sim, mask: np.ndarray | None): ...
    def describe(self, sim, action) -> str: ...


class Decider:
    """Who answers a policy core's decisions. This one, the generic env adapter: the decision pauses the
    simulator, and env.step supplies the action (`PdgymEnv.step` -> the env's `_act` -> `core.apply`).
    `decide` returns whether the decision was taken now (False: deferred to env.step)."""

    invalid_actions = 0

    def decide(self, core: PolicyCore, sim) -> bool:
        sim.pause()
        return False


PAUSE = Decider()


class AgentDecider(Decider):
    """A trained agent answers: predict(obs, mask) -> action at every decision, until `apply` says none follows
    at this instant; an invalid action follows INVALID_ACTION_RULE and is counted in `invalid_actions`."""

    def __init__(self, predict: Callable[[np.ndarray, np.ndarray], Any]):
        self.predict = predict
        self.invalid_actions = 0
        self._space: tuple[Any, spaces.Space] = (None, None)

    def decide(self, core: PolicyCore, sim) -> bool:
        layout = getattr(core, "layout", None)  # a core's spaces change only with its layout (set at reset)
        if self._space[0] is not layout or layout is None:
            self._space = (layout, core.spaces()[1])
        space = self._space[1]
        while True:
            m = core.mask(sim)
            a, bad = resolve_action(space, m, self.predict(core.observe(sim, m), m),
                                    lambda m=m: core.default_action(sim, m))
            self.invalid_actions += bad
            if not core.apply(sim, a):
                return True


class DecidingCore:
    """Mixin of every policy core: its `decider` (PAUSE in an env; an AgentDecider in an AgentPolicy) and the
    agent's count of invalid actions."""

    name = "agent"
    decider: Decider = PAUSE

    @property
    def invalid_actions(self) -> int:
        return self.decider.invalid_actions

    @property
    def predict(self):
        """The agent's predict(obs, mask) (an AgentPolicy's; None in an env): the bounded runner reads its budget."""
        return getattr(self.decider, "predict", None)


def make_core(init, options: dict, env_keys: tuple[str, ...] = (), owner: str | None = None):
    """Call a policy core's constructor (a class or a bound `__init__`) with `options`, less the
    env-level keys `env_keys` (an AgentPolicy runs in a simulator that has its own scenario); the core's
    signature holds the defaults, written once. A keyword no env takes (reported against `owner`, the env class) is
    an UnknownOptionError (a TypeError and a ConfigError: one line); a bad value of a known one the core's ConfigError."""
    kwargs = {k: v for k, v in options.items() if k not in env_keys}
    params = inspect.signature(init).parameters
    bad = [k for k in kwargs if k not in params]
    if bad:
        allowed = [k for k in (*params, *env_keys) if k not in ("self", "registered_as")]  # registered_as: gym.make's
        who = owner or getattr(init, "__qualname__", init)
        raise UnknownOptionError(f"env.{bad[0]}: unknown option ({who}() got an unexpected keyword argument {bad[0]!r}); "
                                 f"allowed: {', '.join(sorted(allowed))}")
    try:
        return init(**kwargs)
    except ConfigError as exc:  # the core checks its options under its policy key; here they are env options
        m = re.match(r"policy\.\w+\.(\w+): ", str(exc))
        if m and m.group(1) in kwargs:
            raise ConfigError(f"env.{str(exc)[m.start(1):]}") from None
        raise


# Requests of an episode's trace window when neither `overrides` nor `config` set workload.num_requests: the
# training episode of conf/env/{decode_routing,prefill_dispatch,phase_batching}.yaml (tests/test_first_week.py
# holds them equal), at most the scenario's own. A scenario's num_requests is sized for a pdgym-sim run over
# the trace (decode_tier_n16: 10,000 rows), more than the train split holds (8,714 rows of azure_conv), so
# gym.make's default episode replayed the whole split every time and warned about its own defaults.
EPISODE_REQUESTS = 600


class TraceWindow:
    """Which rows of a trace an episode replays.

    On a workload that reads a trace (workload.trace set) with `trace_split` set (default "train"), every
    reset draws the window's first row uniformly from the split's rows (envs/splits.py, the rule evaluation
    uses; conf/splits/default.yaml: train [0, 45%), val [45%, 55%), test [55%, 100%), disjoint), so seeds give
    different stretches of traffic and training never sees the evaluation rows. The window holds
    workload.num_requests rows when `overrides` or `config` set it, else min(EPISODE_REQUESTS, the
    scenario's num_requests), at most the split's. A `workload.trace_offset` given in `overrides`
    or `config` pins the window instead (every episode replays those rows); so does trace_split=None
    (the scenario's own trace_offset).
    """

    def __init__(self, sim_config: SimConfig, split: str | None, pinned: bool, requests_given: bool = True):
        splits = trace_splits()
        if split is not None:
            check_choice(split, "env.trace_split", tuple(splits))
        wl = sim_config.workload
        self.rows: tuple[int, int, int] | None = None  # (lo, hi, n)
        if split is None or pinned or wl.trace is None:  # every workload reading a trace (envs/splits.py)
            return
        wanted = int(wl.num_requests) if requests_given else min(int(wl.num_requests), EPISODE_REQUESTS)
        lo, hi, n = split_rows(wl.trace, splits[split], wanted, key=f"env.trace_split={split}")
        if n == hi - lo:
            what = (f"workload.num_requests={wl.num_requests} fills" if requests_given else
                    f"an episode's default {EPISODE_REQUESTS} requests fill")
            warnings.warn(f"{what} the {split} split of {wl.trace!r} ({hi - lo} rows): every episode replays the same "
                          "rows (only the simulator's random streams differ); lower workload.num_requests for varied "
                          "episodes", EnvWarning, stacklevel=4)
        self.rows = (lo, hi, n)

    def config(self, sim_config: SimConfig, rng: np.random.Generator) -> SimConfig:
        if self.rows is None:
            return sim_config
        lo, hi, n = self.rows
        off = lo + int(rng.integers(0, hi - lo - n + 1))
        wl = dataclasses.replace(sim_config.workload, trace_offset=off, num_requests=n)
        return dataclasses.replace(sim_config, workload=wl)


def _sets_workload(key: str, overrides, config: dict | None) -> bool:
    """Whether the user's `overrides` or `config` set workload.KEY (not the scenario)."""
    given = any(str(o).lstrip("+~").split("=", 1)[0] == f"workload.{key}" for o in overrides)
    return given or key in ((config or {}).get("workload") or {})


class PdgymEnv(gym.Env):
    """Base of the pdgym envs (module docstring). Subclasses set ENV_ID, POINT, DEFAULT_SCENARIO and
    implement `_check_cluster`, `_policies`, `_begin`, `_act`, `_reward`, `_observe`,
    `action_masks`, `default_action` and optionally `_info_extra`."""

    metadata: ClassVar[dict] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    ENV_ID: ClassVar[str]
    POINT: ClassVar[str]  # the decision point the agent holds: prefill | decode | batching
    DEFAULT_SCENARIO: ClassVar[str]
    NO_DECISION_HINT: ClassVar[str] = ""  # what to change when a scenario leaves the agent nothing to decide

    def __init__(self, scenario: str | None = None, overrides=(), config: dict | None = None,
                 render_mode: str | None = None, trace_split: str | None = "train", stall_s: float | None = 60.0,
                 registered_as: str | None = None, mask_in_obs: bool = False, obs_key: str = OBS_KEY,
                 mask_key: str = MASK_KEY, **options):
        # registered_as: the id gym.make was given (envs/specs.py registers it); None when built directly
        # mask_in_obs: the observation is Dict({obs_key: the observation, mask_key: the action mask}) (envs/masks.py)
        if registered_as is not None:
            alias_of = check_formulation(registered_as, self.POINT, options)
            if alias_of is not None:
                given = ", ".join(f"{k}={v!r}" for k, v in SPECS[alias_of].options.items())
                warnings.warn(f"{registered_as} with {given} is an alias of {alias_of}: make that id "
                              f"(gym.make({alias_of!r}, ...))", EnvWarning, stacklevel=3)
        self.registered_as = registered_as
        scenario = scenario or self.DEFAULT_SCENARIO
        if render_mode is not None:
            check_choice(render_mode, "env.render_mode", self.metadata["render_modes"])
        self.render_mode = render_mode
        self.stall_s = None if stall_s is None else check_float(stall_s, "env.stall_s", lo_open=True)
        self.scenario = scenario
        ok = isinstance(overrides, Sequence) and not isinstance(overrides, str) and all(isinstance(o, str)
                                                                                       for o in overrides)
        check(ok, "env.overrides", f"got {overrides!r}; must be a list of 'key=value' strings")
        check(config is None or isinstance(config, Mapping), "env.config",
              f"got {config!r}; must be a nested dict of simulator settings (or null)")
        sc = load_scenario(scenario, list(overrides))
        self.scenario_policies = sc.policy  # the scenario's policy specs at each decision point
        self.sim_config = merge_sim_config(sc.sim, config)
        self.window = TraceWindow(self.sim_config, trace_split, _sets_workload("trace_offset", overrides, config),
                                  _sets_workload("num_requests", overrides, config))
        wl = dataclasses.replace(self.sim_config.workload, num_requests=1, phases=None)
        probe = Simulator(dataclasses.replace(self.sim_config, workload=wl), None, 0)  # the cluster's shape
        self._check_cluster(probe)
        self.core = self._make_core(options)
        self._size_core(probe)
        self.observation_space, self.action_space = self.core.spaces()
        self.core_observation_space = self.observation_space  # the core's own (the Dict's obs_key under mask_in_obs)
        check(isinstance(mask_in_obs, bool), "env.mask_in_obs", f"got {mask_in_obs!r}; must be true or false")
        self.mask_in_obs, self.obs_key, self.mask_key = mask_in_obs, obs_key, mask_key
        if mask_in_obs:
            check_keys(obs_key, mask_key)
            self.observation_space = masked_space(self.observation_space, self.action_space, obs_key, mask_key)
        self.sim: Simulator | None = None
        self._done = True
        self._stall_end = False

    # -------------------------------------------------------------- policy cores
    @classmethod
    def _core_options(cls, options: dict) -> dict:
        """The core's keyword arguments from the env's (before the env-level keys are dropped)."""
        return options

    @classmethod
    def build_core(cls, options: dict, decider: Decider = PAUSE) -> PolicyCore:
        """The core of the formulation `options` select (envs/specs.py), answered by `decider`."""
        core = make_core(core_class(cls.POINT, options), cls._core_options(options), cls.env_keys(), cls.__name__)
        core.decider = decider
        return core

    @classmethod
    def agent_policy(cls, predict: Callable[[np.ndarray, np.ndarray], Any], **env_kwargs) -> PolicyCore:
        """AgentPolicy: a trained agent as the simulator's policy at this env's point: the formulation's core
        (the env's observation and action code) with predict(obs, mask) answering its decisions. Takes the
        env's keyword arguments and ignores the scenario-level ones (the simulator running it has its own), so
        `AgentPolicy(predict, **env_kwargs)` runs through `simulate()` like a baseline; invalid actions follow
        INVALID_ACTION_RULE and are counted in its `invalid_actions`."""
        return cls.build_core(env_kwargs, AgentDecider(predict))

    # -------------------------------------------------------------- subclass hooks
    def _make_core(self, options: dict) -> PolicyCore:
        return self.build_core(options)

    def _check_cluster(self, probe: Simulator) -> None:
        """Raise a ConfigError if the scenario's cluster has no room for this decision point."""

    def _size_core(self, probe: Simulator) -> None:
        """Fix the core's sizes (spaces) from the cluster's shape: the core's own `bind`, on the probe's view."""
        self.core.bind(probe.view)

    def _policies(self) -> dict:
        """The simulator's policies for one episode (the core at this env's point, baselines elsewhere)."""
        raise NotImplementedError

    def _begin(self) -> bool:
        """Per-episode setup after the simulator is built; run to the first decision. True if the run ended."""
        raise NotImplementedError

    def _act(self, action) -> bool:
        """Carry out a valid action, run to the next decision; True if the run ended."""
        raise NotImplementedError

    def _reward(self) -> float:
        raise NotImplementedError

    def _observe(self) -> np.ndarray:
        raise NotImplementedError

    def action_masks(self) -> np.ndarray:
        raise NotImplementedError

    def _require_reset(self, what: str) -> None:
        """`what` (step, render, action_masks) needs a reset() first: before one there is no decision to act on
        or mask (a mask invented then would be accepted as if it meant something)."""
        if self.sim is None:
            raise RuntimeError(f"{self.ENV_ID}: call reset() before {what}()")

    def default_action(self):
        """What an invalid action is replaced by (INVALID_ACTION_RULE)."""
        raise NotImplementedError

    def _info_extra(self) -> dict:
        return {}

    def _describe(self, action) -> str:
        """A valid action at the current decision in a user's words; the default names it by
        get_action_meanings() (an env whose decision is about a request says which one)."""
        names = self.get_action_meanings()
        if isinstance(self.action_space, spaces.Discrete):
            return names[int(action) - self.action_space.start]
        return "; ".join(f"{v:.3g} ({n})" for n, v in zip(names, np.asarray(action, dtype=float).ravel(), strict=False))

    # -------------------------------------------------------------- the contract
    @classmethod
    def env_keys(cls) -> tuple[str, ...]:
        """Keyword arguments of the env itself (scenario, reward, episode handling), not of its core:
        an AgentPolicy given the env's keyword arguments ignores these."""
        keys: list[str] = []
        for klass in (cls, PdgymEnv):
            for name, p in inspect.signature(klass.__init__).parameters.items():
                if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name not in keys:
                    keys.append(name)
        return tuple(keys)

    @property
    def obs_layout(self) -> dict:
        """[global | slots] layout of the observation for permutation-invariant extractors:
        n_slots, per_slot_dim, global_dim, slots_first, mask_index (the slot feature flagging a real slot)."""
        return self.core.obs_layout

    def get_action_meanings(self) -> list[str]:
        """One line per action (Discrete) or per action component (Box)."""
        return self.core.action_meanings()

    def describe_action(self, action, mask: np.ndarray | None = None) -> str:
        """What `action` does at the current decision, in words ("route req 1234 -> worker 3", "SKIP req 77",
        "release the short half (5 requests) -> prefill 1"): what pdgym-enjoy prints at each decision. An
        invalid action is described as the default action that replaces it (INVALID_ACTION_RULE). Reads
        the state only; `mask` is action_masks() when the caller has it."""
        if self.sim is None or self._done:
            return "episode over"
        mask = self.action_masks() if mask is None else mask
        a, invalid = resolve_action(self.action_space, mask, action, self.default_action)
        text = self._describe(a)
        if not invalid:
            return text
        shown = np.asarray(action).tolist() if isinstance(action, (np.ndarray, np.generic)) else action
        return f"{text} (invalid action {shown!r}: the default instead)"

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        cfg = self.window.config(self.sim_config, self.np_random)
        self.sim = Simulator(cfg, self._policies(), seed=int(self.np_random.integers(0, 2**31 - 1)))
        self._steps = 0
        self._invalid = 0
        self._progress = (0, 0)
        self._quiet_s = 0.0  # simulated time of consecutive decisions without progress
        self._stall_end = False
        self._done = self._begin()
        if self._done:  # the whole run went by without one decision: step() could only refuse
            raise ConfigError(f"{self.ENV_ID}: scenario {self.scenario!r} left the agent no decision (the run ended "
                              f"inside reset()){self.NO_DECISION_HINT}")
        return self._with_mask(self._observe(), self._info(False))

    def step(self, action):
        self._require_reset("step")
        if self._done or self._stall_end:
            raise RuntimeError(f"{self.ENV_ID}: the episode has ended; call reset()")
        a, invalid = resolve_action(self.action_space, self.action_masks(), action, self.default_action)
        self._invalid += invalid
        t0 = self.sim.now
        self._done = self._act(a)
        self._steps += 1
        reward = self._reward()
        stalled = self._stall_end = not self._done and self._stalled(self.sim.now - t0)
        obs, info = self._with_mask(self._observe(), self._info(stalled))
        return obs, reward, self._done, stalled, info

    def _with_mask(self, obs, info: dict):
        """The mask where clients look (envs/masks.py): info["action_mask"] of a Discrete action space, and the Dict
        observation under mask_in_obs; both the action_masks() of the decision `obs` is for."""
        if not isinstance(self.action_space, spaces.Discrete):
            return obs, info
        info["action_mask"] = mask = self.action_masks()
        return (masked_obs(obs, mask, self.obs_key, self.mask_key) if self.mask_in_obs else obs), info

    def _stalled(self, dt: float) -> bool:
        """True once decisions have let no request make progress (no output token, nothing resolved)
        for `stall_s` of simulated time in a row. Decisions come only while requests wait, so a run
        of quiet decisions means the agent is keeping them waiting (e.g. always holding)."""
        sim = self.sim
        now = (sim.tokens_out, sim.n_resolved)
        if now != self._progress:
            self._progress = now
            self._quiet_s = 0.0
            return False
        self._quiet_s += dt
        return self.stall_s is not None and bool(self._quiet_s >= self.stall_s)

    def _info(self, stalled: bool) -> dict:
        sim = self.sim
        info = {"sim_time": sim.now, "decisions": self._steps, "invalid_actions": self._invalid,
                "finished": len(sim.completed), **self._info_extra()}
        if self._done or stalled:
            info["summary"] = self.summary()
            info["stalled"] = stalled
        return info

    def summary(self) -> dict:
        """The DESIGN section 5 metrics of the episode so far (requests still unresolved count in neither
        finished nor rejected). info["summary"] at the env's own episode ends; after a TimeLimit
        truncation (which the env does not see) call env.unwrapped.summary()."""
        if self.sim is None:
            raise RuntimeError(f"{self.ENV_ID}: call reset() before summary()")
        with warnings.catch_warnings():  # a run cut before any request resolved has NaN (undefined) metrics
            warnings.simplefilter("ignore", RuntimeWarning)
            return SimResult(self.sim).summary()

    # -------------------------------------------------------------- rendering
    def render(self):
        if self.render_mode is None:
            gym.logger.warn(f"{self.ENV_ID}: render() without a render_mode (make the env with "
                            "render_mode='ansi' or 'rgb_array')")
            return None
        self._require_reset("render")
        view = V.cluster_view(self.sim, self.POINT, self._decision_line())
        return V.to_text(view) if self.render_mode == "ansi" else V.to_rgb(view)

    def _decision_line(self) -> str:
        if self._done:
            return f"episode over after {self._steps} decisions"
        names = self.get_action_meanings()
        if not isinstance(self.action_space, spaces.Discrete):
            return f"decision {self._steps}: {'; '.join(names)}"
        allowed = [n for n, ok in zip(names, self.action_masks(), strict=True) if ok]
        return f"decision {self._steps}: {len(allowed)} of {len(names)} actions allowed: {', '.join(allowed)}"
