"""Trace files: the shipped traces by name, CSV traces in the Azure or the vidur format, and
Mooncake's JSON lines with prefix-block hashes.

Azure: `TIMESTAMP,ContextTokens,GeneratedTokens` (a numeric TIMESTAMP is seconds, anything else a
date-time); vidur: `num_prefill_tokens,num_decode_tokens[,arrived_at]` (seconds); Mooncake (FAST'25):
one JSON object a line, `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (the hashes of the
prompt's 512-token blocks, `len == ceil(input_length / 512)`). The format is read from the content (a
file whose first character is `{` is JSON lines); a `.csv` / `.jsonl` name that disagrees with it is
refused. The block hashes become two flat arrays (CSR: `block_ids`, `block_off`), never per-request
lists. Any of the three may carry a class label per request (a CSV column / JSON field `class`, a tier's name,
the same column requests.csv writes): it becomes `label_codes` into `label_names` (in order of first
appearance), which `workload.class_by: label` maps onto the configured tiers by name (classes.py).
`read_trace` parses a file once (cached by path, size and mtime) into read-only arrays and rejects a malformed
file with one `ConfigError` line naming the key, the line and the field; how a trace becomes a workload
(windows, rescaling, re-drawn arrival times) is `workload.py`'s business.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import pathlib
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
from pdgym.envs.sim.safe_files import MAX_JSON_DEPTH, check_regular_file, too_deep
from pdgym.envs.sim.validation import ConfigError, check

if TYPE_CHECKING:  # pandas loads when a table is built (0.37 s of import a Gymnasium user need not pay)
    import pandas as pd

__all__ = ["CLASS_COLUMN", "COLUMN_ALIASES", "SHIPPED_TRACES", "Trace", "load_trace", "read_lengths", "read_trace",
           "trace_path"]

SHIPPED_TRACES: dict[str, str] = {
    "azure_conv": "AzureLLMInferenceTrace_conv.csv",
    "azure_code": "AzureLLMInferenceTrace_code.csv",
    "splitwise_conv": "splitwise_conv.csv",
    "mooncake_conv": "mooncake_conversation_trace.jsonl",
}
MOONCAKE_BLOCK_TOKENS = 512  # tokens per hashed prefix block in Mooncake's traces
MAX_TRACE_BYTES = 256 * 2**20  # a trace file larger than this is refused before it is read (the shipped ones: < 4 MB)

CLASS_COLUMN = "class"  # a trace's optional class label (CSV column / JSON-lines field), as in requests.csv
_AZURE_COLS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_VIDUR_COLS = ("num_prefill_tokens", "num_decode_tokens")
_FORMATS = ("need TIMESTAMP,ContextTokens,GeneratedTokens (Azure) or "
            "num_prefill_tokens,num_decode_tokens[,arrived_at] (vidur)")
# names accepted by LengthConfig.column for empirical lengths from a trace
COLUMN_ALIASES = {
    "prompt": "prompt", "ContextTokens": "prompt", "num_prefill_tokens": "prompt",
    "output": "output", "GeneratedTokens": "output", "num_decode_tokens": "output",
}


def trace_path(spec: str | os.PathLike, key: str = "workload.trace") -> pathlib.Path:
    """Resolve a shipped trace name (azure_conv, azure_code, splitwise_conv, mooncake_conv) or a file path."""
    if not isinstance(spec, (str, os.PathLike)) or str(spec) == "":
        raise ConfigError(f"{key}: got {spec!r}; give a trace file (CSV or Mooncake JSON lines) or a shipped name: "
                          f"{', '.join(SHIPPED_TRACES)}")
    if isinstance(spec, str) and spec in SHIPPED_TRACES:
        res = resources.files("pdgym.data").joinpath("traces", SHIPPED_TRACES[spec])
        path = pathlib.Path(str(res))
        check(path.is_file(), key, f"shipped trace {spec!r} is missing from the installation ({path})")
        return path
    s = os.fspath(spec)
    path = pathlib.Path(s).expanduser()
    if path.is_file():
        return path
    looks_like_path = (os.sep in s or "/" in s or s.startswith((".", "~"))
                       or path.suffix.lower() in (".csv", ".jsonl", ".json", ".gz", ".bz2", ".zip", ".xz"))
    if path.exists():
        raise ConfigError(f"{key}: {s!r} is not a file; give a trace file (CSV or Mooncake JSON lines) or a shipped "
                          f"name: {', '.join(SHIPPED_TRACES)}")
    if looks_like_path:
        raise ConfigError(f"{key}: file not found: {s!r} (or use a shipped name: {', '.join(SHIPPED_TRACES)})")
    raise ConfigError(f"{key}: unknown trace {s!r}; shipped names: {', '.join(SHIPPED_TRACES)}, "
                      "or a path to a trace file (CSV or Mooncake JSON lines)")


@dataclass(frozen=True)
class Trace:
    """A parsed trace file: read-only arrays, one entry per row."""

    prompt: np.ndarray  # int64
    output: np.ndarray  # int64
    times: np.ndarray | None  # float64 seconds since the first row of the file, or None
    name: str
    # prefix blocks (Mooncake): the hashes of request i's blocks are block_ids[block_off[i]:block_off[i + 1]]
    block_ids: np.ndarray | None = None  # int64, flat
    block_off: np.ndarray | None = None  # int64 [rows + 1]
    block_tokens: int = 0  # tokens per block (0: no block hashes)
    # class labels (a `class` column): request i's label is label_names[label_codes[i]]
    label_codes: np.ndarray | None = None  # int64 [rows]
    label_names: tuple[str, ...] = ()


MAX_TRACE_TOKENS = 10**9  # tokens in one request's prompt or output


def _int_column(df: pd.DataFrame, col: str, key: str) -> np.ndarray:
    import pandas as pd

    vals = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(vals)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"{key}: non-numeric or missing value {_plain(df[col].iloc[i])} in column {col} at line "
                          f"{i + 2}; token counts must be integers >= 1")
    bad = vals != np.round(vals)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"{key}: non-integer length {_plain(vals[i])} in column {col} at line {i + 2}; "
                          "token counts must be integers >= 1")
    bad = vals < 1
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"{key}: non-positive length {int(vals[i])} in column {col} at line {i + 2}; "
                          "token counts must be integers >= 1")
    bad = vals > MAX_TRACE_TOKENS  # beyond any context (and, far enough, beyond int64: garbage after the cast)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"{key}: length {_plain(df[col].iloc[i])} in column {col} at line {i + 2} is too large; "
                          f"token counts must be integers in [1, {MAX_TRACE_TOKENS:,}]")
    return vals.astype(np.int64)


def _labels(values: list | np.ndarray, key: str, first_line: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """A class label per row (non-empty strings) -> codes into the names, in order of first appearance."""
    for i, v in enumerate(values):
        if not isinstance(v, str) or v.strip() == "":
            raise ConfigError(f"{key}: missing or non-text class label {_plain(v)} in column {CLASS_COLUMN} at line "
                              f"{i + first_line}; every row needs the name of its class")
    import pandas as pd

    codes, names = pd.factorize(np.asarray([v.strip() for v in values], dtype=object))
    codes = codes.astype(np.int64)
    codes.setflags(write=False)
    return codes, tuple(str(n) for n in names)


def _check_times(t: np.ndarray, col: str, key: str) -> None:
    bad = ~np.isfinite(t)
    if bad.any():
        raise ConfigError(f"{key}: missing or invalid time in column {col} at line {int(np.argmax(bad)) + 2}")
    dec = np.diff(t) < 0
    if dec.any():
        i = int(np.argmax(dec)) + 1
        raise ConfigError(f"{key}: timestamps decrease at line {i + 2} (column {col}); "
                          "rows must be sorted by time")


def _timestamp_seconds(col: pd.Series, key: str) -> np.ndarray:
    """Azure TIMESTAMP as seconds since the first row: numbers are seconds, anything else date-times."""
    import pandas as pd

    num = pd.to_numeric(col, errors="coerce")
    if num.notna().any() and num.notna().sum() == col.notna().sum():  # every given value is a number
        t = num.to_numpy(dtype=np.float64, na_value=np.nan)
        return t - t[0]
    try:
        ts = pd.to_datetime(col, format="mixed", utc=True)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ConfigError(f"{key}: cannot parse column TIMESTAMP as seconds or date-times: {_first_line(exc)}") from None
    if ts.isna().any():
        i = int(np.argmax(ts.isna().to_numpy()))
        raise ConfigError(f"{key}: missing or invalid time in column TIMESTAMP at line {i + 2}")
    return (ts - ts.iloc[0]).dt.total_seconds().to_numpy(dtype=np.float64)


def _first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of an exception message, cut to `limit` characters (a one-line file is one 'line')."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first if len(first) <= limit else first[:limit] + "..."


def _plain(v) -> str:
    """A cell value as a user wrote it (no np.float64(...) wrappers), cut to 40 characters."""
    if isinstance(v, np.generic):
        v = v.item()
    text = "empty" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(v)
    return text if len(text) <= 40 else text[:40] + "..."


def _sniff_jsonl(path: str, key: str) -> bool:
    """True when the file's first non-blank character opens a JSON object (Mooncake's JSON lines)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).lstrip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path!r} ({type(exc).__name__}: {_first_line(exc)})") from None
    is_json = head.startswith(b"{")
    suffix = pathlib.Path(path).suffix.lower()
    if suffix == ".csv" and is_json:
        raise ConfigError(f"{key}: {path!r} is named .csv but holds JSON lines (Mooncake format); "
                          "rename it .jsonl or give the CSV trace")
    if suffix in (".jsonl", ".json") and not is_json:
        raise ConfigError(f"{key}: {path!r} is named {suffix} but does not hold JSON lines (Mooncake format: "
                          "one {\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"} object a line); "
                          "an Azure or vidur trace is a .csv")
    return is_json


