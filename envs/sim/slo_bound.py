"""An upper bound on weighted SLO attainment that holds for any policy (issue 42; ALGORITHMS.md section 10): the other
side of the bracket a hindsight row gives from below.

A request attains its SLO only if its prefill ends within its TTFT SLO of its arrival, so its prompt work is done
inside its window [a_i, d_i = a_i + ttft_i]. No pass does prompt tokens faster than a full chunk on every DP unit
with no attention term (the cost model's per-token time falls as a pass fills, and the attention and decode terms
only add), so the front tier (prefill instances, or colocated ones) processes at most R prompt tokens a second,
R = sum over its instances of dp x chunk / pass_time(a full chunk on every unit). Choosing which requests attain
is then at best a fractional knapsack: values w_i, sizes p_i (prompt tokens), and

- `knapsack`: one constraint, the capacity of the run's whole span, R x (max d_i - min a_i): the greedy by
  w_i / p_i is optimal for the relaxation (Dantzig);
- `windows`: the same constraint on every window [s, t] of a grid (s among the arrival times, t among the
  deadlines): the requests inside a window fit in R x (t - s). A linear program (scipy's HiGHS); every window's
  constraint holds for any schedule, so it is still a bound, and a tighter one (`knapsack` is its one widest
  window). Bursts are what it sees and the single span does not.

The TPOT side (decode) is left out: a relaxation may drop constraints. Prompt tokens a prefix cache would serve
are not modelled: the bound refuses workloads with shared prefixes. The value is a fraction of the run's total
weight, the same denominator as `slo_attainment` (slo.py).
"""

from __future__ import annotations

import numpy as np

from .config import ConfigError

BOUNDS = ("knapsack", "windows")


def front_rate(sim) -> float:
    """Prompt tokens a second the front tier can process at most (module docstring: R)."""
    out = 0.0
    for inst in sim.prefill or sim.colocated:
        chunk = inst.chunk_tokens if hasattr(inst, "chunk_tokens") else inst.units[0].chunk_tokens
        z = np.zeros(inst.dp)
        out += inst.dp * chunk / float(inst.cost.pass_time(np.full(inst.dp, float(chunk)), z, z, z))
    return out


def knapsack_bound(weight: np.ndarray, size: np.ndarray, capacity: float) -> float:
    """max sum w_i x_i / sum w_i subject to sum p_i x_i <= capacity, 0 <= x_i <= 1 (greedy by density)."""
    weight, size = np.asarray(weight, float), np.asarray(size, float)
    order = np.argsort(-weight / np.maximum(size, 1e-12), kind="stable")
    used = np.cumsum(size[order])
    full = used <= capacity
    got = weight[order][full].sum()
    k = int(full.sum())
    if k < len(order):  # the first item that does not fit, fractionally
        left = capacity - (used[k - 1] if k else 0.0)
        got += weight[order[k]] * max(left, 0.0) / size[order[k]]
    return float(got / weight.sum())


def windows_bound(arrival: np.ndarray, deadline: np.ndarray, weight: np.ndarray, size: np.ndarray, rate: float,
                  grid: int = 48) -> float:
    """max sum w_i x_i / sum w_i subject to, for each window [s, t] of the grid, the work of the requests inside
    it fitting in rate x (t - s), 0 <= x_i <= 1 (module docstring)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    q = np.linspace(0.0, 1.0, grid)
    starts = np.unique(np.quantile(arrival, q, method="lower"))
    ends = np.unique(np.quantile(deadline, q, method="higher"))
    s, t = np.meshgrid(starts, ends, indexing="ij")
    keep = t > s
    s, t = s[keep], t[keep]
    inside = (arrival[None, :] >= s[:, None]) & (deadline[None, :] <= t[:, None])
    a_ub = csr_matrix(inside * np.asarray(size, float)[None, :])
    res = linprog(-np.asarray(weight, float), A_ub=a_ub, b_ub=rate * (t - s), bounds=(0.0, 1.0), method="highs")
    if res.status != 0:
        raise RuntimeError(f"windows bound: the linear program ended with status {res.status} ({res.message})")
    return float(-res.fun / np.sum(weight))


def attainment_bound(sim, kind: str = "windows") -> float:
    """The bound `kind` (BOUNDS) on the weighted SLO attainment of `sim`'s run, read from its requests and cluster
    once the run is over (an open loop's arrivals come from the seed alone, so any policy's run gives them)."""
    if kind not in BOUNDS:
        raise ConfigError(f"bound: got {kind!r}; allowed: {', '.join(BOUNDS)}")
    if not sim.cfg.workload.classes:
        raise ConfigError("workload.classes: the upper-bound row weighs SLO classes and the scenario has none; "
                          "allowed: a scenario with workload.classes (SLO tiers)")
    if sim.cfg.workload.arrival == "closed":
        raise ConfigError("workload.arrival: the upper-bound row needs arrivals no policy moves; allowed: an open "
                          "loop (a closed loop's arrivals follow its completions)")
    req = sim.req
    if req.block_ids is not None or (req.prefix_len > 0).any():
        raise ConfigError("workload: the upper-bound row counts every prompt token as work and these requests share "
                          "prefixes a cache could serve; allowed: a workload without prefix blocks or prefix groups")
    arrival = req.arrival
    if not np.isfinite(arrival).all():
        raise RuntimeError("attainment_bound: the run is not over (requests without an arrival time)")
    weight = sim.classes.weight[req.cls]
    deadline = arrival + sim.classes.ttft_s[req.cls]
    size = req.prompt.astype(float)
    rate = front_rate(sim)
    if kind == "knapsack":
        return knapsack_bound(weight, size, rate * float(deadline.max() - arrival.min()))
    return windows_bound(arrival, deadline, weight, size, rate)
