"""pdgym/CapacityControl-v0: elastic P/D capacity on a day of changing traffic (issue 43; docs/concepts.md).

Every control interval (15 s by default) the agent takes one of ACTIONS: nothing, flip an instance P->D or D->P,
scale a role up (a cold start) or down. The cluster is the fluid model of envs/sim/fluid.py (calibrated against the
pass-level engine), driven by envs/sim/capacity.py's episode core; the board (conf/capacity/NAME.yaml) gives the
traffic shape, the GPU budget and the price. A standalone gymnasium.Env, not a PdgymEnv: there is no pass-level
simulator underneath to pause, but the conventions are the same: seeding (reset(seed) picks the day from `days`
with the env's generator; options={"day": k} fixes it), masks via action_masks(), a masked action refused in one
line (ConfigError), the episode's summary in info at its end.

Observation (float32, OBS_NAMES): serving / booting / flipping counts per role and GPUs held (over the budget), the
prefill wait and decode step (over their SLOs), decode occupancy and queue (over the pool's slots), arrivals per class
(over the board's mean rate), the last interval's attainment, the time of day (sin, cos), with forecast=true the
day's calendar curve one cold start ahead (over the mean rate: what a forecaster of the diurnal shape would know;
bursts and mix phases stay unknown), the prefill pool's utilisation and the decode pool's output tokens / s (the
rules' signals). Reward: the interval's good requests minus price x GPU-seconds, over
base_rps x interval_s (so a fully served interval at no cost is ~1).
"""

from __future__ import annotations

import importlib.resources
import math

import gymnasium as gym
import numpy as np
from omegaconf import OmegaConf
from pdgym.envs.scenario import load_scenario
from pdgym.envs.sim.capacity import ACTIONS, CapacityModel, CapacityRun, capacity_config
from pdgym.envs.sim.capacity_traffic import CAPACITY_SEEDS
from pdgym.envs.sim.validation import ConfigError, check, did_you_mean

ENV_ID = "pdgym/CapacityControl-v0"
DECODE_TPS_SCALE = 1e4  # output tokens / s: the decode-TPS feature's unit (an H100 instance serves ~8-10K)
MAX_EPISODE_STEPS = 600  # 240 intervals in a default episode (an hour at 15 s), x2.5 for longer boards
OBS_NAMES = ("serve_p", "serve_d", "boot_p", "boot_d", "flip_to_p", "flip_to_d", "gpus", "prefill_wait",
             "decode_step", "decode_occupancy", "decode_queue", "arrivals_conv", "arrivals_code", "attainment",
             "day_sin", "day_cos", "forecast", "prefill_util", "decode_tps")


def board_names() -> list[str]:
    root = importlib.resources.files("pdgym.conf") / "capacity"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_board(name: str, overrides: list[str] | tuple[str, ...] = ()):
    """conf/capacity/NAME.yaml with dotted overrides ('traffic.base_rps=30') -> a validated CapacityConfig."""
    names = board_names()
    check(name in names, "board", f"unknown {name!r}; {did_you_mean(name, names)}allowed: {', '.join(names)}")
    check(isinstance(overrides, (list, tuple)) and all(isinstance(o, str) and "=" in o for o in overrides),
          "overrides", f"got {overrides!r}; must be a list of 'key=value' strings, e.g. ['traffic.base_rps=30']")
    text = (importlib.resources.files("pdgym.conf") / "capacity" / f"{name}.yaml").read_text()
    cfg = OmegaConf.merge(OmegaConf.create(text), OmegaConf.from_dotlist(list(overrides)))
    return capacity_config(OmegaConf.to_container(cfg, resolve=True))


_MODELS: dict = {}


def capacity_model(board: str, overrides: tuple[str, ...] = ()) -> CapacityModel:
    """The board's CapacityModel (rates built once per process and board)."""
    key = (board, tuple(overrides))
    if key not in _MODELS:
        cfg = load_board(board, list(overrides))
        _MODELS[key] = CapacityModel(cfg, load_scenario(cfg.scenario).sim)
    return _MODELS[key]