_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _read_mooncake(path: str, key: str) -> Trace:
    """Mooncake JSON lines -> a Trace with flat block arrays; one line per error, naming file, line and field."""
    prompt, output, times, ids, off, labels = [], [], [], [], [0], []
    bt = MOONCAKE_BLOCK_TOKENS
    where = f"{key}: {path}"
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed by the with below; a failed open is one line
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({type(exc).__name__}: {_first_line(exc)})") from None
    with fh:
        try:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                if too_deep(line):
                    raise ConfigError(f"{where} line {n}: nested more than {MAX_JSON_DEPTH} deep; each "
                                      f"line is one flat object with {', '.join(_MOONCAKE_FIELDS)}")
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise ConfigError(f"{where} line {n}: malformed JSON ({_first_line(exc, 80)})") from None
                if not isinstance(row, dict):
                    raise ConfigError(f"{where} line {n}: expected a JSON object with {', '.join(_MOONCAKE_FIELDS)}")
                for f in _MOONCAKE_FIELDS:
                    if f not in row:
                        raise ConfigError(f"{where} line {n}: field {f} missing; each line needs "
                                          f"{', '.join(_MOONCAKE_FIELDS)}")
                t = row["timestamp"]
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                    raise ConfigError(f"{where} line {n}: field timestamp is {_plain(t)}; must be a number of ms >= 0")
                if times and t < times[-1]:
                    raise ConfigError(f"{where} line {n}: field timestamp decreases ({_plain(t)} after "
                                      f"{_plain(times[-1])}); rows must be sorted by time")
                lens = []
                for f in ("input_length", "output_length"):
                    v = row[f]
                    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TRACE_TOKENS:
                        raise ConfigError(f"{where} line {n}: field {f} is {_plain(v)}; token counts must be "
                                          f"integers in [1, {MAX_TRACE_TOKENS:,}]")
                    lens.append(v)
                h = row["hash_ids"]
                if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63
                                                      for x in h):
                    raise ConfigError(f"{where} line {n}: field hash_ids must be a list of integers in [0, 2**63)")
                need = -(-lens[0] // bt)
                if len(h) != need:
                    raise ConfigError(f"{where} line {n}: field hash_ids has {len(h)} blocks; input_length "
                                      f"{lens[0]} needs ceil({lens[0]} / {bt}) = {need}")
                if prompt and (CLASS_COLUMN in row) != bool(labels):
                    raise ConfigError(f"{where} line {n}: field {CLASS_COLUMN} is on some lines and not on others; "
                                      "give every line its class label, or none")
                if CLASS_COLUMN in row:
                    labels.append(row[CLASS_COLUMN])
                prompt.append(lens[0])
                output.append(lens[1])
                times.append(t)
                ids.extend(h)
                off.append(len(ids))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: not UTF-8 text ({_first_line(exc, 80)})") from None
    if not prompt:
        raise ConfigError(f"{where}: empty trace (no JSON lines)")
    arrays = [np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64),
              (np.asarray(times, dtype=np.float64) - times[0]) / 1000.0,
              np.asarray(ids, dtype=np.int64), np.asarray(off, dtype=np.int64)]
    for a in arrays:
        a.setflags(write=False)
    codes, names = _labels(labels, where, 1) if labels else (None, ())
    return Trace(prompt=arrays[0], output=arrays[1], times=arrays[2], name=path, block_ids=arrays[3],
                 block_off=arrays[4], block_tokens=bt, label_codes=codes, label_names=names)


