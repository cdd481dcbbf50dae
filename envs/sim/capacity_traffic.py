"""Traffic that changes over an episode of the capacity decision point: a day's curve compressed into the episode,
bursts, and shifts of the mix between a long-prompt class and a long-output class.

A `TrafficConfig` gives the shape; `make_traffic(cfg, seed)` draws one day: the true per-class rate of every sub-step
(what a clairvoyant row plans on) and the Poisson arrival counts drawn from it (what every policy is served: the same
counts for every policy of a seed, so comparisons are paired). The classes are the Azure 2023 traces' length
distributions (conversation: 1,155-token prompts, 211-token outputs; code: 2,048 and 28), so a phase dominated by
one or the other moves the prefill : decode work ratio by ~8x. Days are seeds: seeds 10-14 are held out for
evaluation (never used to tune a rule or train an agent: CAPACITY_SEEDS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .validation import check, check_float, check_int

# Seeds of the days a rule is tuned and an agent trained on, and the held-out days every figure is measured on.
CAPACITY_SEEDS = {"train": list(range(0, 10)), "test": list(range(10, 15))}


@dataclass
class TrafficConfig:
    """One episode's traffic. Rates in requests/s; `mix` is the long-prompt (code) class's share of arrivals."""

    duration_s: float = 3600.0  # the episode: one day compressed into it (the diurnal period)
    base_rps: float = 40.0  # mean rate over the day
    diurnal_amp: float = 0.5  # rate = base * (1 + amp * sin(2 pi (t / duration - phase))), amp in [0, 1)
    diurnal_phase: float = 0.25  # the day starts at its trough (0.25 of a period before the sine's zero)
    day_jitter: float = 0.1  # a day's base rate is base * (1 + jitter * N(0, 1)): days differ
    bursts_per_h: float = 4.0  # bursts arrive as a Poisson process (per hour of the episode)
    burst_mult: float = 2.0  # a burst multiplies the rate by this (in [1, 10])
    burst_s: float = 120.0  # mean burst length (exponential, at least one sub-step)
    mix: float = 0.3  # the code class's share outside mix phases
    mix_phases: list[float] = field(default_factory=list)  # code shares the day cycles through (empty: `mix` all day)
    phase_s: float = 600.0  # mean length of one mix phase (exponential; the order of mix_phases, repeated)
    classes: dict[str, str] = field(default_factory=lambda: {"conv": "azure_conv", "code": "azure_code"})

    def validate(self, key: str = "capacity.traffic") -> None:
        check_float(self.duration_s, f"{key}.duration_s", lo=0.0, lo_open=True)
        check_float(self.base_rps, f"{key}.base_rps", lo=0.0)
        check_float(self.diurnal_amp, f"{key}.diurnal_amp", lo=0.0, hi=1.0, hi_open=True)
        check_float(self.diurnal_phase, f"{key}.diurnal_phase", lo=0.0, hi=1.0)
        check_float(self.day_jitter, f"{key}.day_jitter", lo=0.0, hi=0.3)
        check_float(self.bursts_per_h, f"{key}.bursts_per_h", lo=0.0)
        check_float(self.burst_mult, f"{key}.burst_mult", lo=1.0, hi=10.0)
        check_float(self.burst_s, f"{key}.burst_s", lo=0.0, lo_open=True)
        check_float(self.mix, f"{key}.mix", lo=0.0, hi=1.0)
        check(isinstance(self.mix_phases, list), f"{key}.mix_phases", "must be a list of code shares in [0, 1]")
        for i, m in enumerate(self.mix_phases):
            check_float(m, f"{key}.mix_phases[{i}]", lo=0.0, hi=1.0)
        check_float(self.phase_s, f"{key}.phase_s", lo=0.0, lo_open=True)
        check(isinstance(self.classes, dict) and list(self.classes) == ["conv", "code"], f"{key}.classes",
              f"got {self.classes!r}; must map conv and code (in this order) to a trace name")


@dataclass(frozen=True)
class Traffic:
    """One drawn day: per sub-step (rows) and class (columns), the true rate and the arrivals drawn from it."""

    dt: float
    rate: np.ndarray  # requests / s, true (what a clairvoyant plans on)
    arrivals: np.ndarray  # requests in each sub-step (Poisson counts of rate * dt)
    bursts: np.ndarray  # bool per sub-step: inside a burst

    @property
    def steps(self) -> int:
        return self.rate.shape[0]


def make_traffic(cfg: TrafficConfig, seed: int, dt: float) -> Traffic:
    """Draw one day of `cfg` in sub-steps of dt seconds (seed: the day)."""
    cfg.validate()
    check_int(seed, "seed", lo=0)
    rng = np.random.default_rng([seed, 43])
    n = max(1, int(math.ceil(cfg.duration_s / dt - 1e-9)))
    t = (np.arange(n) + 0.5) * dt
    base = cfg.base_rps * max(0.0, 1.0 + cfg.day_jitter * rng.standard_normal())
    total = base * (1.0 + cfg.diurnal_amp * np.sin(2 * np.pi * (t / cfg.duration_s - cfg.diurnal_phase)))
    bursts = np.zeros(n, bool)
    k = rng.poisson(cfg.bursts_per_h * cfg.duration_s / 3600.0)
    for start, length in zip(rng.uniform(0, cfg.duration_s, k), rng.exponential(cfg.burst_s, k)):
        bursts[(t >= start) & (t < start + max(length, dt))] = True
    total = total * np.where(bursts, cfg.burst_mult, 1.0)
    share = np.full(n, cfg.mix)
    if cfg.mix_phases:
        edge, j = 0.0, int(rng.integers(len(cfg.mix_phases)))
        while edge < cfg.duration_s:
            end = edge + rng.exponential(cfg.phase_s)
            share[(t >= edge) & (t < end)] = cfg.mix_phases[j % len(cfg.mix_phases)]
            edge, j = end, j + 1
    rate = np.stack([total * (1 - share), total * share], axis=1)
    check(bool(np.all(np.isfinite(rate)) and np.all(rate >= 0)), "capacity.traffic",
          "the rate curve must be finite and >= 0 everywhere")
    arrivals = rng.poisson(rate * dt).astype(float)
    return Traffic(dt=dt, rate=rate, arrivals=arrivals, bursts=bursts)
