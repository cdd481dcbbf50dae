"""The zoo: trained agents shipped inside the package (agents/zoo/), named `zoo:NAME` wherever a policy goes.

agents/zoo/ holds one model archive per entry, NAME.zip in the model store's format (model_store.py: JSON,
weights-only tensors, npz arrays; nothing unpickled), and index.json, data only:

    {"format": "pdgym-zoo/1", "entries": {NAME: {sha256, bytes, agent: {point, env_id, env_kwargs, ...},
      scenario, overrides, trained: {command, commit, ...}, reference, rescore: {split, seeds, overrides,
      per_seed: {metric: [value per seed]}}, ...}}}

A name is checked against NAME_RE before it touches a path (NAME.zip in the zoo folder, never a path the index
names), the archive's sha256 must match its entry before the model store reads it, and the index names no code:
`agent` carries the same three keys agent.json gives evaluation (decision point, env id, env kwargs).
`python -m pdgym.agents.zoo` adds, lists and re-scores entries (agents/zoo/curate.py).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError

PREFIX = "zoo:"
FORMAT = "pdgym-zoo/1"
INDEX = "index.json"
ROOT = Path(__file__).resolve().parent.parent / "zoo"  # the package's own folder (pdgym.agents.zoo)
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_INDEX_BYTES = safe_files.MiB
MAX_ZOO_BYTES = 5 * 10**6  # everything shipped in the zoo folder (issue 27: under 5 MB)
AGENT_KEYS = {"point": str, "env_id": str, "env_kwargs": dict}  # what rebuilding an agent's observation reads
ENTRY_KEYS = {"sha256": str, "bytes": int, "agent": dict, "scenario": str, "overrides": list, "trained": dict,
              "rescore": dict}
RESCORE_KEYS = {"split": (str, type(None)), "seeds": list, "overrides": list, "per_seed": dict}


def is_zoo(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def check_name(name, key: str = "policy") -> str:
    """A zoo entry name: lower-case letters, digits and '_' (no path, no dots), else one line."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ConfigError(f"{key}: zoo name {name!r} is not allowed; a name is lower-case letters, digits and '_', "
                          "starting with a letter (at most 64)")
    return name


def read_index(root: Path | None = None) -> dict:
    """{name: entry} of the zoo at `root` (default: the package's), every entry checked key by key."""
    path = Path(root or ROOT) / INDEX
    if not path.exists():
        return {}
    doc = safe_files.read_json(path, MAX_INDEX_BYTES, "zoo index")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        raise ConfigError(f"zoo index: {path} is not a {FORMAT} index")
    for name, entry in doc["entries"].items():
        check_entry(name, entry, path)
    return doc["entries"]


def check_entry(name: str, entry, where) -> dict:
    check_name(name, f"zoo index {where}")
    if not isinstance(entry, dict):
        raise ConfigError(f"zoo index: {where}: entry {name!r} is not an object")
    for keys, node, what in ((ENTRY_KEYS, entry, name), (AGENT_KEYS, entry.get("agent") or {}, f"{name}.agent"),
                             (RESCORE_KEYS, entry.get("rescore") or {}, f"{name}.rescore")):
        for k, kind in keys.items():
            if not isinstance(node.get(k), kind):
                raise ConfigError(f"zoo index: {where}: {what}.{k} missing or not {kind}")
    return entry


def names(root: Path | None = None) -> list[str]:
    return sorted(read_index(root))


def entry(name: str, root: Path | None = None, key: str = "policy") -> dict:
    """The index entry of `name`; an unknown one is one line listing the available names."""
    check_name(name, key)
    entries = read_index(root)
    if name not in entries:
        have = ", ".join(PREFIX + n for n in sorted(entries)) or "none (the zoo is empty)"
        raise ConfigError(f"{key}: unknown zoo agent {PREFIX}{name}; available: {have}")
    return entries[name]


def archive(name: str, root: Path | None = None) -> Path:
    """Where NAME's model archive lives (from the checked name alone, never from the index)."""
    return Path(root or ROOT) / f"{check_name(name)}.zip"


def agent_meta(name: str, ent: dict) -> dict:
    """The agent.json-like metadata evaluation reads, labelled zoo:NAME."""
    return {**ent["agent"], "name": PREFIX + name}


def same(a, b, rel: float) -> bool:
    """Committed and re-scored values agree: both missing / NaN, or within `rel` relative (floats may differ in
    their last bits across CPUs)."""
    fa = a is None or (isinstance(a, float) and math.isnan(a))
    fb = b is None or (isinstance(b, float) and math.isnan(b))
    if fa or fb:
        return fa and fb
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)
