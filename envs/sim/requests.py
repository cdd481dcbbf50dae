"""Struct-of-arrays request table: one row per request, every timestamp a metric needs.

Arrays rather than objects keep per-request state cheap to update in the event loop
and make the final per-request DataFrame a zero-copy view. The life-cycle transitions
(buffer, dispatch, token, admit to decode, preempt, requeue, finish, reject) are methods
here, so every instance type moves a request the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Life-cycle states (`state`): a request is in exactly one at a time.
NEW, BUFFERED, DISPATCHED, PREFILL, TRANSFER, POOL, DECODE, WAITING, FINISHED, REJECTED = range(10)
STATE_NAMES = ("new", "buffered", "dispatched", "prefill", "transfer", "pool", "decode", "waiting",
               "finished", "rejected")

# Why a request was rejected (`reason`); 0 = not rejected.
# slo: rejected by admission control because it could not meet its SLO (Conductor-style early rejection)
REASONS = ("", "flow_control", "kv_exhausted", "stalled", "horizon", "policy", "slo")


def reason_code(name: str) -> int:
    """Code of a rejection reason; unknown names are a programming error in a policy."""
    try:
        return REASONS.index(name)
    except ValueError:
        raise ValueError(f"reject reason {name!r} unknown; allowed: {', '.join(REASONS[1:])}") from None


class RequestTable:
    """All requests of a run. Times are seconds of simulated time, NaN until they happen."""

    def __init__(self, prompt: np.ndarray, output: np.ndarray, prefix_key: np.ndarray,
                 prefix_len: np.ndarray, cls: np.ndarray | None = None, predicted: np.ndarray | None = None):
        n = len(prompt)
        self.n = n
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.output = np.asarray(output, dtype=np.int64)  # hidden from policies unless cfg.oracle
        self.cls = np.zeros(n, dtype=np.int8) if cls is None else np.asarray(cls, dtype=np.int8)  # class code
        # predicted output length at arrival (prediction.py); None without a predictor
        self.predicted = None if predicted is None else np.asarray(predicted, dtype=np.int64)
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
        # prefix-block hashes (flat, CSR: request i's are block_ids[block_off[i]:block_off[i + 1]]); None without
        self.block_ids: np.ndarray | None = None
        self.block_off: np.ndarray | None = None
        self.block_next: np.ndarray | None = None  # per position: next request using that block (belady only)
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

    # ------------------------------------------------------------------ transitions
    def enter_buffer(self, rid: int, now: float) -> None:
        """New, bounced or preempted: held by the prefill scheduler from `now`."""
        self.state[rid] = BUFFERED
        self.buf_t[rid] = now

    def leave_buffer(self, rid: int, now: float, inst: int) -> None:
        """Dispatched to instance `inst` (on the wire until it arrives)."""
        if math.isnan(self.dispatch[rid]):
            self.dispatch[rid] = now
        self.sched_wait[rid] += now - self.buf_t[rid]
        self.prefill_inst[rid] = inst
        self.state[rid] = DISPATCHED

    def start_prefill(self, rid: int, now: float) -> None:
        """Its first prefill pass starts (later passes and recomputes keep the first start)."""
        if math.isnan(self.prefill_start[rid]):
            self.prefill_start[rid] = now
            self.device_wait[rid] += now - self.dev_arrive[rid]

    def produce_token(self, rid: int, now: float) -> None:
        """A prefill pass produced its next output token (the first, or the one after a recompute)."""
        if math.isnan(self.first_token[rid]):
            self.first_token[rid] = now
        else:
            self.itl_max[rid] = max(self.itl_max[rid], now - self.last_tok[rid])
        self.last_tok[rid] = now
        self.done[rid] += 1

    def admit_decode(self, rid: int, now: float, step: int) -> int:
        """Starts decoding after step `step` of its engine; returns the step that gives its last token."""
        self.state[rid] = DECODE
        self.decode_admit[rid] = now
        self.admit_step[rid] = step
        self.done_at_admit[rid] = self.done[rid]
        fs = step + int(self.output[rid] - self.done[rid])
        self.finish_step[rid] = fs
        return fs

    def preempt(self, rid: int, step: int) -> None:
        """Stopped at step `step` of its engine: it keeps the tokens decoded so far; its finish is void."""
        self.done[rid] = self.done_at_admit[rid] + (step - self.admit_step[rid])
        self.finish_step[rid] = -1  # invalidates its finish bucket entry
        self.preemptions[rid] += 1

    def requeue(self, rid: int) -> None:
        """Its KV is gone: the prefill must recompute prompt + produced tokens (no cache credit)."""
        self.work[rid] = self.prompt[rid] + self.done[rid]
        self.cached[rid] = 0

    def complete(self, rid: int, now: float) -> None:
        self.state[rid] = FINISHED
        self.finish[rid] = now

    def reject(self, rid: int, code: int, now: float) -> None:
        self.state[rid] = REJECTED
        self.reason[rid] = code
        self.finish[rid] = now


class IdLog(Sequence):
    """Request ids in the order they happened (`sim.completed`: finished ids in completion order).

    A read-only sequence over a preallocated id array (8 bytes an id) rather than a list of Python ints (~40
    bytes an id, and the ints, kept alive between freed event objects, pinned the allocator's pages: RSS after a
    1M-request run -25 MB). An item is an int, a slice a read-only array view (`req.done[sim.completed[k:]]`
    indexes with it directly). The ids are intp, NumPy's index type, not int32: an int32 index array makes
    every fancy index cast it first (PhaseBatching's reward indexes five columns with the newly finished ids:
    +4.3% instructions per env step with int32, for 4 MB at 1M requests)."""

    def __init__(self, n: int):
        self._ids = np.empty(n, dtype=np.intp)
        self._n = 0

    def append(self, rid: int) -> None:
        self._ids[self._n] = rid
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def __iter__(self):  # Python ints, without Sequence's item-by-item indexing
        return iter(self._ids[:self._n].tolist())

    def __getitem__(self, key):
        ids = self._ids[:self._n]
        if isinstance(key, slice):
            view = ids[key]
            view.flags.writeable = False
            return view
        return int(ids[key])

    def __repr__(self) -> str:
        return f"IdLog({self[:].tolist()})"
