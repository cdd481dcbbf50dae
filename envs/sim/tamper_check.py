"""The tamper check (`check_policies: true`): a policy that changed the engine's state other than through its
actions is caught, on boards that rank submitted policies.

A view refuses every write Python lets it refuse (view.py, facades.py); what it cannot refuse (a class patched,
gc.get_referents, ctypes: docs/architecture.md, "What a policy cannot do") this check finds afterwards. It digests
the engine's state (every array of the request table and the instances, the health flags, the completion log,
the clock, the buffer and the pool) when a policy is called, before and after each of its actions, and when the
call returns: a change between two of those points was made by the policy itself, and is one PolicyError line
naming the policy, the call and what changed. It costs a digest of the state per call and action (CRC-32 over the
arrays' memory, no copy), so it is off by default.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .policy_errors import PolicyError, policy_name

ACTIONS = ("dispatch", "reject", "set_timer", "admit")


def _arrays(owner: Any, prefix: str) -> list[tuple[str, np.ndarray]]:
    return [(f"{prefix}.{k}", v) for k, v in vars(owner).items() if isinstance(v, np.ndarray)]


class TamperCheck:
    """Digests of one engine's state around its policies' calls and actions (`Simulator.call` uses it)."""

    def __init__(self, engine):
        self.engine = engine
        parts = _arrays(engine.req, "req") + [("prefill_healthy", engine.prefill_healthy),
                                              ("completed", engine.completed._ids)]
        for kind in ("prefill", "decode", "colocated"):
            for inst in getattr(engine, kind):
                parts += _arrays(inst, f"{kind}[{inst.idx}]")
        self.parts = parts
        self.last: tuple | None = None
        self.calls: list[tuple[str, str]] = []  # (point, method) of the policy calls in progress, innermost last
        for name in ACTIONS:  # instance attributes over the methods: the views' actions go through them
            setattr(engine, name, self._checked(getattr(engine, name)))

    def digest(self) -> tuple:
        e = self.engine
        return (e.now, e.tokens_out, hash(tuple(e.buffer)), hash(tuple(e.pool)),
                *(zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B")) for _, a in self.parts))

    def _changed(self, now: tuple) -> str:
        names = ("now", "tokens_out", "buffer", "pool", *(n for n, _ in self.parts))
        return ", ".join(n for n, a, b in zip(names, self.last, now) if a != b)

    def _verify(self, where: str) -> None:
        now = self.digest()
        if self.calls and now != self.last:
            point, method = self.calls[-1]
            pol = self.engine.policies[point]
            raise PolicyError(f"policy.{point}: {policy_name(pol)}.{method} changed the engine's state outside its "
                              f"actions ({self._changed(now)} changed {where}; check_policies: true)", named=True)
        self.last = now

    def enter(self, point: str, method: str) -> None:
        self._verify("before this call")
        self.calls.append((point, method))

    def leave(self) -> None:
        self._verify("after its last action")
        self.calls.pop()

    def _checked(self, action: Callable) -> Callable:
        @functools.wraps(action)
        def checked(*args, **kwargs):
            self._verify(f"before {action.__name__}()")
            try:
                return action(*args, **kwargs)
            finally:
                self.last = self.digest()
        return checked
