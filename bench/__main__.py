"""Run every bench/bench_*.py and record the figures (see bench/__init__.py).

    python -m bench [bench_sim bench_decode ...]

The CartPole reference is measured before and after the modules (the machine may be shared; both
are recorded, their mean is the reference). PDGYM_BENCH_LABEL=text tags the run in the history.
Every run appends its figures to bench/history.csv and rewrites the table in docs/performance.md
(between its markers) from the newest value of each figure.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import pkgutil
import platform
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import cartpole_steps_per_s
from bench.report import history_row, render_table, write_doc

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv: list[str]) -> None:
    only = set(argv)
    import bench

    mods = [m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")]
    unknown = only - set(mods)
    if unknown:
        print(f"bench: unknown module(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(mods))}",
              file=sys.stderr)
        raise SystemExit(2)
    ref0 = cartpole_steps_per_s()
    results: dict[str, float] = {}
    failed = []
    for name in sorted(mods):
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            figures = importlib.import_module(f"bench.{name}").run()
        except Exception as e:  # noqa: BLE001 (one broken module must not cost the figures of the others)
            failed.append(name)
            print(f"{name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        results.update({f"{name[6:]}.{k}": float(v) for k, v in figures.items()})
        print(f"{name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    ref1 = cartpole_steps_per_s()
    ref = (ref0 + ref1) / 2
    results = {"ref.cartpole_steps_per_s": ref, "ref.cartpole_before": ref0, "ref.cartpole_after": ref1, **results}
    table = Table(title=f"pdgym bench (CartPole {ref:,.0f} steps/s; before {ref0:,.0f}, after {ref1:,.0f})")
    for col in ("figure", "value", "ratio to CartPole"):
        table.add_column(col, justify="right" if col != "figure" else "left")
    for k, v in results.items():
        table.add_row(k, f"{v:,.4g}", f"{v / ref:,.4g}")
    Console().print(table)
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    where = machine() + (f" [{os.environ['PDGYM_BENCH_LABEL']}]" if os.environ.get("PDGYM_BENCH_LABEL") else "")
    out = ROOT / "runs" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps({"time": stamp, "machine": where, **results}, indent=2) + "\n")
    hist = history_row(ROOT / "bench" / "history.csv", stamp, where, results)
    print(f"recorded in {hist}")
    write_doc(ROOT / "docs" / "performance.md", render_table(hist, where))
    print("table written to docs/performance.md")
    if failed:
        raise SystemExit(f"bench: {len(failed)} module(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
