"""Adding, listing and re-scoring the zoo's entries (`pdgym-zoo`, or `python -m pdgym.agents.zoo`; the store is
agents/learned/zoo_store.py).

    pdgym-zoo list                 # each entry: scenario and training overrides, committed values, re-score command
    pdgym-zoo add NAME RUN_DIR --command "pdgym-train experiment=..." [--commit C]
        [--reference BASELINE] [--seeds 0 1] [--split test] [--rescore workload.num_requests=200] [--note TEXT]
    pdgym-zoo check [NAME ...]

`add` copies a pdgym-train run's model (best_model.zip, as pdgym-eval picks it) into the zoo, re-scores it on
the rescore seeds (the split's run indices, the scenario it was trained on with the rescore overrides: a few
hundred requests so a test re-runs it in seconds), scores the `--reference` heuristic on the same seeds, and
writes NAME.zip then index.json, each under a temporary name renamed into place. The archive is read through
the model store (no pickle); a zoo over MAX_ZOO_BYTES is refused. `check` re-scores every entry (or the named
ones) and compares with the committed per-seed values (what tests/test_zoo.py does); exit 1 on a mismatch.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import sys
from pathlib import Path

from pdgym.agents.common import commit_id
from pdgym.agents.errors import OneLineParser, one_line_errors
from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.runner import evaluate
from pdgym.agents.evaluation.stats import paired_ratio
from pdgym.agents.learned import model_store, zoo_store
from pdgym.envs.scenario import trace_splits
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.shell import runnable

APP = "pdgym-zoo"
# Recorded per seed for every entry (besides its own primary metric): what a re-score compares.
METRICS = ("ttft_mean", "ttft_p99", "tpot_mean", "throughput_tok_s", "imbalance_mean", "rps", "finished", "rejected")
REL_TOL = 1e-6


def merged(*override_lists) -> list[str]:
    """Hydra-style overrides, a later value of the same key replacing an earlier one (Hydra refuses duplicates)."""
    out: dict[str, str] = {}
    for ovs in override_lists:
        for o in ovs:
            key = o.split("=", 1)[0]
            out.pop(key, None)
            out[key] = o
    return list(out.values())


def _value(v):
    v = float(v)
    return v if math.isfinite(v) else None  # JSON has no NaN


def metrics_of(ent: dict) -> list[str]:
    primary = ent["agent"].get("primary")
    return list(dict.fromkeys([*([primary] if primary else []), *METRICS]))


def score(ent: dict, cand: candidates.Candidate) -> dict:
    """{metric: [value per rescore seed]} of `cand` on the entry's rescore runs."""
    from pdgym.envs.scenario import load_scenario

    r = ent["rescore"]
    raw = load_scenario(ent["scenario"], merged(ent["overrides"], r["overrides"])).raw
    split = trace_splits()[r["split"]] if r["split"] else None
    ev = evaluate(raw, cand, [int(s) for s in r["seeds"]], split)
    return {m: [_value(run[m]) for run in ev.per_seed] for m in metrics_of(ent)}


def rescore(name: str, root: Path | None = None) -> dict:
    """The entry's per-seed values, measured again from its shipped archive."""
    ent = zoo_store.entry(name, root)
    agent = candidates.zoo_agent(name, root)
    return score(ent, candidates.Candidate(zoo_store.PREFIX + name, "agent", agent.point, agent=agent))


def mismatches(committed: dict, got: dict, rel: float = REL_TOL) -> list[str]:
    out = []
    for m, vals in committed.items():
        new = got.get(m)
        if new is None or len(new) != len(vals) or not all(zoo_store.same(a, b, rel) for a, b in zip(vals, new)):
            out.append(f"{m}: committed {vals}, re-scored {new}")
    return out


def rescore_command(name: str, ent: dict) -> str:
    r = ent["rescore"]
    seeds = ",".join(str(s) for s in r["seeds"])
    parts = [f"pdgym-eval policy={zoo_store.PREFIX}{name} scenario={ent['scenario']}",
             *merged(ent["overrides"], r["overrides"]), f"split={r['split'] if r['split'] else 'null'}",
             f"'seeds=[{seeds}]'"]
    return " ".join(parts)


def _write_json_atomic(path: Path, doc: dict) -> None:
    safe_files.write_text(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")


def _run_name(run: Path) -> str:
    """The run folder from its `runs/` on (where pdgym-train put it), not this machine's absolute path."""
    parts = run.resolve().parts
    return "/".join(parts[parts.index("runs"):]) if "runs" in parts else run.name


def _run_metrics(run: Path) -> dict:
    """timesteps / wall time from the run's metrics.json (pdgym-train writes it), if there."""
    path = run / "metrics.json"
    if not path.exists():
        return {}
    try:
        doc = safe_files.read_json(path, safe_files.MiB * 16, "run metrics", within=run)
    except ConfigError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: doc[k] for k in ("timesteps", "best_timesteps", "wall_time_s") if isinstance(doc.get(k), (int, float))}


