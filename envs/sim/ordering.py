"""Queue disciplines: the order in which the engine's waiting queues are served (ALGORITHMS.md section 9).

Three queues are served in arrival order by default (`queue.order: fcfs`, the engines' own behaviour and every
golden result): the prefill scheduler's buffer (`sim.buffer`: what SBS / PBAA release first, what a dispatcher
reads first), the waiting queue of a colocated unit (what a batching policy admits first; no overtaking), and
the decode pool (`sim.pool`: what a decode router admits first). Another discipline keeps each of them sorted by
its key, smallest first, so every dispatcher, router and batching policy composes with it unchanged (SBS + EDF
release order, BR-0 admission by deadline, ...). Like vLLM's `--scheduling-policy`, it is an engine setting
(`queue.order`), not a fourth decision point:

    fcfs           arrival order;
    priority       class order (the first class of workload.classes first), then arrival;
    edf            ascending TTFT deadline a_i + ttft_k(i);
    least_slack    ascending deadline - estimated prefill time of the request's remaining prompt work (the cost
                   model's seconds per token of a full chunk on the front instances): d_i - now - p_i orders as
                   d_i - p_i, now being common;
    sjf            ascending predicted output length (needs workload.predictor), then arrival;
    priority_sjf   class order, then the predicted output length within a class (needs workload.predictor);
    ltr            learning-to-rank scheduling: sjf, except that a request waiting longer than `queue.starve_s`
                   is promoted ahead of every unpromoted one (the starvation guard; promoted ones in arrival order);
    vllm_priority  priority, and a waiting request that outranks running ones and does not fit preempts the
                   lowest-ranked of them (its KV freed, its context recomputed when it runs again): on a colocated
                   unit (colocated.py) and on a decode instance for the first pooled request (decode.py);
    sjf_oracle     hindsight: ascending true output length (needs `oracle: true`; a row that bounds sjf).

A discipline reads only what the view exposes (class, arrival, predicted length, remaining work) except
sjf_oracle, which is refused unless the run is an oracle run.

A discipline of your own is `queue.order=module:Class` (envs/sim/external.py: imported only because the command
line or a Python call named it), a subclass of QueueOrder defining `key(rid)`, smaller served first, from
`self.req` (the policies' read-only request view: true output lengths hidden unless oracle: true),
`self.classes` and `self.sim.now`; `dynamic = True` when the key changes with time, `needs_predictor = True` when
it reads `req.predicted`. docs/concepts.md, "Add a policy", has one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .external import import_class, is_external
from .registry import Registry
from .validation import ConfigError, check, is_num

__all__ = ["ORDERS", "OrderedQueue", "QueueConfig", "QueueOrder", "make_order", "new_queue"]


@dataclass
class QueueConfig:
    """`queue`: the engine's queue discipline (admission control is a prefill policy: baselines/slo_admission.py)."""

    order: str = "fcfs"  # a name in ORDERS (module docstring), or module:Class (a QueueOrder of your own)
    starve_s: float = 5.0  # ltr: a request waiting longer than this is promoted

    def validate(self, key: str = "queue") -> None:
        check(self.order in ORDERS or is_external(self.order), f"{key}.order",
              f"got {self.order!r}; allowed: {', '.join(ORDERS.names())}, or module:Class (a QueueOrder subclass)")
        check(is_num(self.starve_s) and math.isfinite(self.starve_s) and self.starve_s > 0, f"{key}.starve_s",
              f"got {self.starve_s!r}; must be a finite number > 0")


class QueueOrder:
    """Keys of one discipline over a run's requests; smaller is served first."""

    name = "fcfs"
    needs_predictor = False
    dynamic = False  # the key depends on the time (re-sorted at every insertion)
    preempts = False

    def __init__(self, sim, cfg: QueueConfig):
        self.req = sim.req
        self.classes = sim.classes
        self.sim = sim
        self.cfg = cfg

    def key(self, rid: int) -> tuple:  # pragma: no cover - every registered discipline defines it
        raise NotImplementedError

    def sort_dict(self, d: dict) -> None:
        """Re-order `d` (buffer or pool) in place by key (its identity kept: views proxy it)."""
        if len(d) > 1:
            items = sorted(d, key=self.key)
            dict.clear(d)
            dict.update(d, dict.fromkeys(items))

    def sort_deque(self, q: deque) -> None:
        if len(q) > 1:
            items = sorted(q, key=self.key)
            q.clear()
            q.extend(items)


class OrderedQueue(dict):
    """The buffer or the pool under a discipline other than fcfs: a dict kept sorted by the discipline's key at
    every insertion (its identity kept, so the views' read-only proxies follow it)."""

    def __init__(self, order: QueueOrder):
        super().__init__()
        self.order = order

    def __setitem__(self, rid: int, value: None) -> None:
        super().__setitem__(rid, value)
        self.order.sort_dict(self)


