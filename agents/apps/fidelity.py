"""The fidelity report: every reproduction run, every paper effect judged against its band, one markdown file.

`make fidelity` (python -m pdgym.agents.apps.fidelity) runs each reproduction named in
conf/fidelity.yaml's `effects` at full size (conf/repro/NAME.yaml as is), reads each effect's value from
the reproduction's summary.json, and writes docs/fidelity.md (between its fidelity markers; the prose
around them is kept): the effect, the paper's figure, pdgym's figure, the band it must fall in, a
verdict, the reproduction's figure, its wall time and the commit id. `--tiny` runs the same code path
with conf/fidelity.yaml's `tiny` overrides (CI: the numbers then say nothing about the effects, and the
report says so). Each completed reproduction leaves a run record (wall time, commit, sizes) beside its
summary.json; `--rejudge` runs nothing and writes the report from those, so reproductions run one at a
time (or on several machines into one --out) make one report.

The evidence goes beside the report: docs/fidelity.md's judged runs are copied to docs/fidelity/NAME/
(summary.json, run record, figures; JSON and PNG only), the table links those figures, and
`--rejudge --out docs/fidelity` judges the committed data again without running anything.

Verdicts: pass (every value in band, and rising where the effect says so), FAIL (a value out of band),
calibrated (in band, but the band's source also set a parameter of pdgym: conf/fidelity.yaml's
`calibrated` says which; not evidence), not measured (the run's configuration has no such point, e.g. a smaller tiny run),
out of regime (the reproduction flagged a point as out of its regime: the number is not a test of
the effect), not run (the reproduction failed; its error is in the report).
"""

from __future__ import annotations

import importlib.resources
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf
from pdgym.agents.apps import repro
from pdgym.agents.common import commit_id
from pdgym.agents.errors import OneLineParser, fail, show_each_warning_once
from pdgym.agents.experiments.harness import MAX_DOC_BYTES, write_marked
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import write_json

_TOKEN = re.compile(r"([^.\[\]]+)|\[(-?\d*)(?::(-?\d*))?\]")


def spec() -> dict:
    return OmegaConf.to_container(OmegaConf.load(importlib.resources.files("pdgym.conf") / "fidelity.yaml"))


def lookup(summary: dict, path: str):
    """`a.b[0:2]` in a summary: dict keys, list items and slices; a dict at the end becomes its values."""
    cur = summary
    for m in _TOKEN.finditer(path):
        key, i, j = m.groups()
        if key is not None:
            cur = cur[key]
        elif j is None and ":" not in m.group(0):
            cur = cur[int(i)]
        else:
            cur = cur[int(i) if i else None:int(j) if j else None]
    return list(cur.values()) if isinstance(cur, dict) else cur


def as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def sibling(path: str, key: str) -> str:
    """The summary path of `key` beside `path`'s last field (`heavy_tail.imb_ratio_br0`, N -> `heavy_tail.N`)."""
    head, dot, _ = path.rpartition(".")
    return f"{head}{dot}{key}"


def select(effect: dict, summary: dict, path: str, vals: list, scalar_ok: bool = False) -> list:
    """The values at the effect's points: `at: {N: [4, 8, 16]}` keeps the entries whose sibling N is listed (the
    paper's tier sizes inside a run that also measures N = 32); a run without every listed point raises KeyError
    (the effect is not measured: a claim about three tier sizes is not tested by one)."""
    if not effect.get("at") or (scalar_ok and len(vals) == 1):  # a single bound or divisor holds at every point
        return vals
    (key, want), = effect["at"].items()
    have = as_list(lookup(summary, sibling(path, key)))
    if len(have) != len(vals) or any(w not in have for w in want):
        raise KeyError(f"{path} at {key} = {want}")
    return [vals[have.index(w)] for w in want]


