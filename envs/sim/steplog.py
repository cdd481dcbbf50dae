"""The step table while a run is going: one row per pass, kept in compact typed chunks.

A run records about 1.35 passes per request (DeepSeek-V3 3P x DP8 + 1D x DP32 on Azure traffic).
As a list of tuples each row costs ~380 bytes of Python objects (a tuple and ten boxed numbers),
which made the step log half of a 1M-request run's memory. Here rows collect in a short list and
move every CHUNK rows into one NumPy structured array (65 bytes a row, ~0.35 us a row to convert),
so the Python-object part never exceeds one chunk. Each chunk lives in its own anonymous memory map:
merging the chunks into columns unmaps them one by one, so their pages go back to the system at once.
Heap chunks (malloc) left that memory as holes the allocator kept: at 1M requests the merged step table
was resident twice, ~90 MB more at the peak (bench_memory).
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING

import numpy as np

from .events import PassKind

if TYPE_CHECKING:  # pandas loads when a table is built (0.37 s of import a Gymnasium user need not pay)
    import pandas as pd

COLUMNS = ("t", "dur", "kind", "inst", "tokens", "reqs", "kv_max", "kv_min", "idle_frac", "util")
CHUNK = 8192


def row_dtype(float_reqs: bool) -> np.dtype:
    """The row type (65 bytes packed). `reqs` counts requests (int) except on colocated engines, whose passes
    record it as a float (prefill and decode requests summed from unit vectors): the table keeps the type a
    run gives it. The narrow integers hold what cannot outgrow them: `kind` a PassKind (0-2), `inst` an
    instance index, `reqs` requests in one pass (at most the run's request count); a value that did not
    fit would raise when its chunk is converted, never wrap. KV tokens keep 64 bits. The tables written
    to disk show the 64-bit types (SimResult.step_table)."""
    kinds = ("f8", "f8", "i1", "i4", "f8", "f8" if float_reqs else "i4", "i8", "i8", "f8", "f8")
    return np.dtype(list(zip(COLUMNS, kinds)))


def _merged(parts: list, kept: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    """One contiguous array per kept column from `parts` (merged columns and chunks, in order; each column as long
    as its parts' pieces), filled chunk by chunk: each part is dropped from `parts` once copied, so a chunk's
    memory map is unmapped at once and the rows are never held twice."""
    cols = {c: np.empty(sum(len(part[c]) for part in parts), t) for c, t in kept.items()}
    at = dict.fromkeys(kept, 0)
    while parts:
        part = parts.pop(0)
        for c in kept:
            k = len(part[c])
            cols[c][at[c]:at[c] + k] = part[c]
            at[c] += k
        del part
    return cols


class StepLog:
    """Append-only pass rows (`append(row)`, a tuple in COLUMNS order); `frame()` gives the DataFrame."""

    def __init__(self, float_reqs: bool = False):
        self.dtype = row_dtype(float_reqs)
        self._rows: list[tuple] = []
        self._chunks: list[np.ndarray] = []
        self._n_chunked = 0
        self._columns: dict[str, np.ndarray] | None = None  # the merged rows, once frame() has run

    def append(self, row: tuple) -> None:
        rows = self._rows
        rows.append(row)
        if len(rows) >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        rows = self._rows
        if rows:
            block = np.array(rows, dtype=self.dtype)  # the fast conversion; freed at once, so a heap hole reused
            chunk = np.frombuffer(mmap.mmap(-1, block.nbytes), dtype=self.dtype)  # unmapped with its last view
            chunk[...] = block
            self._chunks.append(chunk)
            self._n_chunked += len(rows)
            self._rows = []

    def __len__(self) -> int:
        return self._n_chunked + len(self._rows)

    def columns(self) -> dict[str, np.ndarray]:
        """Every row so far, one contiguous array per column (no pandas). The chunks are merged into those
        columns once and then dropped; the arrays are never written again (rows recorded later go to new
        chunks and a later call merges into new arrays), so a caller may keep them as a snapshot."""
        self._flush()
        if self._columns is None or self._chunks:
            parts = ([self._columns] if self._columns is not None else []) + self._chunks
            self._chunks = []
            self._columns = _merged(parts, self._kept())
        return self._columns

    def _kept(self) -> dict[str, np.dtype]:
        """The columns a chunk holds, with their types."""
        return {c: self.dtype[c] for c in COLUMNS}

    def frame(self) -> pd.DataFrame:
        """Every row so far as a DataFrame sharing columns() (the table is not held twice)."""
        import pandas as pd

        return pd.DataFrame(self.columns(), copy=False)


class SummaryLog(StepLog):
    """The step log of a run nobody reads pass by pass (Simulator(step_log=False)): only what summary() reads,
    ~25 bytes a pass instead of 65 (at 1M requests ~55 MB less at the peak, bench_memory). Rows arrive as in
    StepLog; each chunk keeps `dur` and `idle_frac` of every pass, kv_max - kv_min of the decode passes and of the
    colocated ones (in order), and `util` of the passes with prefill work (not decode, util > 0): exactly the
    selections summary() takes from the full columns, so its figures are the same numbers bit for bit."""

    def _flush(self) -> None:
        rows = self._rows
        if rows:
            block = np.array(rows, dtype=self.dtype)
            kind = block["kind"]
            gap = block["kv_max"] - block["kv_min"]
            parts = {"dur": block["dur"], "idle_frac": block["idle_frac"],
                     "dec_gap": gap[kind == PassKind.DECODE], "coloc_gap": gap[kind == PassKind.COLOCATED],
                     "pre_util": block["util"][(kind != PassKind.DECODE) & (block["util"] > 0)]}
            # one anonymous map per chunk, as StepLog's: merged and unmapped, its pages go back at once
            buf = mmap.mmap(-1, sum(v.nbytes for v in parts.values()) + 8)
            chunk, at = {}, 0
            for k, v in parts.items():  # every part 8-byte items: each offset stays aligned
                chunk[k] = np.frombuffer(buf, dtype=v.dtype, count=len(v), offset=at)
                chunk[k][...] = v
                at += v.nbytes
            self._chunks.append(chunk)
            self._n_chunked += len(rows)
            self._rows = []

    def _kept(self) -> dict[str, np.dtype]:
        """The kept parts (columns() gives each as one contiguous array of the rows so far)."""
        return {"dur": np.dtype(np.float64), "idle_frac": np.dtype(np.float64), "dec_gap": np.dtype(np.int64),
                "coloc_gap": np.dtype(np.int64), "pre_util": np.dtype(np.float64)}

    def frame(self):
        raise RuntimeError("this run kept no step table (Simulator(step_log=False)): only its summary() figures")
