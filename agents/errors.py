"""The stderr contract of every pdgym command: bad input is one line naming the key and what is allowed, exit
status 2, no traceback; a Ctrl-C is one line, exit status 130; a warning is printed once per process.

`fail` prints the line; `one_line_errors` wraps an app's body (ConfigError, a missing file, a Ctrl-C; a policy's
error, envs/sim/policy_errors.py, is a ConfigError whose traceback HYDRA_FULL_ERROR=1 prints);
`OneLineParser` is argparse for the commands that are not Hydra apps; `interrupted` recognises a Ctrl-C behind
the error a library's cleanup raised while it unwound.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from functools import wraps

from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.policy_errors import PolicyError


def fail(app: str, msg: str, code: int = 2):
    """Print one clear line and exit: the contract for bad input in every app."""
    msg = " ".join(str(msg).split())  # one line, whatever the message held
    print(f"{app}: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


class OneLineParser(argparse.ArgumentParser):
    """argparse for pdgym's non-Hydra commands: a usage error is one line and exit 2 (`fail`), not a usage block."""

    def error(self, message: str):
        fail(self.prog, f"{message} (--help lists the arguments)")


def show_each_warning_once() -> None:
    """From now on, print each distinct warning (category and text) once in this process. Python's own
    once-per-place registry is cleared by every `warnings.catch_warnings` (pandas, tqdm and SB3 use it), so a
    reproduction replaying a short trace printed the same WorkloadWarning some fifty times. Errors raised by
    warning filters and `pytest.warns` records are untouched: only the printing is filtered."""
    show = warnings.showwarning
    if getattr(show, "once", False):
        return
    shown: set[tuple[type, str]] = set()

    def once(message, category, filename, lineno, file=None, line=None):
        if (category, str(message)) not in shown:
            shown.add((category, str(message)))
            show(message, category, filename, lineno, file, line)

    once.once = True
    warnings.showwarning = once


def interrupted(exc: BaseException | None) -> bool:
    """A Ctrl-C, or an error raised while one unwound: a library's cleanup (OmegaConf's flag_override, Hydra's
    compose) can fail on the half-built object the interrupt left, and that error then replaces the
    KeyboardInterrupt; it is still the user's Ctrl-C, reported as one line and exit status 130."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__context__
    return False


INTERRUPTED = "interrupted; this run wrote no result (files written so far are partial)"


def fail_error(app: str, exc: BaseException, line: str):
    """`line` for the error `exc`, exit status 2; the interrupt's line and 130 when `exc` was raised while a Ctrl-C
    unwound (`interrupted`: Hydra wraps OmegaConf's failed cleanup of a half-built config in its own error)."""
    if interrupted(exc):
        fail(app, INTERRUPTED, 130)
    fail(app, line)


def one_line_errors(app: str) -> Callable:
    """Decorator: ConfigError / missing files become one line on stderr and exit status 2; Ctrl-C one line, 130."""

    def deco(fn):
        @wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ConfigError as exc:
                cause = exc.__cause__
                if isinstance(exc, PolicyError) and cause is not None and os.environ.get("HYDRA_FULL_ERROR") == "1":
                    traceback.print_exception(cause)  # what the policy raised, where (asked for by the user)
                fail_error(app, exc, str(exc))
            except FileNotFoundError as exc:
                fail_error(app, exc, f"file not found: {exc.filename or exc}")
            except (KeyboardInterrupt, Exception) as exc:
                if not interrupted(exc):
                    raise
                fail(app, INTERRUPTED, 130)

        return inner

    return deco