def judge(effect: dict, summary: dict) -> tuple[list, str]:
    """(values, verdict) of one effect against its band; "not measured" when the run has no such value."""
    try:
        vals = select(effect, summary, effect["value"], as_list(lookup(summary, effect["value"])))
        per = select(effect, summary, effect["per"], as_list(lookup(summary, effect["per"])), scalar_ok=True) \
            if effect.get("per") else None
    except (KeyError, IndexError, TypeError):
        return [], "not measured"
    if per:
        vals = [v / p for v, p in zip(vals, per if len(per) == len(vals) else per * len(vals))]
    lo, hi = effect["band"]

    def bound(b, k):
        if b is None:
            return None
        if isinstance(b, str):
            bs = select(effect, summary, b, as_list(lookup(summary, b)), scalar_ok=True)
            return bs[k] if len(bs) > 1 else bs[0]
        return b

    ok = True
    for k, v in enumerate(vals):
        if v is None:
            ok = False
            continue
        lo_k, hi_k = bound(lo, k), bound(hi, k)
        if (lo_k is not None and v < lo_k) or (hi_k is not None and v > hi_k):
            ok = False
    if effect.get("check") == "increasing" and any(b <= a for a, b in zip(vals, vals[1:])):
        ok = False
    return vals, "pass" if ok else "FAIL"


def out_of_regime(effect: dict, summary: dict) -> list[str]:
    """The flagged regime points an effect depends on: all of its reproduction's, or with `regime: TAG` (or a
    list of TAGs) only the points whose name starts with one of them (br_imbalance measures several tiers; one
    tier out of regime says nothing about another's effect, nor sbs_ttft's 100% point about its 40%); with `at`,
    only the flags of the points judged."""
    flagged = summary.get("regime", {}).get("out_of_regime", [])
    tag = effect.get("regime")
    tags = None if tag is None else tuple(str(t) for t in as_list(tag))
    if tags and effect.get("at"):  # only the flags of the points judged: "workload N=4 ..." for at {N: [4]}
        (key, want), = effect["at"].items()
        tags = tuple(f"{t} {key}={w} " for t in tags for w in want)
    return [f for f in flagged if tags is None or f.startswith(tags)]


def judged(effect: dict, summary: dict) -> tuple[list, str]:
    """`judge`, then calibration and the regime: an effect whose band's source also set one of pdgym's
    parameters (`calibrated: why`) is "calibrated" when in band, never "pass" (agreeing with the figure it was
    fitted to is no evidence; out of band it still FAILs: the calibration drifted); a measured value at a
    flagged point is "out of regime" (or "FAIL (out of regime)"), not a test of the effect; a value the run
    does not have stays "not measured"."""
    vals, verdict = judge(effect, summary)
    if verdict == "pass" and effect.get("calibrated"):  # in band because a parameter was fitted to this source
        verdict = "calibrated"
    if verdict != "not measured" and out_of_regime(effect, summary):
        verdict = "out of regime" if verdict in ("pass", "calibrated") else "FAIL (out of regime)"
    return vals, verdict


def fmt(vals: list) -> str:
    return " / ".join("n/a" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v) for v in vals)


RUN_RECORD = "fidelity_run.json"  # beside each reproduction's summary.json: wall time, commit, sizes
MAX_SUMMARY_BYTES = 16 * safe_files.MiB  # summary.json: a reproduction's numbers, a few hundred kB at most
MAX_RECORD_BYTES = safe_files.MiB  # fidelity_run.json: wall time, commit, overrides
MAX_FIGURE_BYTES = 64 * safe_files.MiB  # a figure copied as evidence: a PNG of a few hundred kB
KEY = "--rejudge"
NUMBER = (int, float)


def _numbers(x) -> bool:
    return all(v is None or (isinstance(v, NUMBER) and not isinstance(v, bool)) for v in as_list(x))


