"""pdgym's own warnings, printed as one line.

Python's default format adds the source line that called `warnings.warn` (for an env made by gym.make:
gymnasium's `env = env_creator(**env_spec_kwargs)`), which tells a user nothing. Every pdgym warning is a
PdgymWarning and prints as "pdgym: Category: text"; other packages' warnings keep Python's format (only
these categories are formatted here, nothing is filtered or silenced).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


class PdgymWarning(UserWarning):
    """Base of pdgym's warning categories (one line each: `install`)."""


class EnvWarning(PdgymWarning):
    """An env's episode setup differs from what a user may expect (e.g. every episode replays the same rows)."""


class EngineWarning(PdgymWarning):
    """engine=numba could not be used here (numba missing, a kernel that does not compile): the Python path runs."""


class CostWarning(PdgymWarning):
    """A cost model's input was measured elsewhere (e.g. a profile table timed on other hardware)."""


def install() -> None:
    """Format PdgymWarning categories as one line from now on (idempotent; wraps the current formatwarning)."""
    previous = warnings.formatwarning
    if getattr(previous, "pdgym", False):
        return

    def formatwarning(message, category, filename, lineno, line=None):
        if isinstance(category, type) and issubclass(category, PdgymWarning):
            return f"pdgym: {category.__name__}: {message}\n"
        return previous(message, category, filename, lineno, line)

    formatwarning.pdgym = True
    warnings.formatwarning = formatwarning


install()


@contextlib.contextmanager
def held_warnings() -> Iterator[None]:
    """The warnings shown in the block, shown only once it ends without an error: a run refused with one line
    prints that line alone (a trace's "replaying 3 requests instead of 10" came before its refusal). Only the
    showing is held: the filters decide as usual, at the time and place of each warning (once per place by
    default; an "error" filter raises inside the block), so this changes no filter (warnings.catch_warnings would
    reset every once-per-place registry). Held ones are shown through warnings' own last step (_showwarnmsg: the
    hook `showwarning`, or the record of a catch_warnings / pytest.warns around the block)."""
    held: list[warnings.WarningMessage] = []
    saved = warnings.showwarning

    def hold(message, category, filename, lineno, file=None, line=None):
        held.append(warnings.WarningMessage(message, category, filename, lineno, file, line))

    warnings.showwarning = hold
    try:
        yield
    finally:
        warnings.showwarning = saved
    for w in held:
        warnings._showwarnmsg(w)
