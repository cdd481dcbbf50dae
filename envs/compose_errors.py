"""Hydra composition errors as one line: the key, what is wrong, what is allowed.

Shared by the command-line apps (agents/front_door.hydra_cli) and the Python API (envs/scenario.load_scenario,
so `gym.make(..., overrides=["bad.key=1"])` names the key and lists the keys next to it, as the CLI does).
"""

from __future__ import annotations

import difflib
import importlib.resources
import re

from omegaconf import DictConfig, OmegaConf
from pdgym.envs.sim.validation import did_you_mean


def group_options(group: str) -> list[str]:
    """Options of a config group (conf/GROUP/*.yaml)."""
    root = importlib.resources.files("pdgym.conf").joinpath(*group.split("/"))
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def _sub_value(overrides: list[str], key: str, path: str) -> str:
    """The value at `path` inside the mapping an override gives to `key` (`repro.br0={name: br0, order: x}`, path
    `order` -> `x`), as written on a command line; '...' when it cannot be read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for o in overrides:
        if o.split("=", 1)[0].lstrip("+~") != key:
            continue
        try:
            cur = OverridesParser.create().parse_override(o).value()
            for part in path.split("."):
                cur = cur[part]
        except Exception:  # noqa: BLE001 - a hint only: anything unreadable falls back to '...'
            return "..."
        return str(cur)
    return "..."


# Profiles whose YAML files list every field of their dataclass (HardwareProfile, ModelProfile; tests/test_cli.py
# checks it): an added key is refused when the profile loads, so an error about one must not suggest `+key=value`.
# Other sections (cluster.*: mfu, mbu, ... are fields the YAML leaves out) keep the `+` hint.
CLOSED_SECTIONS = ("hardware", "model")


def hydra_error_line(exc: BaseException, overrides: list[str], config_name: str) -> str:
    """A Hydra / OmegaConf composition error as one line: the key, what is wrong, what is allowed."""
    from hydra.errors import MissingConfigException, OverrideParseException

    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else type(exc).__name__
    if isinstance(exc, MissingConfigException):
        m = re.search(r"Could not find '([^']*)/([^']*)'", first)
        if m:
            group, value = m.group(1), m.group(2)
            options = group_options(group) or [ln for ln in lines[2:] if not ln.startswith(("Config", "provider"))]
            what = "empty" if value == "" else f"unknown {value!r}; {did_you_mean(value, options)}".rstrip("; ")
            return f"{group}: {what}; allowed: {', '.join(options)}"
        return first
    if isinstance(exc, OverrideParseException):
        bad = next((o for o in overrides if not _parses(o)), None)
        detail = next((ln for ln in lines if not ln.startswith(("See ", "Error parsing"))), first)
        return f"cannot parse override {bad!r}: {detail} (form: key=value, +key=value to add, ~key to delete)"
    m = re.match(r"Could not override '([^']+)'\.\s*(.*)", first)
    if m:
        key = m.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), "...")
        if "No match in the defaults list" in text:
            return (f"{key}: not a key or config group of this command (its groups: "
                    f"{', '.join(_groups(config_name))}); to add a new key use +{key}={value}")
        full = getattr(exc.__cause__, "full_key", None) or key
        parent, _, leaf = full.rpartition(".")
        keys = _keys_of(config_name, [o for o in overrides if not o.lstrip("+~").startswith(key + "=")], parent)
        if keys is None:
            return f"{full}: unknown key; to add a new key use +{key}={value}"
        close = difflib.get_close_matches(leaf, keys, n=1)
        hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
        allowed = ", ".join(keys) if keys else "no keys yet (free-form)"
        if full.split(".", 1)[0] in CLOSED_SECTIONS:  # the simulator's dataclasses: a new key would be refused next
            return f"{full}: unknown key; {hint}{parent} has: {allowed} (its keys are fixed)"
        if full != key:  # a mapping given to `key` carries the new key: suggest adding that key alone
            value = _sub_value(overrides, key, full[len(key) + 1:])
        if not parent:  # nothing reads a new top-level key: adding one (+key) would be refused too (ROOT_ADD)
            groups = _groups(config_name)  # scenaro=X means the scenario group, not the scenario_name key
            close = difflib.get_close_matches(leaf, [*groups, *keys], n=1)
            hint = (f"did you mean {close[0]}={value} (a config group)? " if close and close[0] in groups
                    else f"did you mean {close[0]}? " if close else "")
            return f"{full}: unknown key; {hint}the config has: {allowed}"
        return f"{full}: unknown key; {hint}{parent} has: {allowed}; to add a new key use +{full}={value}"
    m = re.match(r"Could not append to config\. An item is already at '([^']+)'", first)
    if m:
        return f"{m.group(1)}: already set; drop the '+' to change it ({m.group(1)}=...), or use ++ to add or override"
    key = getattr(exc, "full_key", None) or getattr(exc.__cause__, "full_key", None)
    return f"{key}: {first}" if key else first


def _parses(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_overrides([override])
        return True
    except Exception:  # noqa: BLE001 - any parse failure marks the culprit
        return False


def _groups(config_name: str) -> list[str]:
    choices = config_choices(config_name)
    return [g for g in choices if not g.startswith("hydra/")] if choices else []


def config_choices(config_name: str) -> dict:
    from hydra import compose, initialize_config_module

    try:
        with initialize_config_module("pdgym.conf", version_base=None):
            return dict(compose(config_name, return_hydra_config=True).hydra.runtime.choices)
    except Exception:  # noqa: BLE001 - help text only
        return {}


def new_root_key(override: str, config_name: str, overrides: list[str]) -> str | None:
    """The one line refusing `+KEY=...` that adds a top-level KEY the config does not have (no app reads one, so
    it would be dropped in silence); None for anything else (a nested key, a group, a key already there)."""
    if not override.startswith("+") or "=" not in override:
        return None
    key = override.lstrip("+").split("=", 1)[0]
    if not key or "." in key or "/" in key or group_options(key):
        return None
    keys = _keys_of(config_name, [o for o in overrides if not o.startswith("+")], "")
    if keys is None or key in keys:
        return None
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{key}: unknown key (+ adds it, and nothing reads a new top-level key); {hint}the config has: {', '.join(keys)}"


def _keys_of(config_name: str, overrides: list[str], node: str) -> list[str] | None:
    from hydra import compose, initialize_config_module

    try:
        with initialize_config_module("pdgym.conf", version_base=None):
            cfg = compose(config_name, overrides=overrides)
        sub = OmegaConf.select(cfg, node) if node else cfg
        return [str(k) for k in sub] if isinstance(sub, DictConfig) else None
    except Exception:  # noqa: BLE001 - hint only
        return None