def new_queue(order: QueueOrder | None) -> dict:
    """An empty buffer / pool: a plain dict (arrival order) for fcfs, else an OrderedQueue."""
    return {} if order is None else OrderedQueue(order)


ORDERS: Registry[Callable[..., QueueOrder]] = Registry("queue.order")
ORDERS.register("fcfs")(QueueOrder)


@ORDERS.register("priority")
class Priority(QueueOrder):
    def key(self, rid: int) -> tuple:
        return int(self.req.cls[rid]), float(self.req.arrival[rid]), rid


@ORDERS.register("vllm_priority")
class VllmPriority(Priority):
    preempts = True


@ORDERS.register("edf")
class EDF(QueueOrder):
    def key(self, rid: int) -> tuple:
        r = self.req
        return float(r.arrival[rid]) + float(self.classes.ttft_s[r.cls[rid]]), rid


@ORDERS.register("least_slack")
class LeastSlack(QueueOrder):
    def __init__(self, sim, cfg: QueueConfig):
        super().__init__(sim, cfg)
        self.s_tok = seconds_per_prefill_token(sim)

    def key(self, rid: int) -> tuple:
        r = self.req
        deadline = float(r.arrival[rid]) + float(self.classes.ttft_s[r.cls[rid]])
        return deadline - float(r.work[rid]) * self.s_tok, rid


@ORDERS.register("sjf")
class SJF(QueueOrder):
    needs_predictor = True

    def key(self, rid: int) -> tuple:
        return int(self.req.predicted[rid]), float(self.req.arrival[rid]), rid


@ORDERS.register("priority_sjf")
class PrioritySJF(QueueOrder):
    needs_predictor = True

    def key(self, rid: int) -> tuple:
        r = self.req
        return int(r.cls[rid]), int(r.predicted[rid]), float(r.arrival[rid]), rid


@ORDERS.register("ltr")
class LTR(SJF):
    dynamic = True

    def key(self, rid: int) -> tuple:
        r = self.req
        a = float(r.arrival[rid])
        if self.sim.now - a > self.cfg.starve_s:
            return 0, a, rid
        return 1, int(r.predicted[rid]), rid


@ORDERS.register("sjf_oracle")
class SJFOracle(QueueOrder):
    def key(self, rid: int) -> tuple:
        return int(self.req.output[rid]), float(self.req.arrival[rid]), rid


def seconds_per_prefill_token(sim) -> float:
    """The cost model's seconds per prompt token of a full chunk on one unit of the front instances."""
    inst = (sim.prefill or sim.colocated)[0]
    chunk = inst.chunk_tokens if hasattr(inst, "chunk_tokens") else inst.units[0].chunk_tokens
    dp = inst.dp
    z = np.zeros(dp)
    tok = np.zeros(dp)
    tok[0] = chunk
    attn = tok * chunk / 2.0
    return float(inst.cost.pass_time(tok, attn, z, z)) / chunk


def external_order(name: str) -> type:
    """`queue.order=module:Class`: the imported class, a QueueOrder subclass (one ConfigError line otherwise)."""
    cls = import_class(name, "queue.order", (QueueOrder,), "queue order")
    if not issubclass(cls, QueueOrder):
        raise ConfigError(f"queue.order: {name} does not subclass {QueueOrder.__module__}.QueueOrder")
    return cls


def make_order(sim, cfg: QueueConfig, outside_view: Callable | None = None) -> QueueOrder | None:
    """The run's discipline, or None for fcfs (the engine then touches no queue). A discipline from outside the tree
    is built on `outside_view(sim)` (the engine passes view.OrderView: what policies may read), never the engine."""
    if cfg.order == "fcfs":
        return None
    if is_external(cfg.order):
        cls = external_order(cfg.order)
        if cls.needs_predictor and sim.req.predicted is None:
            raise ConfigError(f"queue.order: {cfg.order} reads the predicted output length and the workload has no "
                              "predictor; set workload.predictor.kind (oracle, lognormal, buckets)")
        if outside_view is None:
            raise ConfigError("queue.order: a module:Class discipline needs the engine's read-only view")
        return cls(outside_view(sim), cfg)
    cls = ORDERS[cfg.order]
    if cls.needs_predictor and sim.req.predicted is None:
        raise ConfigError(f"queue.order: {cfg.order} orders by the predicted output length and the workload has "
                          "no predictor; set workload.predictor.kind (oracle, lognormal, buckets)")
    if cls is SJFOracle and not sim.cfg.oracle:
        raise ConfigError("queue.order: sjf_oracle reads the true output lengths (a hindsight row); it needs "
                          "oracle: true")
    return cls(sim, cfg)
