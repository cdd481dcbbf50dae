"""Hindsight rows of the capacity decision point: dynamic programming over control windows on (prefill count, decode
count) with the day's true arrivals, and MPC that re-plans from the true state with the true future.

The DP's model (`window_table`): every configuration of the budget runs the whole day in the fluid model at once
(one batched FluidCluster), so window w under configuration g is worth r[w, g] = its good requests - price x its
GPU-seconds, with the backlog that configuration itself built up. Moving between configurations costs what the
move costs in the env: a scale-up bills its cold start before it serves (price x cold_s x GPUs: a clairvoyant boots
it exactly that early), a flip bills `flip_s` of an idle instance, a scale-down nothing; one move per window (one
action per interval). `plan` is exactly optimal over that model (tests/test_capacity.py checks it against every
static split and random feasible paths). `PlanFollower` plays a plan in the real episode, starting each boot a cold
start ahead; `TrueFutureMPC` re-plans every interval over `horizon` windows from the run's true fluid state.
`ForecastMPC` is the same MPC on what a controller can know (the calendar curve x the measured rate), not a
hindsight row: a teacher for capacity_learned's DAgger that the learner can imitate.
"""

from __future__ import annotations

import math

import numpy as np
from pdgym.envs.sim.capacity import CapacityModel, CapacityRun
from pdgym.envs.sim.fluid import FluidCluster

from .capacity_rules import CapacityRule, toward


def transition_costs(model: CapacityModel, configs: np.ndarray) -> np.ndarray:
    """cost[a, b] of moving from configuration a to b in one window (inf where one action cannot)."""
    cfg, r = model.cfg, model.rates
    gp, gd = r.gpus_prefill, r.gpus_decode
    dp = configs[None, :, 0] - configs[:, None, 0]
    dd = configs[None, :, 1] - configs[:, None, 1]
    cost = np.full(dp.shape, np.inf)
    cost[(dp == 0) & (dd == 0)] = 0.0
    cost[(dp == 1) & (dd == 0)] = cfg.price_per_gpu_s * model.cold_s * gp
    cost[(dp == 0) & (dd == 1)] = cfg.price_per_gpu_s * model.cold_s * gd
    cost[((dp == -1) & (dd == 0)) | ((dp == 0) & (dd == -1))] = 0.0
    flip = ((dp == 1) & (dd == -1)) | ((dp == -1) & (dd == 1))
    cost[flip] = cfg.price_per_gpu_s * cfg.flip_s * max(gp, gd)
    return cost


def window_table(model: CapacityModel, arrivals: np.ndarray, configs: np.ndarray,
                 fluid: FluidCluster | None = None) -> np.ndarray:
    """r[w, g]: window w's reward under configuration g held all along (arrivals: sub-steps x classes, from the
    window's start); `fluid`: a batched cluster to start from (MPC: the true state), else an empty one."""
    cfg, r = model.cfg, model.rates
    fl = fluid if fluid is not None else FluidCluster(r, (len(configs),), cfg.max_wait_s)
    n_p, n_d = configs[:, 0], configs[:, 1]
    gpus = n_p * r.gpus_prefill + n_d * r.gpus_decode
    n_w = math.ceil(arrivals.shape[0] / model.substeps)
    out = np.empty((n_w, len(configs)))
    for w in range(n_w):
        good = np.zeros(len(configs))
        rows = arrivals[w * model.substeps:(w + 1) * model.substeps]
        for a in rows:
            good += fl.step(np.broadcast_to(a, (len(configs), a.shape[0])), n_p, n_d, cfg.substep_s).sum(-1)
        out[w] = good - cfg.price_per_gpu_s * gpus * cfg.substep_s * len(rows)
    return out


def plan(table: np.ndarray, cost: np.ndarray, start: int) -> tuple[np.ndarray, float]:
    """The best path of configurations over the windows of `table` from configuration `start` (its first window
    already one move away): (indices per window, its value)."""
    n_w, n_g = table.shape
    value = table[0] - cost[start]
    back = np.zeros((n_w, n_g), int)
    for w in range(1, n_w):
        cand = value[:, None] - cost  # from a (rows) to b (columns)
        back[w] = cand.argmax(0)
        value = table[w] + cand.max(0)
    path = np.empty(n_w, int)
    path[-1] = int(value.argmax())
    for w in range(n_w - 1, 0, -1):
        path[w - 1] = back[w, path[w]]
    return path, float(value.max())


def path_value(table: np.ndarray, cost: np.ndarray, start: int, path) -> float:
    """The value of a path of configurations in the DP's model (-inf if a move is not one action)."""
    prev, total = start, 0.0
    for w, g in enumerate(path):
        total += table[w, g] - cost[prev, g]
        prev = g
    return total


