"""Hypothesis profiles. `make test` (CI) draws the property tests' examples derandomized, the same every run:
a verdict never depends on the run, so an example first found in CI cannot refuse a change that did not add
its bug. `make explore` (PDGYM_HYPOTHESIS=explore) draws fresh examples, more of them, to find new ones."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("pdgym", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", max_examples=500, database=None, print_blob=True)
settings.load_profile("explore" if os.environ.get("PDGYM_HYPOTHESIS") == "explore" else "pdgym")


def doc_example(name: str) -> dict:
    """Run the code block of docs/clients.md marked `<!-- example: NAME -->` (the docs' examples are tested as
    written); returns its namespace."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "clients.md").read_text()
    code = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {"__name__": f"docs_clients_{name}"}
    exec(compile(code, f"docs/clients.md ({name})", "exec"), namespace)
    return namespace
