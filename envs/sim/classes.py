"""Request classes (tenants / SLO tiers): each request of a run belongs to one class with its own TTFT and TPOT
SLO and a weight (ALGORITHMS.md section 9; docs/concepts.md, "SLO tiers").

`workload.classes: [{name, share, ttft_s, tpot_s, weight, max_prompt, trace}]` lists the tiers, and
`workload.class_by` says how requests are assigned to them:

    share   at random by `share` (the shares sum to 1), drawn from a generator of its own, spawned apart from
            the traffic's, so adding classes changes no arrival or length;
    prompt  a length rule: a request goes to the first class whose `max_prompt` is >= its prompt (the last
            class, with no `max_prompt`, takes the rest);
    trace   a real label: every class names a trace (`trace: azure_conv`) and the workload is the merge of those
            traces on their own timestamps (workload.py), each row labelled by the trace it came from;
    label   a real label in the replayed trace (`workload.trace`): its `class` column (traces.py) names each row's
            tier, mapped onto the classes by name; a label no class names is refused (`label_classes`).

Without `workload.classes` a run has one class, `default`, whose SLO is the scenario's `slo` (weight 1): every
request carries class 0 and nothing is drawn, so every result is what it was before classes existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .validation import check, is_num, shown

__all__ = ["CLASS_BY", "ClassTable", "SLOClass", "assign_classes", "class_table", "label_classes"]

CLASS_BY = ("share", "prompt", "trace", "label")
DEFAULT_CLASS = "default"
# requests' class codes are int8 (a byte a request, like their state and reason codes): codes 0..127. Tiers are a
# handful in any serving system, so the count is bounded rather than the codes widened; above it the codes wrapped.
MAX_CLASSES = int(np.iinfo(np.int8).max) + 1


@dataclass
class SLOClass:
    """One tier: its SLOs (null: the scenario's `slo`), weight, and what assigns requests to it."""

    name: str = DEFAULT_CLASS
    share: float | None = None  # class_by=share: fraction of requests
    ttft_s: float | None = None  # TTFT SLO (null: slo.ttft_s)
    tpot_s: float | None = None  # TPOT SLO (null: slo.tpot_s)
    weight: float = 1.0  # weight in the weighted attainment
    max_prompt: int | None = None  # class_by=prompt: longest prompt of the class (null on the last: the rest)
    trace: str | None = None  # class_by=trace: the trace whose rows are this class


@dataclass(frozen=True)
class ClassTable:
    """The classes of one run as parallel tuples, index = class code (requests' `cls`)."""

    names: tuple[str, ...]
    ttft_s: np.ndarray  # float64 [K]
    tpot_s: np.ndarray  # float64 [K]
    weight: np.ndarray  # float64 [K]

    @property
    def k(self) -> int:
        return len(self.names)

    @property
    def single(self) -> bool:
        return self.k == 1

    def copy(self) -> ClassTable:
        """The same table with arrays of its own (read-only): what a policy's view holds."""
        return ClassTable(self.names, _frozen(self.ttft_s), _frozen(self.tpot_s), _frozen(self.weight))


def _finite_positive(v, key: str, allow_zero: bool = False) -> float:
    ok = is_num(v) and math.isfinite(float(v)) and (float(v) >= 0 if allow_zero else float(v) > 0)
    check(ok, key, f"got {v!r}; must be a finite number {'>= 0' if allow_zero else '> 0'}")
    return float(v)


def validate_classes(classes: list[SLOClass] | None, class_by: str, key: str = "workload") -> None:
    """Every rule of the issue's "Bad input" list for tiers: one line naming the key."""
    check(class_by in CLASS_BY, f"{key}.class_by", f"got {class_by!r}; allowed: {', '.join(CLASS_BY)}")
    if not classes:
        return
    check(isinstance(classes, list), f"{key}.classes", f"got {shown(classes)}; must be a list of classes")
    check(len(classes) <= MAX_CLASSES, f"{key}.classes",
          f"{len(classes)} classes; at most {MAX_CLASSES} (a request's class code is one byte)")
    seen: set[str] = set()
    for i, c in enumerate(classes):
        k = f"{key}.classes[{i}]"
        check(isinstance(c.name, str) and c.name != "", f"{k}.name", f"got {shown(c.name)}; must be a non-empty string")
        check(c.name not in seen, f"{k}.name", f"duplicate class name {shown(c.name)}; class names must be distinct")
        seen.add(c.name)
        for f in ("ttft_s", "tpot_s"):
            if getattr(c, f) is not None:
                _finite_positive(getattr(c, f), f"{k}.{f}")
        _finite_positive(c.weight, f"{k}.weight", allow_zero=True)
        if class_by == "share":
            check(c.share is not None, f"{k}.share", "class_by=share needs a share per class")
            _finite_positive(c.share, f"{k}.share", allow_zero=True)
        if class_by == "prompt" and i < len(classes) - 1:
            check(isinstance(c.max_prompt, int) and c.max_prompt >= 1, f"{k}.max_prompt",
                  f"got {shown(c.max_prompt)}; class_by=prompt needs max_prompt >= 1 on every class but the last")
        if class_by == "prompt" and i == len(classes) - 1 and len(classes) > 1:
            check(c.max_prompt is None, f"{k}.max_prompt",
                  f"got {shown(c.max_prompt)}; the last class takes every longer prompt, so its max_prompt must be "
                  "null (a bound there would be ignored)")
        if class_by == "trace":
            check(isinstance(c.trace, str) and c.trace != "", f"{k}.trace",
                  "class_by=trace needs a trace (a shipped name or a CSV path) per class")
    if class_by == "share":
        total = sum(float(c.share) for c in classes)
        check(abs(total - 1.0) <= 1e-9, f"{key}.classes", f"shares sum to {total:g}; they must sum to 1")
    if class_by == "prompt":
        bounds = [c.max_prompt for c in classes[:-1]]
        check(all(a < b for a, b in zip(bounds, bounds[1:])), f"{key}.classes",
              f"max_prompt {shown(bounds)} must strictly increase from class to class")


def _frozen(values) -> np.ndarray:
    a = np.array(values, dtype=np.float64)
    a.flags.writeable = False
    return a


def class_table(classes: list[SLOClass] | None, ttft_s: float, tpot_s: float) -> ClassTable:
    """The run's classes (read-only arrays); no `classes`: the one default class with the scenario's SLO."""
    if not classes:
        return ClassTable((DEFAULT_CLASS,), _frozen([ttft_s]), _frozen([tpot_s]), _frozen([1.0]))
    return ClassTable(tuple(c.name for c in classes),
                      _frozen([ttft_s if c.ttft_s is None else c.ttft_s for c in classes]),
                      _frozen([tpot_s if c.tpot_s is None else c.tpot_s for c in classes]),
                      _frozen([c.weight for c in classes]))


def assign_classes(classes: list[SLOClass] | None, class_by: str, prompt: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Class code (int8) of every request for class_by share or prompt (trace and label: with the trace's rows)."""
    n = prompt.shape[0]
    if not classes or len(classes) == 1:
        return np.zeros(n, dtype=np.int8)
    if class_by == "share":
        cum = np.cumsum([float(c.share) for c in classes])
        return np.minimum(np.searchsorted(cum / cum[-1], rng.random(n), side="right"),
                          len(classes) - 1).astype(np.int8)
    bounds = np.array([c.max_prompt for c in classes[:-1]], dtype=np.int64)
    return np.searchsorted(bounds, prompt, side="left").astype(np.int8)


def label_classes(classes: list[SLOClass], codes: np.ndarray, names: tuple[str, ...],
                  key: str = "workload.trace") -> np.ndarray:
    """class_by=label: the class code (int8) of each row whose trace label is names[codes[i]], matched by name.

    Every label the trace holds must name a class (checked over the whole file, not only the replayed rows,
    so the answer does not depend on `trace_offset`)."""
    index = {c.name: k for k, c in enumerate(classes)}
    allowed = ", ".join(index)
    for label in names:
        check(label in index, key, f"class label {shown(label)} in column class names no class of "
                                   f"workload.classes; allowed: {allowed}")
    lut = np.array([index[label] for label in names], dtype=np.int8)
    return lut[codes]
