"""State of the three kinds of instance. The event loop in cluster.py drives them.

Per-DP-unit quantities are NumPy vectors updated incrementally, so the barrier (max over
units) and the load views policies read cost O(1) Python work per pass.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np


class GrowingArray:
    """An append-only float64 vector (step end times) with amortised O(1) appends."""

    __slots__ = ("data", "n")

    def __init__(self, capacity: int = 1024):
        self.data = np.empty(capacity)
        self.n = 0

    def append(self, x: float) -> None:
        if self.n == len(self.data):
            self.data = np.concatenate([self.data, np.empty(len(self.data))])
        self.data[self.n] = x
        self.n += 1


class PrefixCache:
    """Per-DP-unit LRU set of prefix keys: a hit means the prefix's KV is already on that unit."""

    __slots__ = ("entries", "keys")

    def __init__(self, entries: int):
        self.entries = entries
        self.keys: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.keys

    def touch(self, key: int) -> None:
        self.keys[key] = None
        self.keys.move_to_end(key)
        if len(self.keys) > self.entries:
            self.keys.popitem(last=False)


class PrefillInstance:
    """A non-preemptive batch processor of D DP units behind one barrier.

    Each DP unit has a FIFO device queue the scheduler cannot reorder; a pass takes up to
    `chunk_tokens` tokens per unit from its queue head (long prompts span several passes).
    """

    def __init__(self, idx: int, dp: int, chunk_tokens: int, cost, cache_entries: int, batch_form_s: float = 0.0,
                 dp_dispatch: str = "least_loaded"):
        self.idx = idx
        self.dp = dp
        self.chunk_tokens = chunk_tokens
        self.cost = cost
        self.up = True  # ground truth; the scheduler sees sim.prefill_healthy
        self.busy = False
        self.epoch = 0  # bumped on failure so a lost pass's end event is ignored
        self.queues = [deque() for _ in range(dp)]
        self.queued_tokens = np.zeros(dp, dtype=np.int64)  # R_queued: on the device, not in a pass
        self.inflight_tokens = np.zeros(dp, dtype=np.int64)  # dispatched, still on the wire
        self.running_tokens = np.zeros(dp, dtype=np.int64)  # tokens of the pass in progress
        self.reported = np.zeros(dp, dtype=np.int64)  # EndForward payload: tokens left per unit at the pass end
        self.batch_form_s = batch_form_s  # hold before a pass that continues queued work (config.py)
        self.dp_dispatch = dp_dispatch  # unit for a request sent without one (config.py)
        self.rr_unit = 0
        self.depth = 0  # requests on the wire, queued or in the pass
        self.pass_start = 0.0
        self.pass_end = 0.0
        self.last_fwd = float("nan")
        self.n_passes = 0
        self.completing: list[int] = []  # requests whose prefill ends with the current pass
        self.lost: list[int] = []  # requests stranded by a failure, returned once it is detected
        self.caches = [PrefixCache(cache_entries) for _ in range(dp)] if cache_entries > 0 else None

    def pick_unit(self) -> int:
        """The engine's own DP unit for a request the scheduler sent without one."""
        if self.dp_dispatch == "round_robin":
            self.rr_unit = (self.rr_unit + 1) % self.dp
            return (self.rr_unit - 1) % self.dp
        return int(np.argmin(self.load_tokens()))

    def load_tokens(self) -> np.ndarray:
        """Tokens each DP unit still has to process (wire + queue + current pass)."""
        return self.queued_tokens + self.inflight_tokens + self.running_tokens


class DecodeInstance:
    """D decode workers stepping in lock step; sticky assignment, per-worker batch and KV limits."""

    def __init__(self, idx: int, dp: int, batch_limit: int, kv_cap: int, cost):
        self.idx = idx
        self.dp = dp
        self.cost = cost
        self.batch_limit = batch_limit
        self.kv_cap = np.full(dp, kv_cap, dtype=np.int64)
        self.batch = np.zeros(dp, dtype=np.int64)
        self.kv = np.zeros(dp, dtype=np.int64)  # sum over active requests of prompt + done
        self.active = [set() for _ in range(dp)]
        self.steps = 0  # completed steps
        self.step_t = GrowingArray()  # step_t.data[s - 1] = end time of step s
        self.gap = GrowingArray()  # gap.data[s - 1] = end of step s minus end of step s - 1
        self.buckets: dict[int, list[int]] = {}  # finish step -> requests (lazy deletion on preempt)
        self.busy = False
        self.step_start = 0.0
        self.step_end = 0.0
        self.zeros = np.zeros(dp)

    @property
    def n_active(self) -> int:
        return int(self.batch.sum())

    def free_slots(self) -> np.ndarray:
        return self.batch_limit - self.batch


class ColocatedUnit:
    """One DP unit of a colocated instance: slots, a KV budget and both phases."""

    def __init__(self, slots: int, kv_cap: int, chunk_tokens: int):
        self.slots = slots
        self.kv_cap = kv_cap
        self.chunk_tokens = chunk_tokens  # token budget of one iteration
        self.waiting: deque[int] = deque()  # arrived, not yet admitted (FIFO)
        self.prefilling: list[int] = []  # admitted, prompt not finished (admission order)
        self.decoding: set[int] = set()
        self.n_decoding = 0
        self.kv_used = 0  # reserved KV: context + 1 of prefilling requests, load of decoding ones
        self.decode_kv = 0  # KV read by one decode iteration (sum of decoding loads)
        self.steps = 0  # decode iterations completed (each gives every decoding request a token)
        self.step_t = GrowingArray()
        self.gap = GrowingArray()
        self.buckets: dict[int, list[int]] = {}

    @property
    def n_running(self) -> int:
        return len(self.prefilling) + self.n_decoding

    @property
    def free_slots(self) -> int:
        return self.slots - self.n_running


class ColocatedInstance:
    """An engine running both phases on `dp` units behind one barrier (DP 1 by default)."""

    def __init__(self, idx: int, dp: int, slots: int, kv_cap: int, chunk_tokens: int, cost):
        self.idx = idx
        self.dp = dp
        self.cost = cost
        self.units = [ColocatedUnit(slots, kv_cap, chunk_tokens) for _ in range(dp)]
        self.busy = False
        self.iter_start = 0.0
        self.iter_end = 0.0
        self.n_iters = 0
        self.plan: list = []  # per unit: (pieces, decode flag) of the iteration in progress
