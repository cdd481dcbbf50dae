"""One episode of elastic P/D capacity: instances that boot, flip roles and drain, over a fluid cluster and a day of
changing traffic. What pdgym/CapacityControl-v0 (envs/capacity_control.py), the capacity rules and the hindsight
rows (baselines/capacity_*.py) all act on.

Every `interval_s` the controller takes one action (ACTIONS): nothing, flip a serving instance P->D or D->P, scale a
role up (a cold start: weight bytes / host_to_hbm_gbps + startup_s, billed but not serving) or down (a booting one is
cancelled first; a serving decode instance migrates its share of the KV at the KV link's bandwidth before it stops
being billed). A flip takes `flip_s` (plus, D->P, the KV migration). `mask()` forbids leaving a role with no serving
instance and going over `gpu_budget`; `apply` refuses a masked action in one line. Between actions the fluid model
(fluid.py) runs in sub-steps of `substep_s` with the serving counts. Reward per interval: good requests (both SLOs
met) minus `price_per_gpu_s` x the GPU-seconds billed. No request is lost: arrived = finished + rejected + in the
system, at every step, across flips, scale-downs and faults (`fail_per_h`: a serving instance dies; its decoding
requests prefill again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .capacity_traffic import Traffic, TrafficConfig, make_traffic
from .config import SimConfig
from .fluid import ClassLengths, FluidCluster, FluidRates
from .validation import ConfigError, check, check_float, check_int

ACTIONS = ("noop", "flip_p_to_d", "flip_d_to_p", "up_prefill", "up_decode", "down_prefill", "down_decode")
NOOP, FLIP_PD, FLIP_DP, UP_P, UP_D, DOWN_P, DOWN_D = range(len(ACTIONS))


@dataclass
class CapacityConfig:
    """The capacity decision point's knobs (conf/capacity/*.yaml); the cluster shape comes from `scenario`."""

    scenario: str = "capacity_h100_qwen3_8b"  # P/D scenario whose hardware, model, instance shape and SLO it uses
    interval_s: float = 15.0  # control interval: one action each
    substep_s: float = 5.0  # fluid model step (interval_s is a whole number of them)
    gpu_budget: int = 16  # GPUs the fleet may hold at once (booting and draining instances count)
    price_per_gpu_s: float = 4.0  # reward: good requests - price x GPU-seconds
    startup_s: float = 60.0  # engine start-up after the weights are loaded (process, CUDA graphs, warm-up)
    host_to_hbm_gbps: float = 25.0  # weight loading rate, GB/s (page cache / NVMe -> HBM over PCIe)
    flip_s: float = 5.0  # a role change's own time (re-configure, warm-up of the other phase's graphs)
    init_prefill: int = 3
    init_decode: int = 3
    max_wait_s: float = 60.0  # prefill backlog beyond this many seconds of pool work is shed at arrival
    fail_per_h: float = 0.0  # faults: serving instances failing per hour (0: none)
    drain_s: float = 300.0  # after the day: the last configuration runs this long without arrivals
    traffic: TrafficConfig = field(default_factory=TrafficConfig)

    def validate(self, key: str = "capacity") -> None:
        check_float(self.interval_s, f"{key}.interval_s", lo=0.0, lo_open=True)
        check_float(self.substep_s, f"{key}.substep_s", lo=0.0, lo_open=True)
        ratio = self.interval_s / self.substep_s
        check(abs(ratio - round(ratio)) < 1e-9 and round(ratio) >= 1, f"{key}.substep_s",
              f"got {self.substep_s}; interval_s ({self.interval_s}) must be a whole number of sub-steps")
        check_int(self.gpu_budget, f"{key}.gpu_budget", lo=1)  # one of each role: CapacityModel
        check_float(self.price_per_gpu_s, f"{key}.price_per_gpu_s", lo=0.0)
        check_float(self.startup_s, f"{key}.startup_s", lo=0.0)
        check_float(self.host_to_hbm_gbps, f"{key}.host_to_hbm_gbps", lo=0.0, lo_open=True)
        check_float(self.flip_s, f"{key}.flip_s", lo=0.0)
        check_int(self.init_prefill, f"{key}.init_prefill", lo=1)
        check_int(self.init_decode, f"{key}.init_decode", lo=1)
        check_float(self.max_wait_s, f"{key}.max_wait_s", lo=0.0, lo_open=True)
        check_float(self.fail_per_h, f"{key}.fail_per_h", lo=0.0)
        check_float(self.drain_s, f"{key}.drain_s", lo=0.0)
        if not isinstance(self.traffic, TrafficConfig):
            raise ConfigError(f"{key}.traffic: got {type(self.traffic).__name__}; must be a TrafficConfig mapping")
        self.traffic.validate(f"{key}.traffic")


