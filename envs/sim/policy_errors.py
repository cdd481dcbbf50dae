"""What a policy's decision can end in besides an action: an exception it raised, or an action the engine refused.

Both are one line naming the policy (its decision point and name), the call or action, and what went wrong; both
are `ConfigError`s (a submitted policy is input like any other), so every app prints the line and exits 2 with no
result file (agents/errors.one_line_errors; HYDRA_FULL_ERROR=1 prints the traceback of what the policy raised).
The engine checks every action before it changes anything (engine.py's actions, colocated.py's batch), so a
refused action leaves the run as it was.
"""

from __future__ import annotations

from .validation import ConfigError


class PolicyError(ConfigError):
    """A policy's call failed: `policy.<point>: <name>.<call>: <what>` (`named` adds the policy once)."""

    def __init__(self, msg: str, named: bool = False):
        super().__init__(msg)
        self.named = named


class ActionError(PolicyError):
    """The engine refused an action (the message names the action and the rule it breaks); nothing changed."""


def policy_name(policy) -> str:
    """The class a user wrote or the registry names (`module:Class` submissions rarely set `name`)."""
    return type(policy).__name__


def named(point: str, policy, call: str, exc: Exception) -> PolicyError:
    """`exc`, raised inside `policy.call(...)` at decision point `point`, as the one line that names them."""
    if isinstance(exc, PolicyError):
        return type(exc)(f"policy.{point}: {policy_name(policy)}.{call}: {exc}", named=True)
    text = str(exc).splitlines()[0] if str(exc) else ""
    why = f"{type(exc).__name__}: {text}".rstrip(": ")[:300]
    return PolicyError(f"policy.{point}: {policy_name(policy)}.{call}() raised {why} (HYDRA_FULL_ERROR=1 prints "
                       "its traceback)", named=True)
