"""Training callbacks: serving metrics to TensorBoard / wandb, held-out evaluation with the best model
kept, and resumable checkpoints.

Everything is recorded through SB3's logger, whose outputs (configured by pdgym-train) are TensorBoard,
CSV and wandb, so one `record` reaches all of them.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from pdgym.agents.evaluation import evaluate as E
from pdgym.envs.sim.metrics import write_json
from stable_baselines3.common.callbacks import BaseCallback

# What the held-out evaluation logs under eval/ (mean over its seeds).
LOGGED = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "ttft_mean", "tpot_mean", "throughput_tok_s", "rps",
          "imbalance_mean", "slo_attainment", "goodput_rps", "chunk_util_mean", "rejected")


class EpisodeMetricsCallback(BaseCallback):
    """At the end of every training episode, log the numeric entries of its final `info` (the env's
    running metrics: TTFT / TPOT percentiles, throughput, imbalance, SLO attainment, ...) as episode/<key>."""

    def _on_step(self) -> bool:
        for done, info in zip(self.locals["dones"], self.locals["infos"]):
            if not done:
                continue
            flat = dict(info)
            flat.update(flat.pop("summary", None) or {})  # the run's final metrics, when the env adds them
            for k, v in flat.items():
                if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
                    v = float(v)
                    if math.isfinite(v):
                        self.logger.record_mean(f"episode/{k}", v)
        return True


def model_paths(zip_path: Path) -> tuple[Path, Path]:
    """(model zip, its VecNormalize statistics) — the pair a model is evaluated with."""
    return zip_path, zip_path.with_name(zip_path.stem + "_vecnormalize.pkl")


def save_model(model, zip_path: Path, vec_norm=None) -> Path:
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(zip_path)
    if vec_norm is not None:
        with open(model_paths(zip_path)[1], "wb") as fh:
            pickle.dump(vec_norm, fh)
    return zip_path


class CheckpointEvery(BaseCallback):
    """Every `freq` environment steps: checkpoints/model_<steps>.zip (+ VecNormalize stats, + replay buffer
    for off-policy algorithms), keeping the last `keep`; what `resume` restarts from."""

    def __init__(self, freq: int, out: Path, vec_norm=None, keep: int = 3):
        super().__init__()
        self.freq, self.out, self.vec_norm, self.keep = int(freq), Path(out), vec_norm, int(keep)
        self.last = 0

    def _init_callback(self) -> None:
        self.last = self.num_timesteps

    def _on_step(self) -> bool:
        if self.freq > 0 and self.num_timesteps - self.last >= self.freq:
            self.save()
        return True

    def save(self) -> Path:
        self.last = self.num_timesteps
        path = save_model(self.model, self.out / f"model_{self.num_timesteps}.zip", self.vec_norm)
        if hasattr(self.model, "replay_buffer") and self.model.replay_buffer is not None:
            self.model.save_replay_buffer(self.out / f"model_{self.num_timesteps}_replay.pkl")
        for old in checkpoints(self.out)[:-self.keep]:
            for f in (old, model_paths(old)[1], old.with_name(old.stem + "_replay.pkl")):
                f.unlink(missing_ok=True)
        return path


def checkpoints(ckpt_dir: Path) -> list[Path]:
    """The periodic checkpoints model_<steps>.zip of a run, oldest first."""
    return sorted(Path(ckpt_dir).glob("model_*[0-9].zip"), key=lambda p: int(p.stem.split("_")[1]))


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    ckpts = checkpoints(ckpt_dir)
    return ckpts[-1] if ckpts else None


class HeldOutEval(BaseCallback):
    """Every `freq` environment steps, run the current policy through `simulate()` on the validation
    seeds (`evaluate_fn(model) -> Evaluation.stats()`), log eval/<metric>, append eval_history.csv and
    keep best_model.zip by the primary metric (its direction: lower TTFT, higher throughput, ...)."""

    def __init__(self, evaluate_fn: Callable, freq: int, primary: str, out: Path, vec_norm=None):
        super().__init__()
        self.evaluate_fn, self.freq, self.primary, self.out = evaluate_fn, int(freq), primary, Path(out)
        self.vec_norm = vec_norm
        self.history_path = self.out / "eval_history.csv"
        self.best = -math.inf  # direction-adjusted: higher is better
        self.last = -1
        self.last_stats: dict | None = None

    def _init_callback(self) -> None:
        if self.history_path.is_file():  # resumed run: remember the best score so far
            h = pd.read_csv(self.history_path)
            score = E.direction(self.primary) * h[self.primary].to_numpy() if self.primary in h else np.array([])
            if np.isfinite(score).any():
                self.best = float(np.nanmax(score))
        self.last = self.num_timesteps

    def _on_step(self) -> bool:
        if self.freq > 0 and self.num_timesteps - self.last >= self.freq:
            self.run()
        return True

    def _on_training_end(self) -> None:
        if self.num_timesteps != self.last:
            self.run()

    def run(self) -> dict:
        self.last = self.num_timesteps
        stats = self.last_stats = self.evaluate_fn(self.model)
        row = {"timesteps": self.num_timesteps, **{k: stats[k]["mean"] for k in E.METRIC_KEYS}}
        for k in LOGGED:
            if math.isfinite(row[k]):
                self.logger.record(f"eval/{k}", row[k])
        score = E.direction(self.primary) * row[self.primary]
        improved = math.isfinite(score) and score > self.best
        if improved:
            self.best = score
            save_model(self.model, self.out / "best_model.zip", self.vec_norm)
            write_json(self.out / "best_metrics.json", {"timesteps": self.num_timesteps, "metrics": stats})
        self.logger.record("eval/best_" + self.primary, E.direction(self.primary) * self.best)
        self.logger.dump(self.num_timesteps)
        pd.DataFrame([row]).to_csv(self.history_path, mode="a", header=not self.history_path.is_file(), index=False)
        return stats
