"""No module reaches a private name (`_name`) of another pdgym module: by `from pdgym.x import _name`, or through a
module it imported (`from pdgym.x import y; y._name`, `import pdgym.x as y; y._name`). What another module needs
is public, so a module's private names can change without breaking a caller."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"envs": "pdgym.envs", "baselines": "pdgym.baselines", "agents": "pdgym.agents", "bench": "pdgym.bench"}


def _module_names() -> set[str]:
    names = set()
    for folder, pkg in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            names.add(".".join([pkg, *parts]))
    return names


def private_reaches(source: str, modules: set[str], package: str) -> list[str]:
    """`module:name` for every private name of another pdgym module `source` imports or reads through a module alias."""
    tree = ast.parse(source)
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("pdgym"):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{base}:{a.name}")
                elif f"{base}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("pdgym") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{aliases[node.value.id]}:{node.attr}")
    return found


def test_the_check_finds_private_reaches():
    mods = {"pdgym.agents.evaluation.evaluate", "pdgym.agents.common"}
    assert private_reaches("from pdgym.agents.common import _x, y\n", mods, "pdgym.agents.apps") == [
        "pdgym.agents.common:_x"]
    src = "from pdgym.agents.evaluation import evaluate as E\nE._trace_rows('x')\nE.segment()\n"
    assert private_reaches(src, mods, "pdgym.agents.training") == ["pdgym.agents.evaluation.evaluate:_trace_rows"]
    assert private_reaches("from ..common import _y\n", mods, "pdgym.agents.apps") == ["pdgym.agents.common:_y"]
    assert private_reaches("import os\nos._exit\nfrom pdgym.agents.common import __doc__\n", mods, "pdgym.agents") == []


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_no_private_name_of_another_module_is_reached(folder):
    modules = _module_names()
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT / folder).with_suffix("")
        package = ".".join([PACKAGES[folder], *rel.parts[:-1]])
        bad += [f"{path.relative_to(ROOT)}: {r}" for r in private_reaches(path.read_text(), modules, package)]
    assert not bad, "private names reached across modules:\n" + "\n".join(bad)


def test_no_module_uses_hydras_internals():
    """The Hydra front door runs on Hydra's public API (hydra.main, callbacks, the Compose API): `hydra._internal`
    changes without notice between Hydra releases."""
    bad = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("hydra._internal")]
    assert not bad, "hydra._internal imported:\n" + "\n".join(bad)