def checked_run(d: Path, effects: list[dict]) -> dict:
    """A completed reproduction read back (--rejudge): its run record and summary.json bounded (a regular file
    inside `d`), of the types the report reads, the values its effects judge numbers, its figures PNG files
    inside `d`; anything else is one ConfigError line naming the file and the key."""
    rec_path, sum_path = d / RUN_RECORD, d / "summary.json"
    rec = safe_files.read_json(rec_path, MAX_RECORD_BYTES, KEY, within=d)
    safe_files.get_key(rec, "wall_s", NUMBER, KEY, rec_path)
    safe_files.get_key(rec, "error", (str, type(None)), KEY, rec_path)
    for k, kind in (("commit", str), ("tiny", bool)):
        if k in rec:
            safe_files.get_key(rec, k, kind, KEY, rec_path)
    summary = safe_files.read_json(sum_path, MAX_SUMMARY_BYTES, KEY, within=d)
    if not isinstance(summary, dict):
        raise ConfigError(f"{KEY}: {sum_path} holds a JSON {type(summary).__name__}, not a reproduction's summary")
    for k, kind, default in (("regime", dict, {}), ("regime.out_of_regime", list, []), ("regime.in_regime", bool, True),
                             ("regime_causes", dict, {}), ("figures", list, [])):
        safe_files.get_key(summary, k, kind, KEY, sum_path, default)
    if not all(isinstance(f, str) for f in summary.get("regime", {}).get("out_of_regime", [])):
        raise ConfigError(f"{KEY}: {sum_path} has regime.out_of_regime entries that are not strings")
    for f in summary.get("figures", []):
        if not isinstance(f, str) or Path(f).is_absolute() or ".." in Path(f).parts or not f.endswith(".png"):
            raise ConfigError(f"{KEY}: {sum_path} names the figure {str(f)[:60]!r}; allowed: a .png file inside "
                              "the run folder")
        safe_files.check_regular_file(d / f, MAX_FIGURE_BYTES, KEY, within=d)
    for e in effects:
        for path in [e["value"], e.get("per"), *[b for b in e["band"] if isinstance(b, str)]]:
            try:
                found = lookup(summary, path) if path else None
            except (KeyError, IndexError, TypeError, ValueError):
                continue  # not in the run: the effect is "not measured"
            if not _numbers(found):
                raise ConfigError(f"{KEY}: {sum_path} has {path} = {str(found)[:60]}; expected numbers")
    return {**rec, "summary": summary}


def reuse(order: list[str], out_root: Path, effects: list[dict]) -> dict[str, dict]:
    """The completed reproductions already under `out_root` (summary.json + run record, read back checked:
    `checked_run`), for --rejudge: a report assembled from runs made one at a time (or on several machines)
    without running them again. A broken one stops the report (one line, exit 2) before anything is written."""
    found = {}
    try:
        for name in order:
            d = out_root / name
            if os.path.lexists(d / "summary.json") and os.path.lexists(d / RUN_RECORD):
                found[name] = checked_run(d, [e for e in effects if e["repro"] == name])
    except ConfigError as exc:
        fail("pdgym-fidelity", str(exc))
    if not found:
        fail("pdgym-fidelity", f"--rejudge: no completed reproduction under {out_root} (summary.json + {RUN_RECORD})")
    return found