def capacity_config(data) -> CapacityConfig:
    """A CapacityConfig from a mapping (a Hydra group's content), unknown keys named in one line."""
    if isinstance(data, CapacityConfig):
        data.validate()
        return data
    check(isinstance(data, dict), "capacity", f"got {type(data).__name__}; must be a mapping")
    data = dict(data)
    tr = data.pop("traffic", {}) or {}
    check(isinstance(tr, dict), "capacity.traffic", "must be a mapping")
    for k, known, where in ((data, CapacityConfig, "capacity"), (tr, TrafficConfig, "capacity.traffic")):
        names = set(known.__dataclass_fields__) - ({"traffic"} if known is CapacityConfig else set())
        bad = sorted(set(k) - names)
        check(not bad, f"{where}.{bad[0] if bad else ''}", f"unknown key; allowed: {', '.join(sorted(names))}")
    cfg = CapacityConfig(**data, traffic=TrafficConfig(**tr))
    cfg.validate()
    return cfg


class Instance:
    """One instance of the fleet: its role (P or D) and state (serve, boot, flip, drain) until `until`."""

    __slots__ = ("role", "state", "until")

    def __init__(self, role: str, state: str, until: float):
        self.role, self.state, self.until = role, state, until


class CapacityModel:
    """What every episode of one CapacityConfig shares: the fluid rates of the cluster shape (built once)."""

    def __init__(self, cfg: CapacityConfig, sim: SimConfig):
        cfg.validate()
        self.cfg, self.sim = cfg, sim
        self.rates = FluidRates(sim, [ClassLengths.from_trace(k, v) for k, v in cfg.traffic.classes.items()])
        gp, gd = self.rates.gpus_prefill, self.rates.gpus_decode
        check(cfg.gpu_budget >= gp + gd, "capacity.gpu_budget",
              f"got {cfg.gpu_budget}; must hold one prefill plus one decode instance ({gp + gd} GPUs)")
        check(cfg.init_prefill * gp + cfg.init_decode * gd <= cfg.gpu_budget, "capacity.init_prefill",
              f"init_prefill x {gp} + init_decode x {gd} GPUs must fit gpu_budget ({cfg.gpu_budget})")
        self.cold_s = self.rates.weight_bytes / (cfg.host_to_hbm_gbps * 1e9) + cfg.startup_s
        self.substeps = int(round(cfg.interval_s / cfg.substep_s))
        self.intervals = int(math.ceil(cfg.traffic.duration_s / cfg.interval_s - 1e-9))

    def traffic(self, seed: int) -> Traffic:
        return make_traffic(self.cfg.traffic, seed, self.cfg.substep_s)

    def configs(self) -> np.ndarray:
        """Every (prefill, decode) serving count the budget allows, one row each (the hindsight DP's states)."""
        gp, gd, b = self.rates.gpus_prefill, self.rates.gpus_decode, self.cfg.gpu_budget
        return np.array([(p, d) for p in range(1, b // gp + 1) for d in range(1, (b - p * gp) // gd + 1)], float)


class CapacityRun:
    """One episode: a fleet, a fluid cluster and one day's traffic (seed)."""

    def __init__(self, model: CapacityModel, seed: int):
        self.model, self.cfg, self.seed = model, model.cfg, seed
        self.rates = model.rates
        self.traffic = model.traffic(seed)
        self.fluid = FluidCluster(model.rates, max_wait_s=self.cfg.max_wait_s)
        self.fault_rng = np.random.default_rng([seed, 4301])
        self.fleet = [Instance("P", "serve", 0.0) for _ in range(self.cfg.init_prefill)]
        self.fleet += [Instance("D", "serve", 0.0) for _ in range(self.cfg.init_decode)]
        self._recount()
        self._next_change = math.inf  # the earliest `until` of an instance not serving
        self.k = 0  # next sub-step of the traffic
        self.now = 0.0
        self.interval = 0
        self.gpu_s = 0.0
        self.good = 0.0
        self.reward_total = 0.0
        self.faults = 0
        self.last = {"good": 0.0, "gpu_s": 0.0, "arrivals": np.zeros(2), "reward": 0.0}
        self.done = False

    # -- the fleet --------------------------------------------------------------------------------------------
    def _recount(self) -> None:
        """The fleet's counts by (role, state) and its GPUs, kept after every change (read many times a step)."""
        c = dict.fromkeys(((r, s) for r in "PD" for s in ("serve", "boot", "flip", "drain")), 0)
        for i in self.fleet:
            c[i.role, i.state] += 1
        self._counts = c
        r = self.rates
        self._gpus = (sum(v for (role, _), v in c.items() if role == "P") * r.gpus_prefill
                      + sum(v for (role, _), v in c.items() if role == "D") * r.gpus_decode)

    def count(self, role: str, state: str = "serve") -> int:
        return self._counts[role, state]

    def pending(self, role: str) -> int:
        """Instances on their way into `role` (booting or flipping into it)."""
        return self._counts[role, "boot"] + self._counts[role, "flip"]

    def gpus(self) -> int:
        return self._gpus

    def mask(self) -> np.ndarray:
        """Allowed actions (ACTIONS order): no role left without a serving instance, the GPU budget kept."""
        r, b = self.rates, self.cfg.gpu_budget
        sp, sd = self.count("P"), self.count("D")
        g = self.gpus()
        return np.array([True, sp >= 2, sd >= 2, g + r.gpus_prefill <= b, g + r.gpus_decode <= b,
                         sp >= 2 or self.count("P", "boot") > 0, sd >= 2 or self.count("D", "boot") > 0])

    def apply(self, action: int) -> None:
        """Take one action now; a masked one is refused in one line (a scripted policy's bug, not a no-op)."""
        ok = isinstance(action, (int, np.integer)) and not isinstance(action, bool) and 0 <= action < len(ACTIONS)
        check(ok, "action", f"got {action!r}; allowed: integers 0-{len(ACTIONS) - 1} ({', '.join(ACTIONS)})")
        action = int(action)
        if not self.mask()[action]:
            raise ConfigError(f"action: {ACTIONS[action]} is masked now (serving P={self.count('P')}, "
                              f"D={self.count('D')}, GPUs {self.gpus()} of {self.cfg.gpu_budget}); "
                              "allowed: the actions action_masks() marks True")
        now = self.now
        if action in (FLIP_PD, FLIP_DP):
            src, dst = ("P", "D") if action == FLIP_PD else ("D", "P")
            inst = self._serving(src)
            inst.role, inst.state = dst, "flip"
            inst.until = now + self.cfg.flip_s + (self._migrate_s() if src == "D" else 0.0)
        elif action in (UP_P, UP_D):
            self.fleet.append(Instance("P" if action == UP_P else "D", "boot", now + self.model.cold_s))
        elif action in (DOWN_P, DOWN_D):
            role = "P" if action == DOWN_P else "D"
            boot = [i for i in self.fleet if i.role == role and i.state == "boot"]
            if boot:  # cancel the latest cold start: it serves nothing yet
                self.fleet.remove(max(boot, key=lambda i: i.until))
            else:
                inst = self._serving(role)
                inst.state, inst.until = "drain", now + (self._migrate_s() if role == "D" else 0.0)
        self._recount()
        self._next_change = min((i.until for i in self.fleet if i.state != "serve"), default=math.inf)

    def _serving(self, role: str) -> Instance:
        return next(i for i in reversed(self.fleet) if i.role == role and i.state == "serve")

    def _migrate_s(self) -> float:
        """Seconds to move one decode instance's share of the pool's KV over the KV link."""
        n = max(self.count("D"), 1)
        kv = float((self.fluid.dr * self.fluid.ctx).sum()) / n * self.rates.model.kv_bytes_per_token
        return kv / self.rates.kv_link_bw

    def _promote(self) -> None:
        if self._next_change > self.now + 1e-9:
            return
        keep = []
        for i in self.fleet:
            if i.state != "serve" and i.until <= self.now + 1e-9:
                if i.state == "drain":
                    continue
                i.state = "serve"
            keep.append(i)
        self.fleet = keep
        self._recount()
        self._next_change = min((i.until for i in self.fleet if i.state != "serve"), default=math.inf)

    def _fault(self, dt: float) -> None:
        p = self.cfg.fail_per_h * dt / 3600.0
        if p <= 0 or self.fault_rng.random() >= p:
            return
        serving = [i for i in self.fleet if i.state == "serve"]
        victim = serving[int(self.fault_rng.integers(len(serving)))]
        if victim.role == "D":
            self.fluid.fail_decode(1.0 / self.count("D"))
        self.fleet.remove(victim)
        self._recount()
        self.faults += 1

    # -- time -------------------------------------------------------------------------------------------------
    def advance(self) -> float:
        """Run one control interval; returns its reward (and the drain after the last one)."""
        dt = self.cfg.substep_s
        good0, gpu0 = self.good, self.gpu_s
        arr = np.zeros(self.traffic.arrivals.shape[1])
        for _ in range(self.model.substeps):
            if self.k >= self.traffic.steps:
                break
            self._substep(self.traffic.arrivals[self.k], dt)
            arr += self.traffic.arrivals[self.k]
            self.k += 1
        self.interval += 1
        if self.k >= self.traffic.steps:
            self._drain()
        good, gpu_s = self.good - good0, self.gpu_s - gpu0
        reward = good - self.cfg.price_per_gpu_s * gpu_s
        self.reward_total += reward
        self.last = {"good": good, "gpu_s": gpu_s, "arrivals": arr, "reward": reward}
        return reward

    def _substep(self, arrivals: np.ndarray, dt: float) -> None:
        self._promote()
        self._fault(dt)
        g = self.fluid.step(arrivals, self.count("P"), self.count("D"), dt)
        self.good += float(g.sum())
        self.gpu_s += self.gpus() * dt
        self.now += dt

    def _drain(self) -> None:
        """The day is over: the fleet as it is serves what is left, then the rest is rejected (reason horizon)."""
        zero = np.zeros(self.traffic.arrivals.shape[1])
        end = self.now + self.cfg.drain_s
        while self.now < end - 1e-9 and self.fluid.in_system().sum() > 1e-3:
            self._substep(zero, self.cfg.substep_s)
        self.fluid.drain_rest()
        self.done = True

    # -- what policies and the env read -----------------------------------------------------------------------
    def signals(self) -> dict:
        """What a reactive controller measures after an interval: each pool's load, the waits, the arrivals."""
        fl = self.fluid
        sp, sd = self.count("P"), self.count("D")
        arr = self.last["arrivals"] / self.cfg.interval_s  # requests / s per class, last interval
        a = arr.tolist()
        slots = max(fl.slots_one(max(sd, 1)), 1e-9)
        return {"serve_p": sp, "serve_d": sd, "pending_p": self.pending("P"), "pending_d": self.pending("D"),
                "prefill_util": sum(x * p / t for x, p, t in zip(a, fl._pm, fl._ptok)) / max(sp, 1),
                "prefill_wait_s": float(fl.last_wait_s), "decode_occupancy": sum(fl.dr.tolist()) / slots,
                "decode_queue": sum(fl.dq.tolist()) / slots, "step_s": float(fl.last_step_s),
                "decode_tps": float(fl.last_decode_tps), "arrival_rps": arr,
                "output_tps_demand": sum(x * o for x, o in zip(a, fl._om))}

    def summary(self) -> dict:
        """The episode's figures: reward, goodput, GPU-seconds, attainment per class, conservation terms."""
        t = self.fluid.totals
        fin = t.finished
        out = {"reward": self.reward_total, "good_requests": float(t.good.sum()), "gpu_seconds": self.gpu_s,
               "goodput_per_gpu": float(t.good.sum()) / max(self.gpu_s, 1e-12),
               "goodput_rps": float(t.good.sum()) / max(self.now, 1e-12),
               "slo_attainment": float(t.good.sum()) / max(float(t.arrived.sum()), 1e-12),
               "arrived": float(t.arrived.sum()), "finished": float(fin.sum()), "rejected": float(t.rejected.sum()),
               "faults": self.faults}
        for i, name in enumerate(self.rates.names):
            out[f"slo_attainment_{name}"] = float(t.good[i]) / max(float(t.arrived[i]), 1e-12)
        return out