@functools.lru_cache(maxsize=16)
def _read_trace_cached(path: str, mtime_ns: int, size: int, key: str) -> Trace:
    del mtime_ns, size  # cache key only: a rewritten file is read again
    if _sniff_jsonl(path, key):
        return _read_mooncake(path, key)
    import pandas as pd

    try:
        df = pd.read_csv(path, dtype={CLASS_COLUMN: str})  # a label '1' stays the name '1'
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{key}: empty trace {path!r} (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, EOFError, OSError) as exc:
        raise ConfigError(f"{key}: cannot read {path!r} as CSV ({type(exc).__name__}: {_first_line(exc)})") from None
    df.columns = [str(c).strip() for c in df.columns]
    cols = set(df.columns)
    if all(c in cols for c in _AZURE_COLS):
        fmt = "azure"
    elif all(c in cols for c in _VIDUR_COLS):
        fmt = "vidur"
    else:
        want = _VIDUR_COLS if (cols & set(_VIDUR_COLS)) and not (cols & set(_AZURE_COLS)) else _AZURE_COLS
        missing = ",".join(c for c in want if c not in cols)
        header = ",".join(df.columns)
        header = header if len(header) <= 120 else header[:120] + "..."
        raise ConfigError(f"{key}: missing columns {missing}; {_FORMATS}; file has {header}")
    if len(df) == 0:
        raise ConfigError(f"{key}: empty trace {path!r} (header only, no data rows)")
    if fmt == "azure":
        prompt = _int_column(df, "ContextTokens", key)
        output = _int_column(df, "GeneratedTokens", key)
        times = _timestamp_seconds(df["TIMESTAMP"], key)
        _check_times(times, "TIMESTAMP", key)
    else:
        prompt = _int_column(df, "num_prefill_tokens", key)
        output = _int_column(df, "num_decode_tokens", key)
        times = None
        if "arrived_at" in cols:
            times = pd.to_numeric(df["arrived_at"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            _check_times(times, "arrived_at", key)
            times = times - times[0]
    for a in (prompt, output, times):
        if a is not None:
            a.setflags(write=False)
    codes, names = (None, ())
    if CLASS_COLUMN in cols:
        codes, names = _labels(df[CLASS_COLUMN].tolist(), key, 2)
    return Trace(prompt=prompt, output=output, times=times, name=path, label_codes=codes, label_names=names)


def read_trace(spec: str | os.PathLike, key: str = "workload.trace") -> Trace:
    """The parsed trace of a shipped name or a trace file path (parsed once per file version)."""
    path = check_regular_file(trace_path(spec, key), MAX_TRACE_BYTES, key)  # a regular file, its size, before reading
    st = path.stat()
    return _read_trace_cached(str(path.resolve()), st.st_mtime_ns, st.st_size, key)


def read_lengths(spec: str | os.PathLike, column: str, key: str = "workload.trace") -> np.ndarray:
    """The prompt or output lengths (`column`: a COLUMN_ALIASES name) of a trace, int64, read-only. A shipped CSV
    trace is read with the csv module, that one column, without pandas (whose import is ~77 MB of a process's
    memory, bench_memory); the shipped files are well formed (tests/test_workload.py checks this path gives
    read_trace's columns). Any other file goes through read_trace and its checks."""
    which = COLUMN_ALIASES[column]
    if isinstance(spec, str) and SHIPPED_TRACES.get(spec, "").endswith(".csv"):
        path = check_regular_file(trace_path(spec, key), MAX_TRACE_BYTES, key)
        st = path.stat()
        return _shipped_column(str(path.resolve()), st.st_mtime_ns, st.st_size, which)
    tr = read_trace(spec, key)
    return tr.prompt if which == "prompt" else tr.output


@functools.lru_cache(maxsize=16)
def _shipped_column(path: str, mtime_ns: int, size: int, which: str) -> np.ndarray:
    del mtime_ns, size  # cache key only
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.reader(f)
        header = [c.strip() for c in next(rows)]
        prompt_col, output_col = _AZURE_COLS[1:] if _AZURE_COLS[1] in header else _VIDUR_COLS
        i = header.index(prompt_col if which == "prompt" else output_col)
        vals = np.array([int(r[i]) for r in rows], dtype=np.int64)
    vals.setflags(write=False)
    return vals


def load_trace(spec: str | os.PathLike, offset: int = 0, limit: int | None = None,
               key: str = "workload.trace") -> pd.DataFrame:
    """Read a trace (Azure or vidur format) into columns arrival_s, prompt, output.

    `arrival_s` is float seconds since the first returned row (NaN everywhere if the trace has no
    times); `prompt` / `output` are int64. Rows `offset` .. `offset + limit` (all remaining if limit is
    None). Parsed files are cached (keyed by path, size and mtime).
    """
    tr = read_trace(spec, key)
    n_all = tr.prompt.shape[0]
    check(int(offset) >= 0, key, f"offset {offset} must be >= 0")
    check(int(offset) < n_all, key, f"offset {offset} is past the end of the trace ({n_all} rows)")
    check(limit is None or int(limit) >= 1, key, f"limit {limit} must be >= 1 (or None for all rows)")
    sl = slice(int(offset), n_all if limit is None else int(offset) + int(limit))
    prompt, output = tr.prompt[sl].copy(), tr.output[sl].copy()
    if tr.times is None:
        arrival = np.full(prompt.shape[0], np.nan)
    else:
        arrival = tr.times[sl] - tr.times[sl][0]
    import pandas as pd

    return pd.DataFrame({"arrival_s": arrival, "prompt": prompt, "output": output})
