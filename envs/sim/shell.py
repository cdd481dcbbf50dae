"""A pdgym command as it runs from the user's shell, for the hints the apps print ("evaluate it: ...").

`make` installs the apps into .venv/bin, which is not on PATH: a hint that says `pdgym-eval ...` then fails as
printed. `app_command` names the executable beside the running Python (the one this process was started from),
by its bare name only when PATH finds that same file, else by its path (relative to the working directory when
inside it: `.venv/bin/pdgym-eval`); `python_command` does the same for `python -m ...`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["app_command", "python_command", "runnable"]

APPS = ("pdgym-sim", "pdgym-repro", "pdgym-train", "pdgym-eval", "pdgym-leaderboard", "pdgym-enjoy", "pdgym-profile",
        "pdgym-zoo", "pdgym-table")


def _shown(exe: Path) -> str:
    """`exe` relative to the working directory when inside it (with a slash, so the shell runs that file)."""
    try:
        rel = exe.relative_to(Path.cwd())
    except ValueError:
        return shlex.quote(str(exe))
    return shlex.quote(str(rel) if os.sep in str(rel) else f".{os.sep}{rel}")


def app_command(app: str) -> str:
    """How to run pdgym app `app` (e.g. "pdgym-eval") from this shell."""
    exe = Path(sys.executable).parent / app
    if not exe.is_file():  # not installed beside this Python: the bare name is all there is to say
        return app
    found = shutil.which(app)
    if found is not None and Path(found).resolve() == exe.resolve():
        return app
    return _shown(exe)


def python_command() -> str:
    """This Python, as the shell runs it: its bare name when PATH finds the same file, else its path."""
    exe = Path(sys.executable)
    found = shutil.which(exe.name)
    if found is not None and Path(found).resolve() == exe.resolve() and Path(found).parent == exe.parent:
        return exe.name
    return _shown(exe)


def runnable(line: str) -> str:
    """`line` (a command starting with a pdgym app's bare name, as stored in a file) with that name replaced by
    how it runs from this shell; any other line unchanged."""
    head, sep, rest = line.partition(" ")
    return app_command(head) + sep + rest if head in APPS else line