class PlanFollower(CapacityRule):
    """Plays a plan of serving configurations (one per window): boots a cold start ahead, flips and scales down
    when the window comes."""

    name = "plan"

    def __init__(self, targets: np.ndarray | None = None):
        super().__init__()
        self.targets = targets

    def target(self, run: CapacityRun, w: int) -> tuple[int, int]:
        t = self.targets[min(w, len(self.targets) - 1)]
        return int(t[0]), int(t[1])

    def act(self, run):
        w = run.interval
        k = math.ceil(run.model.cold_s / run.cfg.interval_s)
        p0, d0 = self.target(run, w)
        pa, da = self.target(run, w + k)
        r = run.rates
        tp, td = max(p0, pa), max(d0, da)
        if tp * r.gpus_prefill + td * r.gpus_decode > run.cfg.gpu_budget:
            tp, td = p0, d0
        return toward(run, tp, td)


class DPHindsight(PlanFollower):
    """The DP plan over the whole day with its true arrivals (computed at reset)."""

    name = "dp_hindsight"

    def reset(self, run):
        model = run.model
        configs = model.configs()
        table = window_table(model, run.traffic.arrivals, configs)
        start = _config_index(configs, run.count("P"), run.count("D"))
        path, self.value = plan(table, transition_costs(model, configs), start)
        self.targets = configs[path]


class TrueFutureMPC(PlanFollower):
    """Every interval: the DP over the next `horizon` windows from the run's true fluid state, with the true
    arrivals; the first window's configuration (and the one a cold start ahead) is the target."""

    name = "mpc_true"

    def __init__(self, horizon: int = 12):
        super().__init__()
        self.horizon = horizon

    def reset(self, run):
        self.configs = run.model.configs()
        self.cost = transition_costs(run.model, self.configs)

    def act(self, run):
        model, fl = run.model, run.fluid
        g = len(self.configs)
        batch = FluidCluster(run.rates, (g,), run.cfg.max_wait_s)
        for name in ("pq_req", "pq_tok", "dq", "dq_ok", "dr", "dr_ok"):
            setattr(batch, name, np.broadcast_to(getattr(fl, name), (g,) + getattr(fl, name).shape).copy())
        batch._tau = np.full(g, float(np.mean(fl._tau)))
        arr = self.future(run)
        if arr.shape[0] == 0:
            return toward(run, run.count("P"), run.count("D"), allow_up=False)
        table = window_table(model, arr, self.configs, batch)
        cp = run.count("P") + run.pending("P")
        cd = run.count("D") + run.pending("D")
        start = _config_index(self.configs, cp, cd)
        path, _ = plan(table, self.cost, start)
        self.targets = self.configs[path]
        k = math.ceil(model.cold_s / run.cfg.interval_s)
        p0, d0 = (int(x) for x in self.targets[0])
        pa, da = (int(x) for x in self.targets[min(k, len(path) - 1)])
        tp, td = max(p0, pa), max(d0, da)
        r = run.rates
        if tp * r.gpus_prefill + td * r.gpus_decode > run.cfg.gpu_budget:
            tp, td = p0, d0
        return toward(run, tp, td)


    def future(self, run) -> np.ndarray:
        """The arrivals it plans on (sub-steps x classes): the true ones."""
        return run.traffic.arrivals[run.k:run.k + self.horizon * run.model.substeps]


class ForecastMPC(TrueFutureMPC):
    """The same MPC on what a controller can know (not a hindsight row): the calendar's diurnal curve, scaled to
    the rate measured in the last interval (so a running burst persists), split by its measured mix; bursts to come
    are unknown. A teacher whose labels the learner, which sees the same forecast, can imitate."""

    name = "mpc_forecast"

    def future(self, run) -> np.ndarray:
        tr, dt = run.cfg.traffic, run.cfg.substep_s
        n = min(self.horizon * run.model.substeps, run.traffic.steps - run.k)
        t = (run.k + np.arange(n) + 0.5) * dt
        cal = 1.0 + tr.diurnal_amp * np.sin(2 * np.pi * (t / tr.duration_s - tr.diurnal_phase))
        now = 1.0 + tr.diurnal_amp * math.sin(2 * math.pi * (run.now / tr.duration_s - tr.diurnal_phase))
        arr = run.last["arrivals"] / run.cfg.interval_s if run.interval else None
        total = float(arr.sum()) if arr is not None else tr.base_rps * now
        share = float(arr[1] / max(total, 1e-9)) if arr is not None and total > 0 else tr.mix
        rate = total / max(now, 1e-9) * cal
        return np.stack([rate * (1 - share), rate * share], axis=1) * dt


def _config_index(configs: np.ndarray, p: int, d: int) -> int:
    """The configuration nearest (p, d) (the fleet may hold one the budget's list has, always, when masks held)."""
    return int(np.argmin(np.abs(configs[:, 0] - p) + np.abs(configs[:, 1] - d)))


HINDSIGHT_ROWS = {c.name: c for c in (DPHindsight, TrueFutureMPC)}
MPC_TEACHERS = {c.name: c for c in (TrueFutureMPC, ForecastMPC)}  # capacity_learned's dagger teachers
