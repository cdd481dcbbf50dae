"""Where a trained agent belongs: the scenario and traffic it was trained on (its agent.json or zoo entry), so an
evaluation elsewhere says so and a zoo agent evaluated on its own scenario meets its own traffic.

- On another scenario than its training one, pdgym-eval and pdgym-leaderboard print one warning line (a transfer:
  legitimate, but not the agent's own traffic; the observation-size check still refuses what cannot run). We warn
  rather than refuse: transfer is a question worth asking, and the board marks such rows itself.
- A zoo entry's training overrides (e.g. decode_ht_n16's workload.rate=269.6) apply by default when pdgym-eval
  runs it on its own scenario: each key the command line left at the scenario's value takes the entry's value
  (give the key to change it). A pdgym-train run's are not applied (its run is evaluated on the test windows the
  scenario defines; its training windows were a choice of training).
"""

from __future__ import annotations

import sys

import yaml


def trained_on(cand) -> tuple[str | None, list[str]]:
    """(scenario, overrides) an agent candidate was trained on; (None, []) for a baseline."""
    agent = getattr(cand, "agent", None)
    if agent is None:
        return None, []
    kw = agent.meta.get("env_kwargs") or {}
    return kw.get("scenario"), [str(o) for o in kw.get("overrides") or []]


def transfer_note(label: str, cand, scenario: str | None) -> str:
    """The sentence for an agent evaluated on a scenario it was not trained on ('' otherwise); boards store it."""
    trained, overrides = trained_on(cand)
    if not trained or not scenario or trained == scenario:
        return ""
    how = f" ({' '.join(overrides)})" if overrides else ""
    return f"{label} was trained on {trained}{how}; {scenario} is a transfer, not its own traffic"


def warn_transfer(app: str, label: str, cand, scenario: str | None) -> str:
    """Print the warning line (if any) to stderr; returns the bare note ('' for none)."""
    note = transfer_note(label, cand, scenario)
    if note:
        print(f"{app}: warning: {note}", file=sys.stderr, flush=True)
    return note


def _get(data: dict, path: list[str]):
    node = data
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return KeyError
        node = node[p]
    return node


def with_training_traffic(data: dict, cand, scenario_default: dict) -> tuple[dict, list[str]]:
    """`data` with a zoo agent's training overrides applied where the composed value is still the scenario's
    (`scenario_default`: the scenario composed without the command line); returns (data, overrides applied).
    Nothing changes for a baseline, a pdgym-train run or another scenario than the agent's."""
    import copy

    from pdgym.agents.learned import zoo_store

    agent = getattr(cand, "agent", None)
    trained, overrides = trained_on(cand)
    if agent is None or not zoo_store.is_zoo(agent.meta.get("name", "")) or trained != data.get("scenario_name"):
        return data, []
    out, applied = copy.deepcopy(data), []
    for o in overrides:
        key, _, text = o.lstrip("+").partition("=")
        path = key.split(".")
        here, default = _get(out, path), _get(scenario_default, path)
        if here is KeyError or here != default:
            continue  # a key the command line changed (or one this config has not): the command line wins
        value = yaml.safe_load(text)
        if value == here:
            continue
        node = out
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        applied.append(o)
    return out, applied
