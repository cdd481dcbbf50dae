"""The documentation a user gets with the repository: every relative link of README.md and docs/*.md
opens a file of the repository (the specification the docs cite, docs/DESIGN.md and docs/ALGORITHMS.md,
included: it once lived outside, where users do not have it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_docs_resolves():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken, checked = [], 0
    for doc in docs:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor of the same page
            checked += 1
            if not (doc.parent / target.split("#")[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert checked and not broken, broken
    readme = (ROOT / "README.md").read_text()
    assert "(docs/DESIGN.md)" in readme and "(docs/ALGORITHMS.md)" in readme


def test_concepts_defines_every_reported_metric_and_acronym_and_the_readme_links_it_first():
    from pdgym.agents.evaluation.metric_keys import METRIC_KEYS

    text = (ROOT / "docs" / "concepts.md").read_text()
    rows = {m for line in text.splitlines() if line.startswith("| `") for m in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert not set(METRIC_KEYS) - rows, sorted(set(METRIC_KEYS) - rows)
    glossary = {line.split("|")[1].strip() for line in text.split("## Glossary")[1].splitlines() if line.startswith("| ")}
    for term in ("SBS", "PBAA", "IQR", "EB", "EB*", "EB+", "MB", "BR-0", "BR-H", "DP", "EP", "TTFT", "TPOT"):
        assert term in glossary, term
    readme = (ROOT / "README.md").read_text()
    first_acronym = min(readme.index(a) for a in ("LLM", "P/D", "DP ", "EP ", "TTFT", "SBS"))
    assert readme.index("(docs/concepts.md)") < first_acronym
