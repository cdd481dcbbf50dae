"""A Ctrl-C that sticks. Python turns SIGINT into a KeyboardInterrupt raised wherever the main thread happens to
be, and CPython loses that exception when it is raised inside Python code that a C function calls and then clears
the error of (an import's machinery, a dict lookup's `__eq__`): a Ctrl-C 0.6 s into pdgym-sim's start-up once ran
the whole 300,000-request run and exited 0 (CI, 2026-11-27). The handler `latched` installs also records the
signal, and `raise_if_interrupted` raises it again at the apps' checkpoints (imports done, config composed)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_seen = {"sigint": False}


@contextlib.contextmanager
def latched() -> Iterator[None]:
    """Within the block, record every SIGINT besides raising KeyboardInterrupt as Python's own handler does (the
    handler stays installed after it: the app's exit path decides what a late Ctrl-C does). A SIGINT the process
    inherited as ignored (nohup, a background job) stays ignored, as Python leaves it; so does a handler an
    application set. The record starts and ends empty, so an app run twice in one process (tests) starts clean."""
    _seen["sigint"] = False
    try:
        _install()
        yield
    finally:
        _seen["sigint"] = False


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def recorded(signum, frame):
        _seen["sigint"] = True
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, recorded)


def raise_if_interrupted() -> None:
    """A checkpoint: raise KeyboardInterrupt if a Ctrl-C arrived since `latch()`, whether or not it was lost."""
    if _seen["sigint"]:
        raise KeyboardInterrupt
