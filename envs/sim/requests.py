"""Struct-of-arrays request table: one row per request, every timestamp a metric needs.

Arrays rather than objects keep per-request state cheap to update in the event loop
and make the final per-request DataFrame a zero-copy view.
"""

from __future__ import annotations

import numpy as np

# Life-cycle states (`state`): a request is in exactly one at a time.
NEW, BUFFERED, DISPATCHED, PREFILL, TRANSFER, POOL, DECODE, WAITING, FINISHED, REJECTED = range(10)
STATE_NAMES = ("new", "buffered", "dispatched", "prefill", "transfer", "pool", "decode", "waiting",
               "finished", "rejected")

# Why a request was rejected (`reason`); 0 = not rejected.
REASONS = ("", "flow_control", "kv_exhausted", "stalled", "horizon", "policy")


def reason_code(name: str) -> int:
    """Code of a rejection reason; unknown names are a programming error in a policy."""
    try:
        return REASONS.index(name)
    except ValueError:
        raise ValueError(f"reject reason {name!r} unknown; allowed: {', '.join(REASONS[1:])}") from None


class RequestTable:
    """All requests of a run. Times are seconds of simulated time, NaN until they happen."""

    def __init__(self, prompt: np.ndarray, output: np.ndarray, prefix_key: np.ndarray,
                 prefix_len: np.ndarray):
        n = len(prompt)
        self.n = n
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.output = np.asarray(output, dtype=np.int64)  # hidden from policies unless cfg.oracle
        self.prefix_key = np.asarray(prefix_key, dtype=np.int64)
        self.prefix_len = np.asarray(prefix_len, dtype=np.int64)
        nan = np.full(n, np.nan)
        self.arrival = nan.copy()
        self.dispatch = nan.copy()  # first time the scheduler sent it to an instance
        self.prefill_start = nan.copy()  # start of its first prefill pass
        self.first_token = nan.copy()
        self.decode_admit = nan.copy()  # last admission to a decode worker (or colocated decode)
        self.finish = nan.copy()  # finish or rejection time
        self.last_tok = nan.copy()  # time of the latest output token (for inter-token gaps)
        self.buf_t = nan.copy()  # when it last entered the scheduler buffer
        self.dev_arrive = nan.copy()  # when it last reached a device queue
        self.itl_max = np.zeros(n)  # longest gap between two consecutive output tokens
        self.state = np.zeros(n, dtype=np.int8)
        self.reason = np.zeros(n, dtype=np.int8)
        self.done = np.zeros(n, dtype=np.int64)  # output tokens produced so far
        self.work = self.prompt.copy()  # prefill tokens still to compute (prompt + done on recompute)
        self.cached = np.zeros(n, dtype=np.int64)  # prompt tokens served by a prefix-cache hit
        self.prefill_inst = np.full(n, -1, dtype=np.int32)
        self.prefill_dp = np.full(n, -1, dtype=np.int32)
        self.decode_inst = np.full(n, -1, dtype=np.int32)
        self.worker = np.full(n, -1, dtype=np.int32)
        self.admit_step = np.zeros(n, dtype=np.int64)  # decode step count at admission
        self.done_at_admit = np.zeros(n, dtype=np.int64)
        self.finish_step = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.sched_wait = np.zeros(n)  # total time buffered at the scheduler
        self.device_wait = np.zeros(n)  # total time queued on a prefill device before its first pass

    def load(self, rid: int) -> int:
        """KV tokens request `rid` holds while decoding: prompt plus tokens produced so far."""
        return int(self.prompt[rid] + self.done[rid])
