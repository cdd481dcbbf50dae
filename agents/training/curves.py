"""Learning curves: one figure per run (training return and validation metric against environment
steps), and several runs (seeds) in one figure with the heuristics as reference lines.

    python -m pdgym.agents.training.curves RUN_DIR [RUN_DIR ...] --baselines br0 least_kv --out curves.png

The reference lines are the heuristics evaluated on the runs' own validation seeds and split (the traffic
the curves were measured on), through the same `simulate()` path as the agent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from pdgym.envs.sim.config import ConfigError  # noqa: E402

RETURN_COL, STEP_COL = "rollout/ep_rew_mean", "time/total_timesteps"


def _history(run: Path, primary: str) -> pd.DataFrame:
    h = run / "eval_history.csv"
    if not h.is_file():
        return pd.DataFrame(columns=["timesteps", primary])
    df = pd.read_csv(h)
    return df.sort_values("timesteps").drop_duplicates("timesteps", keep="last") if primary in df else df.iloc[:0]


def run_curves(run: Path, primary: str) -> Path | None:
    """<run>/curves.png: training episode return (progress.csv) and validation `primary` (eval_history.csv)."""
    run = Path(run)
    hist = _history(run, primary)
    prog = pd.read_csv(run / "progress.csv") if (run / "progress.csv").is_file() else pd.DataFrame()
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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def seed_curves(runs: list[Path], primary: str, references: dict[str, float], path: Path,
                direction: int = -1, mean: bool = True) -> Path:
    """Validation `primary` of several runs (thin lines) and, with `mean` (seeds of one recipe), their mean
    over the common steps (thick), with horizontal reference lines (heuristics on the same validation traffic)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    frames = []
    for run in runs:
        h = _history(Path(run), primary)
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def same_recipe(runs: list[Path]) -> bool:
    """True when the runs differ only in their seed (and the name that carries it): a mean over them means
    something; runs of different recipes are drawn side by side."""
    from omegaconf import OmegaConf

    def recipe(run: Path) -> dict:
        cfg = OmegaConf.to_container(OmegaConf.load(Path(run) / "config.yaml"))
        return {k: v for k, v in cfg.items() if k not in ("seed", "name", "hydra")}

    first = recipe(runs[0])
    return all(recipe(r) == first for r in runs[1:])


def heuristic_references(run: Path, names: list[str]) -> tuple[str, dict[str, float]]:
    """(primary, {heuristic: its mean validation primary}) on the run's validation seeds and split."""
    from omegaconf import OmegaConf
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.evaluation import evaluate as E

    from .env_factory import scenario_raw
    from .schema import EnvSchema

    meta = json.loads((run / candidates.AGENT_META).read_text())
    cfg = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    env = EnvSchema(**{k: v for k, v in cfg["env"].items() if k in EnvSchema.__dataclass_fields__})
    raw = scenario_raw(env)
    split = cfg["splits"][cfg["eval"]["split"]]
    out = {}
    for name in names:
        cand = candidates.resolve(name, meta["point"])
        out[name] = E.evaluate(raw, cand, cfg["eval"]["seeds"], split, others=raw["policy"]).stats()[env.primary]["mean"]
    return env.primary, out


def main(argv: list[str] | None = None) -> None:
    from pdgym.agents.common import OneLineParser, fail
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.evaluation import evaluate as E

    p = OneLineParser(description="Learning curves of several pdgym-train runs with heuristic lines.")
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--baselines", nargs="*", default=[])
    p.add_argument("--out", type=Path, default=Path("curves.png"))
    args = p.parse_args(argv)
    try:
        for r in args.runs:
            if not (r / candidates.AGENT_META).is_file():
                raise ConfigError(f"runs: {r} is not a pdgym-train run directory (no {candidates.AGENT_META})")
        primaries = {json.loads((r / candidates.AGENT_META).read_text())["primary"] for r in args.runs}
        if len(primaries) != 1:
            raise ConfigError(f"runs: they select on different metrics ({', '.join(sorted(primaries))})")
        primary, refs = heuristic_references(args.runs[0], args.baselines) if args.baselines else (primaries.pop(), {})
    except ConfigError as exc:
        fail("pdgym-curves", str(exc))
    for r in args.runs:
        run_curves(r, primary)
    print(seed_curves(args.runs, primary, refs, args.out, E.direction(primary), mean=same_recipe(args.runs)))
    for k, v in refs.items():
        print(f"{k}: validation {primary} {v:.4g}")


if __name__ == "__main__":
    main()
