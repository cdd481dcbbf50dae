"""Training callbacks: serving metrics to TensorBoard / wandb, held-out evaluation with the best model
kept, and resumable checkpoints.

Everything is recorded through SB3's logger, whose outputs (configured by pdgym-train) are TensorBoard,
CSV and wandb, so one `record` reaches all of them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from pdgym.agents.evaluation.metric_keys import METRIC_KEYS, direction
from pdgym.agents.learned.model_store import checkpoints
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.metrics import write_json
from stable_baselines3.common.callbacks import BaseCallback

from . import run_files

# The key of an evaluation's stats naming the seeds that stopped early ({seed: why}): a run cut short (stalled,
# out of budget) has metrics over the few requests it resolved (a stalled router's imbalance is tiny), so
# such an evaluation is never the best model.
STOPPED = "stopped_early"
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


class CheckpointEvery(BaseCallback):
    """Every `freq` environment steps: checkpoints/model_<steps>.zip (weights, optimizer, counters,
    normalisation statistics, replay buffer for off-policy algorithms; see model_store), keeping the
    last `keep`; what `resume` restarts from."""

    def __init__(self, freq: int, out: Path, saver: Callable, keep: int = 3):
        super().__init__()
        self.freq, self.out, self.saver, self.keep = int(freq), Path(out), saver, int(keep)
        self.last = 0

    def _init_callback(self) -> None:
        # the model's count: the callback's own is 0 until training starts, so a run resumed at step 2048 saved
        # its next checkpoint one step later (model_2049.zip) instead of `freq` steps after the one it holds
        self.last = int(self.model.num_timesteps)

    def _on_step(self) -> bool:
        if self.freq > 0 and self.num_timesteps - self.last >= self.freq:
            self.save()
        return True

    def save(self) -> Path:
        self.last = self.num_timesteps
        path = self.saver(self.model, self.out / f"model_{self.num_timesteps}.zip", training=True)
        for old in checkpoints(self.out)[:-self.keep]:
            old.unlink(missing_ok=True)
        return path


def rollout_size(model) -> int | None:
    """Environment steps per rollout of an on-policy algorithm (n_envs x n_steps); None for off-policy ones."""
    n_steps = getattr(model, "n_steps", None)
    return model.n_envs * n_steps if isinstance(n_steps, int) else None


def steps_at_end(model, target: int) -> int:
    """Where SB3 stops for `target` steps: an on-policy algorithm learns on whole rollouts, so it rounds up."""
    size = rollout_size(model)
    return target if not size else -(-int(target) // size) * size


class ProgressLog(BaseCallback):
    """One line every `every` environment steps (steps done of the target, steps/s over the last stretch
    and overall, time left), so a run's log shows progress without a progress bar. Time left counts the
    held-out evaluations still to come (`evaluator`), at the mean wall time of those run so far; the
    training rate excludes them."""

    def __init__(self, target: int, every: int, name: str = "", evaluator: HeldOutEval | None = None):
        super().__init__()
        self.target, self.every, self.name = int(target), max(1, int(every)), name
        self.evaluator = evaluator
        self.t0 = self.t_last = 0.0
        self.n0 = self.n_last = 0
        self.eval_s0 = self.eval_s_last = 0.0

    def _on_training_start(self) -> None:
        self.t0 = self.t_last = time.perf_counter()
        self.n0 = self.n_last = self.num_timesteps
        self.eval_s0 = self.eval_s_last = self._eval_s()

    def _eval_s(self) -> float:
        return self.evaluator.spent_s if self.evaluator is not None else 0.0

    def _on_step(self) -> bool:
        if self.num_timesteps - self.n_last >= self.every:
            self.line()
        return True

    def _on_training_end(self) -> None:
        if self.num_timesteps != self.n_last:
            self.line()

    def line(self) -> None:
        now, n, ev = time.perf_counter(), self.num_timesteps, self._eval_s()
        rate = (n - self.n_last) / max(now - self.t_last - (ev - self.eval_s_last), 1e-9)
        overall = (n - self.n0) / max(now - self.t0 - (ev - self.eval_s0), 1e-9)
        end = steps_at_end(self.model, self.target)
        left = max(end - n, 0) / max(overall, 1e-9)
        evals = ""
        if self.evaluator is not None:
            k = self.evaluator.left(n, end, rollout_size(self.model))
            if k and self.evaluator.runs:
                left += k * self.evaluator.spent_s / self.evaluator.runs
                evals = f" (with {k} held-out evaluation{'s' * (k > 1)})"
            elif k:
                evals = f" + {k} held-out evaluation{'s' * (k > 1)}"
        print(f"{self.name}: {self.done(n)}, {rate:.0f} steps/s (run {overall:.0f}), {left:.0f} s left{evals}",
              flush=True)
        self.logger.record("time/steps_per_s", overall)
        self.t_last, self.n_last, self.eval_s_last = now, n, ev

    def done(self, n: int) -> str:
        """Steps done of the target; past it (SB3 ends only on a whole rollout: 6144 steps for 6000 in rollouts
        of 2 x 256) the real count is said so, not as a percentage over 100."""
        if n <= self.target:
            return f"step {n}/{self.target} ({100 * n / max(self.target, 1):.0f}%)"
        size = f" of {rollout_size(self.model)} steps" if rollout_size(self.model) else ""
        return f"step {n} (total_timesteps={self.target} rounded up to whole rollouts{size})"


class HeldOutEval(BaseCallback):
    """Every `freq` environment steps, run the current policy through `simulate()` on the validation
    seeds (`evaluate_fn(model) -> Evaluation.stats()`), log eval/<metric>, append eval_history.csv and
    keep best_model.zip by the primary metric (its direction: lower TTFT, higher throughput, ...).

    The check runs where the policy changes: at the start of a rollout (after the previous update), and
    once at the end of training. A check inside a rollout evaluated the policy of the rollout's start
    again, and the end of training (rounded up to whole rollouts) then evaluated the final policy a few
    steps later: two evaluations, 3,000 and 3,072, for total_timesteps=3000 (issue 27)."""

    def __init__(self, evaluate_fn: Callable, freq: int, primary: str, out: Path, saver: Callable):
        super().__init__()
        self.evaluate_fn, self.freq, self.primary, self.out = evaluate_fn, int(freq), primary, Path(out)
        self.saver = saver
        self.history_path = self.out / "eval_history.csv"
        self.best = -math.inf  # direction-adjusted: higher is better
        self.last = -1
        self.last_stats: dict | None = None
        self.runs, self.spent_s = 0, 0.0  # evaluations run by this process and their wall time

    def _init_callback(self) -> None:
        h = run_files.history(self.out, self.primary, "resume")  # a resumed run: remember the best score so far
        score = direction(self.primary) * h[self.primary].to_numpy(dtype=float)
        if np.isfinite(score).any():
            self.best = float(np.nanmax(score))
        self.last = int(self.model.num_timesteps)  # a resumed run evaluates `freq` steps after its checkpoint

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        if self.freq > 0 and self.num_timesteps - self.last >= self.freq:
            self.run()

    def _on_training_end(self) -> None:
        if self.num_timesteps != self.last:
            self.run()

    def left(self, n: int, end: int, rollout: int | None) -> int:
        """Evaluations still to come between step `n` and the end of training at step `end`."""
        if n >= end:
            return int(self.last != n)
        k, last, step = 0, self.last, rollout or 1
        if self.freq > 0:
            r = -(-n // step) * step  # the next rollout start
            while r < end:
                if r - last >= self.freq:
                    k, last = k + 1, r
                r += step
        return k + 1  # the final evaluation

    def run(self) -> dict:
        self.last = self.num_timesteps
        t0 = time.perf_counter()
        stats = self.last_stats = self.evaluate_fn(self.model)
        self.runs, self.spent_s = self.runs + 1, self.spent_s + time.perf_counter() - t0
        row = {"timesteps": self.num_timesteps, **{k: stats[k]["mean"] for k in METRIC_KEYS}}
        for k in LOGGED:
            if math.isfinite(row[k]):
                self.logger.record(f"eval/{k}", row[k])
        score = direction(self.primary) * row[self.primary]
        stopped = stats.get(STOPPED) or {}
        improved = math.isfinite(score) and score > self.best and not stopped
        if improved:
            self.best = score
            self.saver(self.model, self.out / "best_model.zip")
            write_json(self.out / "best_metrics.json", {"timesteps": self.num_timesteps, "metrics": stats})
        best = direction(self.primary) * self.best
        self.logger.record("eval/best_" + self.primary, best)
        others = ", ".join(f"{k} {row[k]:.4g}" for k in ("ttft_p99", "tpot_p99", "throughput_tok_s", "rejected")
                           if k != self.primary and math.isfinite(row[k]))
        note = f", {len(stopped)} seed(s) stopped early: not a best-model candidate" if stopped else ""
        print(f"eval at step {self.num_timesteps}: {self.primary} {row[self.primary]:.4g} (best {best:.4g}"
              f"{', new best' if improved else ''}{note}); {others}", flush=True)
        self.logger.dump(self.num_timesteps)
        fd = safe_files.open_nofollow(self.history_path, what="hydra.run.dir")  # appended in place, never via a link
        with os.fdopen(fd, "a", newline="") as fh:
            pd.DataFrame([row]).to_csv(fh, header=os.fstat(fd).st_size == 0, index=False)
        return stats
