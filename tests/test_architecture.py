"""The import graph of the package: no cycles between modules nor between sub-packages, and the simulator
stays a leaf layer.

The graph is read from the source (an AST walk, nothing imported): a node per module of
pdgym.envs / pdgym.baselines / pdgym.agents, an edge per import statement anywhere in
the file (TYPE_CHECKING blocks and function bodies included: a cycle hidden there is
still a cycle in the design). `from pkg import name` points at pkg.name when that is a
module, else at pkg itself. The same edges, grouped by sub-package (pdgym.envs.sim,
pdgym.envs, pdgym.baselines, pdgym.agents and each pdgym.agents.X; a top package's own
modules are one group), must form no cycle either: two sub-packages that import each
other, even lazily through different modules, are one design split in two folders.
The detectors are tested on small synthetic graphs first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"pdgym": ROOT / "pdgym", "pdgym.envs": ROOT / "envs", "pdgym.baselines": ROOT / "baselines",
            "pdgym.agents": ROOT / "agents"}
SIM = "pdgym.envs.sim"
# What the simulator may not import: the layers above it and the RL stack.
SIM_FORBIDDEN = ("pdgym.envs", "pdgym.baselines", "pdgym.agents", "gymnasium", "stable_baselines3", "sb3_contrib",
                 "torch")


def module_files() -> dict[str, Path]:
    out = {}
    for pkg, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """Every module `name` imports (targets outside the package kept by their dotted name)."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{pkg}.{base}" if base else pkg
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in modules else base)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    mods = set(files)
    return {m: imports_of(m, p, mods) for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (a list of nodes, first == last) of the directed graph, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for root in sorted(graph):
        if state.get(root):
            continue
        stack = [(root, iter(sorted(graph.get(root, ()))))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif nxt not in graph or state.get(nxt) == 2:
                continue
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            else:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(graph[nxt]))))
                path.append(nxt)
    return None


def subpackage(module: str, packages: set[str]) -> str:
    """The group of a module: the deepest package of depth <= 3 (pdgym.agents.apps) that holds it."""
    parts = module.split(".")
    for depth in (3, 2):
        pkg = ".".join(parts[:depth])
        if pkg in packages and len(parts) >= depth:
            return pkg
    return module