def add(name: str, run: Path, command: str, commit: str | None = None, reference: str | None = None,
        seeds: list[int] = (0, 1), split: str | None = "test", rescore_overrides: list[str] = (),
        note: str = "", root: Path | None = None) -> dict:
    """Copy a run's model into the zoo as NAME, re-score it (and `reference`) and write the index; returns
    the entry. Re-adding a name replaces its entry."""
    zoo_store.check_name(name, "name")
    root = Path(root or zoo_store.ROOT)
    run = Path(run)
    if not run.is_dir():
        raise ConfigError(f"run: {run} is not a pdgym-train run folder")
    if not command.strip():
        raise ConfigError("command: give the command that trained the run (docs/results.md quotes it)")
    if split is not None and split not in trace_splits():
        raise ConfigError(f"split: got {split!r}; allowed: {', '.join(trace_splits())}, null")
    src = candidates.model_file(run)
    meta = candidates.read_agent_meta(run, "run")
    data = safe_files.read_bytes(src, model_store.MAX_MODEL_BYTES, "model file", within=run)
    sha = hashlib.sha256(data).hexdigest()
    entries = zoo_store.read_index(root)
    others = sum(e["bytes"] for n, e in entries.items() if n != name)
    if others + len(data) > zoo_store.MAX_ZOO_BYTES:
        raise ConfigError(f"{name}: the zoo would hold {(others + len(data)) / 1e6:.2f} MB, over its "
                          f"{zoo_store.MAX_ZOO_BYTES / 1e6:g} MB; ship a smaller network")
    ent = {"sha256": sha, "bytes": len(data),
           "agent": {k: meta[k] for k in ("point", "env_id", "env_kwargs", "algo", "primary") if k in meta},
           "scenario": str(meta.get("scenario") or meta["env_kwargs"].get("scenario")),
           "overrides": list(meta.get("overrides") or meta["env_kwargs"].get("overrides") or []),
           "trained": {"command": command, "commit": commit or commit_id(), "run": _run_name(run),
                       **_run_metrics(run)},
           "reference": None,
           "rescore": {"split": split, "seeds": [int(s) for s in seeds], "overrides": list(rescore_overrides),
                       "per_seed": {}},
           "note": note, "added": datetime.date.today().isoformat()}
    zoo_store.check_entry(name, ent, "new entry")
    root.mkdir(parents=True, exist_ok=True)
    final = zoo_store.archive(name, root)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        agent = candidates.LoadedAgent(tmp, zoo_store.agent_meta(name, ent), model_store.load_predictor(tmp, sha),
                                       candidates.zoo_source(name))
        ent["rescore"]["per_seed"] = score(ent, candidates.Candidate(zoo_store.PREFIX + name, "agent", agent.point, agent=agent))
        if reference:
            ref = candidates.resolve(reference, agent.point)
            ent["reference"] = {"policy": reference, "per_seed": score(ent, ref)}
        ent["rescore"]["command"] = rescore_command(name, ent)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    doc = {"format": zoo_store.FORMAT, "entries": dict(sorted({**entries, name: ent}.items()))}
    _write_json_atomic(root / zoo_store.INDEX, doc)
    return ent


def summary_line(name: str, ent: dict) -> str:
    primary = ent["agent"].get("primary", "ttft_mean")
    vals = ent["rescore"]["per_seed"].get(primary) or []
    def show(xs) -> str:
        return "[" + ", ".join("-" if x is None else f"{x:.4g}" for x in xs) + "]"

    line = (f"zoo:{name}: {ent['agent']['point']} agent on {ent['scenario']}, {ent['bytes'] / 1e3:.0f} kB; "
            f"{primary} on {ent['rescore']['split']} seeds {ent['rescore']['seeds']}: {show(vals)}")
    ref = ent.get("reference")
    if ref and ref["per_seed"].get(primary):
        p = paired_ratio(vals, ref["per_seed"][primary])
        line += f"; {ref['policy']} {show(ref['per_seed'][primary])} (agent {p['rel']:+.1%})"
    return line


@one_line_errors(APP)
def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog=APP, description="The zoo of shipped agents (docs/agents.md, 'Zoo').")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the entries, their size and committed values")
    a = sub.add_parser("add", help="add or refresh an entry from a pdgym-train run folder")
    a.add_argument("name")
    a.add_argument("run", type=Path)
    a.add_argument("--command", required=True, help="the command that trained the run")
    a.add_argument("--commit", default=None, help="the commit it was trained at (default: this checkout's)")
    a.add_argument("--reference", default=None, help="the heuristic it is compared with (scored on the same seeds)")
    a.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    a.add_argument("--split", default="test")
    a.add_argument("--rescore", nargs="*", default=[], help="overrides of the re-score runs (workload.num_requests=200)")
    a.add_argument("--note", default="")
    a.add_argument("--zoo", type=Path, default=None, help="the zoo folder (default: the package's)")
    c = sub.add_parser("check", help="re-score entries and compare with their committed values")
    c.add_argument("names", nargs="*")
    c.add_argument("--zoo", type=Path, default=None)
    args = ap.parse_args(argv)
    root = getattr(args, "zoo", None)
    if args.cmd == "list":
        for name, ent in read_sorted(root):
            print(summary_line(name, ent))
            print(f"  trained on {ent['scenario']} {' '.join(ent['overrides'])}".rstrip()
                  + f" by: {ent['trained']['command']}")
            print(f"  re-score: {runnable(ent['rescore'].get('command') or rescore_command(name, ent))}")
        return 0
    if args.cmd == "add":
        ent = add(args.name, args.run, args.command, args.commit, args.reference, args.seeds,
                  None if args.split == "null" else args.split, args.rescore, args.note, root)
        print(summary_line(args.name, ent))
        print(f"re-score: {ent['rescore']['command']}")
        return 0
    bad = 0
    for name in args.names or zoo_store.names(root):
        diff = mismatches(zoo_store.entry(name, root)["rescore"]["per_seed"], rescore(name, root))
        print(f"zoo:{name}: " + ("re-scores to its committed values" if not diff else "MISMATCH " + "; ".join(diff)))
        bad += bool(diff)
    return 1 if bad else 0


def read_sorted(root: Path | None) -> list[tuple[str, dict]]:
    return sorted(zoo_store.read_index(root).items())


if __name__ == "__main__":
    sys.exit(main())