class CapacityControlEnv(gym.Env):
    """One episode = one day of the board's traffic; one step = one control interval."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, board: str = "diurnal_bursts", overrides: list[str] | tuple[str, ...] = (),
                 days: str | list[int] = "train", forecast: bool = True, render_mode: str | None = None,
                 registered_as: str | None = None):
        self.model = capacity_model(board, tuple(overrides))
        self.board = board
        if isinstance(days, str):
            check(days in CAPACITY_SEEDS, "days", f"got {days!r}; allowed: {', '.join(CAPACITY_SEEDS)} or a list")
            days = CAPACITY_SEEDS[days]
        check(isinstance(days, list) and days and all(isinstance(d, int) and d >= 0 for d in days), "days",
              f"got {days!r}; must be a non-empty list of integers >= 0")
        self.days = list(days)
        self.forecast = bool(forecast)
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self.observation_space = gym.spaces.Box(-1.0, 10.0, (len(OBS_NAMES),), np.float32)
        self.run: CapacityRun | None = None
        cfg = self.model.cfg
        self._scale = cfg.traffic.base_rps * cfg.interval_s

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        day = (options or {}).get("day")
        if day is None:
            day = self.days[int(self.np_random.integers(len(self.days)))]
        check(isinstance(day, int) and day >= 0, "options.day", f"got {day!r}; must be an integer >= 0")
        self.run = CapacityRun(self.model, day)
        return self._obs(), {"day": day, "action_mask": self.action_masks()}

    def _started(self, what: str) -> CapacityRun:
        """The episode, or the RuntimeError every pdgym env raises before its first reset()."""
        if self.run is None:
            raise RuntimeError(f"pdgym/CapacityControl-v0: call reset() before {what}()")
        return self.run

    def action_masks(self) -> np.ndarray:
        return self._started("action_masks").mask()

    def step(self, action):
        run = self._started("step")
        if run.done:
            raise ConfigError("env: step() after the episode ended; call reset()")
        run.apply(int(action) if isinstance(action, (np.integer, np.ndarray)) else action)
        reward = run.advance() / self._scale
        info = {"action_mask": self.action_masks(), "good": run.last["good"], "gpu_s": run.last["gpu_s"]}
        if run.done:
            info["summary"] = run.summary()
        return self._obs(), float(reward), run.done, False, info

    def _obs(self) -> np.ndarray:
        run, cfg = self.run, self.model.cfg
        s = run.signals()
        b, r = cfg.gpu_budget, run.rates
        tr = cfg.traffic
        frac = run.now / tr.duration_s
        ahead = min(run.now + self.model.cold_s, tr.duration_s) / tr.duration_s
        cal = 1.0 + tr.diurnal_amp * math.sin(2 * math.pi * (ahead - tr.diurnal_phase))
        arr = s["arrival_rps"] / max(tr.base_rps, 1e-9)
        att = run.last["good"] / max(float(run.last["arrivals"].sum()), 1e-9) if run.interval else 1.0
        v = [s["serve_p"] / b, s["serve_d"] / b, run.count("P", "boot") / b, run.count("D", "boot") / b,
             run.count("P", "flip") / b, run.count("D", "flip") / b, run.gpus() / b,
             s["prefill_wait_s"] / r.ttft_s, s["step_s"] / r.tpot_s if math.isfinite(s["step_s"]) else 10.0,
             s["decode_occupancy"], s["decode_queue"], arr[0], arr[1], min(att, 1.0),
             math.sin(2 * math.pi * frac), math.cos(2 * math.pi * frac), cal if self.forecast else 0.0,
             s["prefill_util"], s["decode_tps"] / DECODE_TPS_SCALE]
        return np.clip(np.asarray(v, np.float32), -1.0, 10.0)

    def render(self):
        self._started("render")
        if self.render_mode != "ansi":
            return None
        s = self.run.signals()
        return (f"t={self.run.now:.0f}s P={s['serve_p']}(+{s['pending_p']}) D={s['serve_d']}(+{s['pending_d']}) "
                f"GPUs={self.run.gpus()} wait={s['prefill_wait_s']:.2f}s occ={s['decode_occupancy']:.2f}")