def subpackage_graph(graph: dict[str, set[str]], packages: set[str]) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """{group: {imported group: [(module, imported module), ...]}}: the module edges between groups, each kept
    with the imports that make it (a cycle's message names them)."""
    out: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for mod, deps in graph.items():
        a = subpackage(mod, packages)
        out.setdefault(a, {})
        for dep in deps:
            if dep not in graph:
                continue
            b = subpackage(dep, packages)
            if a != b:
                out[a].setdefault(b, []).append((mod, dep))
    return out


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, import) pairs where a simulator module imports something above it."""
    bad = []
    for mod, deps in graph.items():
        if mod != SIM and not mod.startswith(SIM + "."):
            continue
        for dep in deps:
            inside = dep == SIM or dep.startswith(SIM + ".")
            if not inside and any(dep == f or dep.startswith(f + ".") for f in SIM_FORBIDDEN):
                bad.append((mod, dep))
    return sorted(bad)


# --------------------------------------------------------------------------- the detectors themselves
def test_cycle_detector_finds_cycles_and_accepts_dags():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": {"x.outside"}}) is None  # diamond + external edge
    cyc = find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cyc is not None and cyc[0] == cyc[-1] and set(cyc) == {"a", "b", "c"}
    assert find_cycle({"a": {"a2"}, "a2": {"a"}}) == ["a", "a2", "a"]


def test_layer_rule_flags_simulator_importing_upwards():
    g = {f"{SIM}.engine": {f"{SIM}.config", "numpy"}, f"{SIM}.bad": {"pdgym.envs.decode_routing", "gymnasium.spaces"},
         "pdgym.envs.decode_routing": {SIM, "gymnasium"}}
    assert layer_violations(g) == [(f"{SIM}.bad", "gymnasium.spaces"), (f"{SIM}.bad", "pdgym.envs.decode_routing")]


def test_import_resolution_handles_relative_and_submodule_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from . import requests as R\nfrom .config import X\nfrom ..scenario import y\n"
                 "import numpy\nif False:\n    from pdgym.baselines.registry import z\n")
    mods = {f"{SIM}.requests", f"{SIM}.config", "pdgym.envs.scenario"}
    got = imports_of(f"{SIM}.m", f, mods)
    assert got == {f"{SIM}.requests", f"{SIM}.config", "pdgym.envs.scenario", "numpy", "pdgym.baselines.registry"}


def test_subpackage_grouping_finds_a_cycle_between_folders_that_modules_alone_do_not_show():
    pkgs = {"p.a", "p.a.x", "p.a.y", "p.b"}
    g = {"p.a.x.one": {"p.a.y.two"}, "p.a.y.two": {"p.b.z"}, "p.a.y.three": {"p.a.x.four"}, "p.a.x.four": set(),
         "p.b.z": set(), "p.a.common": {"p.b.z"}, "p.a.x": set()}
    assert find_cycle(g) is None  # no module cycle ...
    sub = subpackage_graph(g, pkgs)
    assert subpackage("p.a.common", pkgs) == "p.a" and subpackage("p.a.x", pkgs) == "p.a.x"
    assert sub["p.a.x"] == {"p.a.y": [("p.a.x.one", "p.a.y.two")]} and sub["p.a"] == {"p.b": [("p.a.common", "p.b.z")]}
    cyc = find_cycle({k: set(v) for k, v in sub.items()})  # ... but x and y import each other
    assert cyc is not None and set(cyc) == {"p.a.x", "p.a.y"}


# --------------------------------------------------------------------------- the package
@pytest.fixture(scope="module")
def graph():
    g = import_graph()
    assert f"{SIM}.config" in g and "pdgym.baselines.registry" in g  # the walk found the package
    return g


def test_no_import_cycles(graph):
    internal = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    cyc = find_cycle(internal)
    assert cyc is None, "import cycle: " + " -> ".join(cyc)


def test_no_cycles_between_subpackages(graph):
    packages = {m for m, p in module_files().items() if p.name == "__init__.py"}
    sub = subpackage_graph(graph, packages)
    assert {"pdgym.envs.sim", "pdgym.agents.apps", "pdgym.agents.training"} <= set(sub)
    cyc = find_cycle({k: set(v) for k, v in sub.items()})
    assert cyc is None, "sub-package cycle: " + " -> ".join(cyc) + "; made by " + "; ".join(
        f"{a} imports {b}" for x, y in zip(cyc, cyc[1:]) for a, b in sub[x][y][:3])


def test_simulator_imports_no_env_baseline_agent_or_rl_code(graph):
    assert layer_violations(graph) == []


def test_every_decision_point_names_its_registered_env():
    """Each point of the table (however many) registers its env, whose module names the same id and point."""
    import importlib

    import gymnasium as gym
    import pdgym.envs  # noqa: F401  (registers the envs)
    from pdgym.envs.sim.points import POINTS

    assert POINTS
    for name, point in POINTS.items():
        module, cls = point.entry_point.split(":")
        env_cls = getattr(importlib.import_module(module), cls)
        assert point.env_id in gym.registry and gym.spec(point.env_id).entry_point == point.entry_point
        assert (point.env_id, name) == (env_cls.ENV_ID, env_cls.POINT)
        assert isinstance(point.default(), point.protocol)


def test_every_decision_points_conf_folder_is_packaged():
    """A point's policy configs (conf/policy/<name>/) ship in the wheel: setup.py's packages() finds the folder
    (docs/architecture.md, "Adding a decision point", step 4), and every folder below a packaged one."""
    import runpy

    from pdgym.envs.sim.points import POINTS

    packages = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")["packages"]()
    for top in ("envs", "baselines", "agents", "conf", "data"):
        for d in (ROOT / top).rglob("*"):
            if d.is_dir() and d.name != "__pycache__" and "." not in d.name:
                assert f"pdgym.{d.relative_to(ROOT).as_posix().replace('/', '.')}" in packages, d
    for name in POINTS:
        assert (ROOT / "conf" / "policy" / name).is_dir() and f"pdgym.conf.policy.{name}" in packages, name


MAX_MODULE_LINES = 700  # issue 28: a module past this is two concepts in one file


def test_no_module_is_over_700_lines():
    """One concept per module: every module of envs/, baselines/ and agents/ stays within MAX_MODULE_LINES."""
    long = {name: n for name, path in module_files().items()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"over {MAX_MODULE_LINES} lines: {long}"