def run_each(order: list[str], tiny: bool, tiny_overrides: dict, extra: list[str], out_root: Path) -> dict[str, dict]:
    """Run each reproduction (`tiny`: with its tiny overrides), leaving a run record beside each summary.json."""
    results: dict[str, dict] = {}
    for i, name in enumerate(order, 1):
        print(f"[{i}/{len(order)}] {name}{' (tiny)' if tiny else ''}", flush=True)
        overrides = (list(tiny_overrides.get(name, [])) if tiny else []) + list(extra)
        t0, commit = time.perf_counter(), commit_id()  # the code the run starts from
        try:
            summary = repro.run(name, overrides, out_root)
            record = {"wall_s": time.perf_counter() - t0, "error": None, "commit": commit,
                      "tiny": tiny, "overrides": overrides}
            write_json(out_root / name / RUN_RECORD, record)
            results[name] = {**record, "summary": summary}
        except (Exception, SystemExit) as exc:  # noqa: BLE001 -- one failed reproduction is reported, the rest run
            results[name] = {"summary": None, "wall_s": time.perf_counter() - t0, "commit": commit,
                             "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}
    return results


def run(names: list[str] | None, tiny: bool, out_root: Path, doc: Path, extra: list[str],
        rejudge: bool = False) -> dict:
    cfg = spec()
    effects = cfg["effects"]
    order = list(dict.fromkeys(e["repro"] for e in effects))
    if os.path.lexists(doc):  # the report keeps its prose: a document it cannot read stops it before any run
        try:
            safe_files.read_text(doc, MAX_DOC_BYTES, "--doc")
        except ConfigError as exc:
            fail("pdgym-fidelity", str(exc))
    if names:
        bad = sorted(set(names) - set(order))
        if bad:
            fail("pdgym-fidelity", f"--only: unknown reproduction(s) {', '.join(bad)}; allowed: {', '.join(order)}")
        order = [n for n in order if n in names]
    results = reuse(order, out_root, effects) if rejudge else run_each(order, tiny, cfg["tiny"], extra, out_root)
    rows = []
    for e in effects:
        if e["repro"] not in results:
            continue
        r = results[e["repro"]]
        if r["summary"] is None:
            rows.append({**e, "values": [], "verdict": "not run"})
            continue
        vals, verdict = judged(e, r["summary"])
        rows.append({**e, "values": vals, "verdict": verdict})
    tiny = tiny or any(r.get("tiny") for r in results.values())
    evidence = publish(results, out_root, evidence_dir(doc))
    report = render(rows, results, tiny, evidence, doc.parent, extra)
    doc.parent.mkdir(parents=True, exist_ok=True)
    write_marked(doc, "fidelity", report)  # the hand-written reading of the verdicts around it stays
    verdicts = {"effects": [{k: r[k] for k in ("repro", "effect", "values", "band", "verdict")} for r in rows],
                "wall_s": {n: r["wall_s"] for n, r in results.items()}, "tiny": tiny, "commit": commit_id()}
    for d in {evidence} if rejudge else {out_root, evidence}:  # judging runs leaves the runs as they are
        d.mkdir(parents=True, exist_ok=True)
        write_json(d / "fidelity.json", verdicts)
    n_cal = sum(r["verdict"] == "calibrated" for r in rows)
    print(f"fidelity: {sum(r['verdict'] == 'pass' for r in rows)}/{len(rows)} effects pass"
          + (f", {n_cal} calibrated to their own source" if n_cal else "") + f"; report in {doc}")
    return verdicts


def evidence_dir(doc: Path) -> Path:
    """Where a report's evidence goes: docs/fidelity.md -> docs/fidelity/."""
    return doc.parent / doc.stem


def publish(results: dict, out_root: Path, dest: Path) -> Path:
    """Copy each judged run's summary.json, run record and figures from `out_root` to `dest` (the same NAME/
    layout, so `--rejudge --out dest` reads it back); a run's old evidence is replaced whole."""
    if dest.resolve() == out_root.resolve():
        return dest
    for name, r in results.items():
        src, dst = out_root / name, dest / name
        if r["summary"] is None or not (src / "summary.json").is_file():
            continue
        dest.mkdir(parents=True, exist_ok=True)
        tmp = safe_files.fresh_dir(dest, name)  # fresh: no planted link
        for f in ["summary.json", RUN_RECORD, *r["summary"].get("figures", [])]:
            if (src / f).is_file():  # bounded, a regular file inside the run (checked_run named the figures)
                (tmp / f).parent.mkdir(parents=True, exist_ok=True)
                (tmp / f).write_bytes(safe_files.read_bytes(src / f, MAX_FIGURE_BYTES, KEY, within=src))
        if dst.is_symlink() or dst.is_file():
            dst.unlink()  # a link at the run's name is replaced, never followed
        else:
            shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    return dest


SPEC = Path(__file__).resolve().parents[2] / "docs" / "ALGORITHMS.md"  # in a checkout; a wheel has no docs/


def spec_link(doc_dir: Path) -> str:
    """ALGORITHMS.md, linked relative to the report when the checkout's copy is there."""
    if not SPEC.is_file():
        return "ALGORITHMS.md"
    return f"[ALGORITHMS.md]({Path(os.path.relpath(SPEC, doc_dir.resolve())).as_posix()})"


def render(rows: list[dict], results: dict, tiny: bool, evidence: Path, doc_dir: Path, extra: list[str]) -> str:
    figures = evidence.relative_to(doc_dir) if evidence.is_relative_to(doc_dir) else evidence.resolve()
    n_pass = sum(r["verdict"] == "pass" for r in rows)
    n_oor = sum("out of regime" in r["verdict"] for r in rows)
    n_cal = sum(r["verdict"] == "calibrated" for r in rows)
    lines = [
        "# Fidelity report: the papers' effects in pdgym",
        "",
        f"Generated by `make fidelity` (python -m pdgym.agents.apps.fidelity) at commit `{commit_id()}` "
        "(each run's own commit in the Runs table), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        + ("**tiny sizes (CI code path): the numbers below say nothing about the effects**" if tiny
           else "full sizes (conf/repro/*.yaml as committed)")
        + (f"; overrides: `{' '.join(extra)}`" if extra else "") + ".",
        "",
        "Each effect: the paper's figure, pdgym's value(s) from the reproduction's summary.json, the band it must "
        f"fall in (the paper's figure within a factor of about 2, {spec_link(doc_dir)}; the direction always), and the "
        "verdict. *out of regime*: the reproduction flagged a point (load, occupancy) outside the regime the "
        "effect is claimed for, so the value is not a test of it. *calibrated*: in band, but a parameter of pdgym "
        "was set from the same source (listed below the table), so agreeing with it is no evidence. Each run's "
        "summary.json and figures are in "
        f"[{figures}/]({figures}/) (`--rejudge --out` that folder judges them again).",
        "",
        f"**{n_pass} of {len(rows)} effects pass**"
        + (f"; {n_cal} calibrated to their own source (not tests)" if n_cal else "")
        + (f"; {n_oor} out of regime (not tests of their effect), {len(rows) - n_pass - n_cal - n_oor} fail or were "
           "not measured in regime." if n_oor else "."),
        "",
        "| reproduction | effect | paper | pdgym | band | verdict | figure |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["band"]
        band = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]" + (
            ", rising" if r.get("check") == "increasing" else "")
        fig = r.get("figure") or ""
        if fig and (evidence / r["repro"] / fig).is_file():  # a link only to a figure the run made
            fig = f"[{fig}]({figures}/{r['repro']}/{fig})"
        lines.append(f"| {r['repro']} | {r['effect']} | {r['paper']} | {fmt(r['values'])} | {band} | "
                     f"{r['verdict']} | {fig} |")
    cal = [r for r in rows if r.get("calibrated")]
    if cal:
        lines += ["", "Calibrated to their own source:", ""]
        lines += [f"- {r['repro']}, {r['effect']}: {r['calibrated']}" for r in cal]
    lines += ["", "## Runs", "", "| reproduction | commit | wall time (s) | regime | status |", "|---|---|---|---|---|"]
    for name, r in results.items():
        s = r["summary"] or {}
        reg = s.get("regime", {})
        flags = "; ".join(reg.get("out_of_regime", [])[:4]) + (" ..." if len(reg.get("out_of_regime", [])) > 4 else "")
        status = "ok" if r["error"] is None else f"error: {r['error'].splitlines()[-1][:200]}"
        regime = "in regime" if reg.get("in_regime", True) else flags
        lines.append(f"| {name} | `{r.get('commit', 'unknown')}` | {r['wall_s']:.0f} | {regime} | {status} |")
    causes = [(name, k, v) for name, r in results.items() for k, v in ((r["summary"] or {}).get("regime_causes")
                                                                       or {}).items()]
    if causes:  # what a reproduction says keeps its points out of regime (trace too short, prefill bound, ...)
        lines += ["", "What keeps points out of regime, as the reproductions name it:", ""]
        lines += [f"- {name}, {k}: {v}" for name, k, v in causes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    show_each_warning_once()
    ap = OneLineParser(prog="pdgym-fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="CI sizes (conf/fidelity.yaml tiny overrides)")
    ap.add_argument("--only", default="", help="comma-separated reproductions (default: all)")
    ap.add_argument("--out", default="runs/fidelity", help="output root of the reproductions")
    ap.add_argument("--doc", default="docs/fidelity.md", help="the report to write")
    ap.add_argument("--rejudge", action="store_true",
                    help="run nothing: judge the reproductions already completed under --out and write the report")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every reproduction (e.g. workload.trace=PATH)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    run([n for n in a.only.split(",") if n], a.tiny, Path(a.out), Path(a.doc), a.overrides, a.rejudge)


if __name__ == "__main__":
    main()
