"""Learning curves: one figure per run (training return and validation metric against environment
steps), and several runs (seeds) in one figure with the heuristics as reference lines.

    python -m pdgym.agents.training.curves RUN_DIR [RUN_DIR ...] --baselines br0 least_kv --out curves.png

The reference lines are the heuristics evaluated on the runs' own validation seeds and split (the traffic
the curves were measured on), through the same `simulate()` path as the agent.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from pdgym.envs.sim import safe_files  # noqa: E402
from pdgym.envs.sim.config import ConfigError  # noqa: E402

from . import run_files  # noqa: E402
from .run_files import RETURN_COL, STEP_COL  # noqa: E402


def run_curves(run: Path, primary: str, hist: pd.DataFrame | None = None,
               prog: pd.DataFrame | None = None) -> Path | None:
    """<run>/curves.png: training episode return (progress.csv) and validation `primary` (eval_history.csv),
    read bounded and checked (run_files) unless given; None when there is nothing to draw yet."""
    run = Path(run)
    hist = run_files.history(run, primary) if hist is None else hist
    prog = run_files.progress(run) if prog is None else prog
    has_ret = not prog.empty and RETURN_COL in prog and prog[RETURN_COL].notna().any()
    if hist.empty and not has_ret:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if has_ret:
        p = prog[[STEP_COL, RETURN_COL]].dropna()
        axes[0].plot(p[STEP_COL], p[RETURN_COL], color="tab:blue", marker="o" if len(p) < 20 else None)
    else:
        axes[0].text(0.5, 0.5, "no finished training episode yet", ha="center", transform=axes[0].transAxes)
    axes[0].set(xlabel="environment steps", ylabel="training episode return", title="training")
    if not hist.empty:
        axes[1].plot(hist.timesteps, hist[primary], marker="o", color="tab:orange")
    axes[1].set(xlabel="environment steps", ylabel=f"validation {primary}", title="held-out evaluation")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(run.name, fontsize=9)
    fig.tight_layout()
    path = run / "curves.png"
    with safe_files.atomic_path(path) as tmp:  # replaced, never written through a link planted there
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def seed_curves(runs: list[Path], primary: str, references: dict[str, float], path: Path,
                direction: int = -1, mean: bool = True, hists: list[pd.DataFrame] | None = None) -> Path:
    """Validation `primary` of several runs (thin lines; their histories `hists`, read here unless given) and,
    with `mean` (seeds of one recipe), their mean over the common steps (thick), with horizontal reference lines
    (heuristics on the same validation traffic)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    frames = []
    for i, run in enumerate(runs):
        h = run_files.history(Path(run), primary) if hists is None else hists[i]
        if not h.empty:
            ax.plot(h.timesteps, h[primary], lw=0.9, alpha=0.55, marker=".", label=Path(run).name)
            frames.append(h.set_index("timesteps")[primary])
    if mean and len(frames) > 1:
        common = pd.concat(frames, axis=1, join="inner")
        if not common.empty:
            ax.plot(common.index, common.mean(axis=1), lw=2.4, color="k", label=f"mean of {len(frames)} runs")
    colors = plt.cm.tab10(np.linspace(0, 1, 10))
    for i, (name, v) in enumerate(sorted(references.items(), key=lambda kv: direction * kv[1], reverse=True)):
        if math.isfinite(v):
            ax.axhline(v, ls="--", lw=1.2, color=colors[(i + 3) % 10], label=f"{name} (heuristic) {v:.4g}")
    better = "lower" if direction < 0 else "higher"
    ax.set(xlabel="environment steps", ylabel=f"validation {primary} ({better} is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with safe_files.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return Path(path)


def same_recipe(runs: list[Path], configs: list[dict] | None = None) -> bool:
    """True when the runs differ only in their seed (and the name that carries it): a mean over them means
    something; runs of different recipes are drawn side by side. `configs`: their config.yaml, read here
    (bounded, run_files.config) unless given."""
    configs = [run_files.config(Path(r)) for r in runs] if configs is None else configs
    recipes = [{k: v for k, v in cfg.items() if k not in ("seed", "name", "hydra")} for cfg in configs]
    return all(r == recipes[0] for r in recipes[1:])


def heuristic_references(run: Path, names: list[str], meta: dict | None = None,
                         cfg: dict | None = None) -> tuple[str, dict[str, float]]:
    """(primary, {heuristic: its mean validation primary}) on the run's validation seeds and split, from its
    agent.json and config.yaml (read here, bounded and checked, unless given). The stored config names no code:
    a policy given as module:Class there is refused (code is imported only when the command line names it)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.evaluation.runner import evaluate
    from pdgym.baselines.registry import is_external
    from pdgym.envs.sim.validation import check_seed_list

    from .env_factory import scenario_raw
    from .schema import EnvSchema

    run = Path(run)
    meta = run_files.agent_meta(run) if meta is None else meta
    cfg = run_files.config(run) if cfg is None else cfg
    path = run / run_files.CONFIG
    node = {k: v for k, v in safe_files.get_key(cfg, "env", dict, "runs", path).items()
            if k in EnvSchema.__dataclass_fields__}
    try:
        env = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EnvSchema), node))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"runs: {path}: env.{getattr(exc, 'full_key', '') or ''}: "
                          f"{str(exc).splitlines()[0]}") from None
    split_name = safe_files.get_key(cfg, "eval.split", str, "runs", path)
    seeds = check_seed_list(safe_files.get_key(cfg, "eval.seeds", list, "runs", path), f"runs: {path} eval.seeds")
    split = safe_files.get_key(cfg, f"splits.{split_name}", dict, "runs", path)
    for k, kind in (("seed_base", int), ("trace_from", (int, float)), ("trace_to", (int, float))):
        safe_files.get_key(cfg, f"splits.{split_name}.{k}", kind, "runs", path)
    if not 0 <= split["trace_from"] < split["trace_to"] <= 1:
        raise ConfigError(f"runs: {path} has splits.{split_name} rows [{split['trace_from']}, {split['trace_to']}); "
                          "expected 0 <= trace_from < trace_to <= 1")
    raw = scenario_raw(env)
    for point, spec in (raw.get("policy") or {}).items():
        name = spec.get("name") if isinstance(spec, dict) else spec
        if is_external(name):
            raise ConfigError(f"runs: {path} names the policy {name!r} ({point}); a stored file names no code: "
                              "give module:Class on the command line instead")
    out = {}
    for name in names:
        cand = candidates.resolve(name, meta["point"])
        out[name] = evaluate(raw, cand, seeds, split, others=raw["policy"]).stats()[env.primary]["mean"]
    return env.primary, out


FIGURE_FORMATS = ("png", "pdf", "svg")


def check_out(out: Path) -> Path:
    """--out: a new or existing figure file (png, pdf or svg) in an existing folder; never a folder (matplotlib
    would write FOLDER.png beside it) nor a file in a folder that does not exist."""
    if out.is_dir():
        raise ConfigError(f"--out: {out} is a folder; give the figure's file name (e.g. {out / 'curves.png'})")
    if out.suffix.lstrip(".").lower() not in FIGURE_FORMATS:
        raise ConfigError(f"--out: {out} ends in {out.suffix or 'no suffix'!r}; allowed: "
                          f"{', '.join('.' + f for f in FIGURE_FORMATS)}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--out: the folder {parent} does not exist; give a file in an existing folder")
    return out


def main(argv: list[str] | None = None) -> None:
    """Every run's agent.json, config.yaml and logs are read and checked before anything is drawn: a broken
    one is one line (exit 2) and no figure is written."""
    from pdgym.agents.errors import OneLineParser, fail
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.evaluation.metric_keys import direction

    p = OneLineParser(description="Learning curves of several pdgym-train runs with heuristic lines.")
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--baselines", nargs="*", default=[])
    p.add_argument("--out", type=Path, default=Path("curves.png"))
    args = p.parse_args(argv)
    try:
        check_out(args.out)
        for r in args.runs:
            if not r.is_dir() or not os.path.lexists(r / candidates.AGENT_META):
                raise ConfigError(f"runs: {r} is not a pdgym-train run directory (no {candidates.AGENT_META})")
        metas = [run_files.agent_meta(r) for r in args.runs]
        primaries = {m["primary"] for m in metas}
        if len(primaries) != 1:
            raise ConfigError(f"runs: they select on different metrics ({', '.join(sorted(primaries))})")
        configs = [run_files.config(r) for r in args.runs]
        primary = primaries.pop()
        hists = [run_files.history(r, primary) for r in args.runs]
        progs = [run_files.progress(r) for r in args.runs]
        refs = {}
        if args.baselines:
            selected, refs = heuristic_references(args.runs[0], args.baselines, metas[0], configs[0])
            if selected != primary:  # config.yaml's env.primary rules, as the references were computed on it
                primary, hists = selected, [run_files.history(r, selected) for r in args.runs]
    except ConfigError as exc:
        fail("pdgym-curves", str(exc))
    for r, h, g in zip(args.runs, hists, progs):
        run_curves(r, primary, h, g)
    print(seed_curves(args.runs, primary, refs, args.out, direction(primary), mean=same_recipe(args.runs, configs),
                      hists=hists))
    for k, v in refs.items():
        print(f"{k}: validation {primary} {v:.4g}")


if __name__ == "__main__":
    main()
