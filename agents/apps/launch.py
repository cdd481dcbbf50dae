"""Console entry points of the apps (pyproject.toml's [project.scripts]).

An app's module is imported inside the guard: its imports take seconds (Hydra, pandas, torch), and a Ctrl-C
then was a 32-42 line traceback; now it is one line and exit status 130, as a Ctrl-C during a run is
(agents/errors.one_line_errors). A KeyboardInterrupt that lands in a finaliser or a thread ("Exception ignored
in ...") is handed to the main thread instead of printed, and once the app ends (an interrupt included) a further
Ctrl-C while Python shuts down is ignored rather than printed as another traceback. A Ctrl-C that CPython lost
during the imports is raised again once they are done (agents/interrupts.py).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys

from pdgym.agents import interrupts


def _interrupt_main_instead(default):
    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            import _thread
            import threading

            # raised again in the main thread, from another thread, once this hook has returned (raised inside the
            # hook it would be lost again; a thread that interrupts at once could land inside this hook's own
            # Thread.start, which CI saw print as "Exception ignored in sys.unraisablehook"). A second Ctrl-C
            # inside the hook is dropped here: the latch (agents/interrupts.py) holds it.
            with contextlib.suppress(KeyboardInterrupt):
                later = threading.Timer(0.05, _thread.interrupt_main)
                later.daemon = True
                later.start()
            return
        default(unraisable)

    return hook


def _quiet_from_now() -> None:
    with contextlib.suppress(ValueError):  # not the main thread: nothing to do
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _interrupted_exit(app: str):
    _quiet_from_now()
    print(f"{app}: error: interrupted; this run wrote no result", file=sys.stderr)
    raise SystemExit(130) from None


def launch(app: str, module: str) -> object:
    """Import `module` and run its `main()`; a Ctrl-C anywhere outside the app's own handler is one line, 130."""
    sys.unraisablehook = _interrupt_main_instead(sys.unraisablehook)
    if not sys.stderr.isatty():  # a log file, a pipe, CI: tqdm's default is no bar (its redraws fill logs with \r)
        os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        with interrupts.latched():
            app_main = importlib.import_module(module).main
            interrupts.raise_if_interrupted()
            return app_main()
    except KeyboardInterrupt:
        _interrupted_exit(app)
    except Exception as exc:
        from pdgym.agents.errors import interrupted  # loaded by now: every app imports it

        if not interrupted(exc):  # an error a Ctrl-C left behind in a library's cleanup is still the Ctrl-C
            raise
        _interrupted_exit(app)
    finally:
        _quiet_from_now()


def sim():
    return launch("pdgym-sim", "pdgym.agents.apps.sim")


def repro():
    return launch("pdgym-repro", "pdgym.agents.apps.repro")


def train():
    return launch("pdgym-train", "pdgym.agents.training.train")


def evaluate():
    return launch("pdgym-eval", "pdgym.agents.evaluation.evaluate")


def leaderboard():
    return launch("pdgym-leaderboard", "pdgym.agents.apps.leaderboard")


def enjoy():
    return launch("pdgym-enjoy", "pdgym.agents.apps.enjoy")


def profile():
    return launch("pdgym-profile", "pdgym.agents.apps.profile")


def zoo():
    return launch("pdgym-zoo", "pdgym.agents.zoo.curate")


def table():
    launch("pdgym-table", "pdgym.agents.apps.sweep_table")  # main returns the table: the exit status is 0
