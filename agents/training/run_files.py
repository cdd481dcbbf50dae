"""Reading a pdgym-train run folder back (resume, pdgym-curves): config.yaml, agent.json, eval_history.csv,
progress.csv, best_metrics.json and wandb_id.txt were written by an earlier process (or by whoever else could
write the folder), so each is read bounded through envs/sim/safe_files.py, inside the run folder, and checked key
by key or column by column: a broken file is one ConfigError line naming the file and what is wrong, never a
KeyError or a pandas traceback. The bounds fit what pdgym writes (docs/architecture.md, "Files pdgym reads")."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError

CONFIG, HISTORY, PROGRESS, BEST, WANDB_ID = (
    "config.yaml", "eval_history.csv", "progress.csv", "best_metrics.json", "wandb_id.txt")
MAX_CONFIG_BYTES = safe_files.MiB  # config.yaml: the resolved train config, a few kB
MAX_LOG_BYTES = 64 * safe_files.MiB  # eval_history.csv, progress.csv: a row per evaluation / per logger dump
MAX_BEST_BYTES = safe_files.MiB  # best_metrics.json: one evaluation's stats, a few kB
MAX_WANDB_ID_BYTES = 256  # wandb_id.txt: a run id of 8 characters
WANDB_ID_FORM = re.compile(r"[A-Za-z0-9_-]{1,64}")
RETURN_COL, STEP_COL = "rollout/ep_rew_mean", "time/total_timesteps"  # progress.csv (SB3's logger)


def config(run: Path, key: str = "runs") -> dict:
    """The run's config.yaml as a plain mapping (bounded YAML, no alias, no tag that builds an object)."""
    path = Path(run) / CONFIG
    cfg = safe_files.read_yaml(path, MAX_CONFIG_BYTES, key, within=run)
    if not isinstance(cfg, dict):
        raise ConfigError(f"{key}: {path} holds a YAML {type(cfg).__name__}, not the mapping pdgym-train writes")
    return cfg


def agent_meta(run: Path, key: str = "runs") -> dict:
    """agent.json (evaluation/candidates.read_agent_meta) with the metric the run selected on, a known one."""
    from pdgym.agents.evaluation import candidates
    from pdgym.agents.evaluation.metric_keys import METRIC_KEYS

    meta = candidates.read_agent_meta(run, key)
    primary = safe_files.get_key(meta, "primary", str, key, Path(run) / candidates.AGENT_META)
    if primary not in METRIC_KEYS:
        raise ConfigError(f"{key}: {Path(run) / candidates.AGENT_META} has primary = {primary!r}; allowed: "
                          f"{', '.join(METRIC_KEYS)}")
    return meta


def _numeric(df: pd.DataFrame, columns: tuple[str, ...], path: Path, key: str) -> pd.DataFrame:
    for col in columns:
        if col not in df:
            raise ConfigError(f"{key}: {path} has no column {col!r}")
        try:
            df[col] = pd.to_numeric(df[col])
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: {path}: column {col!r} holds values that are not numbers") from None
    return df


def history(run: Path, primary: str, key: str = "runs") -> pd.DataFrame:
    """eval_history.csv: one row per held-out evaluation, `timesteps` and `primary` numeric, sorted by step with
    the last row of a step kept (a resumed run may evaluate a step again); empty when there is none yet."""
    path = Path(run) / HISTORY
    if not os.path.lexists(path):
        return pd.DataFrame(columns=["timesteps", primary])
    df = _numeric(safe_files.read_csv(path, MAX_LOG_BYTES, key, within=run), ("timesteps", primary), path, key)
    return df.sort_values("timesteps").drop_duplicates("timesteps", keep="last")


def progress(run: Path, key: str = "runs") -> pd.DataFrame:
    """progress.csv (SB3's CSV log): its step and training-return columns numeric when it has the return."""
    path = Path(run) / PROGRESS
    if not os.path.lexists(path):
        return pd.DataFrame()
    df = safe_files.read_csv(path, MAX_LOG_BYTES, key, within=run)
    return _numeric(df, (STEP_COL, RETURN_COL), path, key) if RETURN_COL in df else df


def best(run: Path, primary: str, key: str = "resume") -> dict | None:
    """best_metrics.json ({timesteps, metrics: {METRIC: {mean, ...}}}) or None when the run has none."""
    path = Path(run) / BEST
    if not os.path.lexists(path):
        return None
    doc = safe_files.read_json(path, MAX_BEST_BYTES, key, within=run)
    safe_files.get_key(doc, "timesteps", int, key, path)
    safe_files.get_key(doc, f"metrics.{primary}.mean", (int, float), key, path)
    return doc


def wandb_id(run: Path, key: str = "resume") -> str | None:
    """The wandb run id an earlier process of this run recorded (letters, digits, '-', '_'), or None."""
    path = Path(run) / WANDB_ID
    if not os.path.lexists(path):
        return None
    text = safe_files.read_text(path, MAX_WANDB_ID_BYTES, key, within=run).strip()
    if not WANDB_ID_FORM.fullmatch(text):
        raise ConfigError(f"{key}: {path} holds {text[:40]!r}, not a wandb run id (1 to 64 letters, digits, '-', "
                          "'_'); delete it to start a new wandb run")
    return text


WRITTEN_IN_PLACE = (PROGRESS, HISTORY, "tb", "checkpoints", "wandb")  # opened for writing where they are (SB3's
# CSV and TensorBoard writers, the history's appends, wandb's offline folder), not replaced atomically like the others


def check_earlier(run: Path, primary: str, resuming: bool) -> None:
    """Before a run writes into an existing folder: nothing it writes in place is a symbolic link (writing would
    go through it, to whatever it names), and what it will read back there is readable (the history and best
    metrics always, the wandb id when it resumes), so a broken file stops it with nothing written."""
    history(run, primary, "resume")
    best(run, primary, "resume")
    if resuming:
        wandb_id(run, "resume")
    for name in WRITTEN_IN_PLACE:
        if (run / name).is_symlink():
            raise ConfigError(f"hydra.run.dir: {run / name} is a symbolic link; pdgym-train writes it in place and "
                              "never through a link (remove the link, or train into a new folder)")


def progress_writer(run: Path, resumed_at: int | None):
    """SB3's CSV output for progress.csv, opened in place with O_NOFOLLOW (never through a link). A fresh run
    starts it empty; a resumed one keeps the rows logged up to the checkpoint's step `resumed_at` (the rows after
    it were logged by the interrupted process past its last checkpoint and are logged again) and appends."""
    import csv

    from stable_baselines3.common.logger import CSVOutputFormat

    path = Path(run) / PROGRESS
    fd = safe_files.open_nofollow(path, os.O_RDWR | os.O_CREAT, "hydra.run.dir")
    fh = os.fdopen(fd, "r+", newline="")
    keys: list[str] = []
    kept: list[str] = []
    if resumed_at is not None:
        lines = fh.read(MAX_LOG_BYTES + 1).splitlines(keepends=True)
        if lines:
            keys = lines[0].rstrip("\r\n").split(",")
            col = keys.index(STEP_COL) if STEP_COL in keys else None
            for line in lines[1:]:  # in logging order: up to the first row past the checkpoint
                row = next(csv.reader([line]), [])
                if len(row) != len(keys):
                    break  # a row the interrupted process left half-written
                try:
                    step = float(row[col]) if col is not None and row[col] != "" else None
                except ValueError:
                    break
                if step is not None and step > resumed_at:
                    break
                kept.append(line if line.endswith("\n") else line + "\n")  # a row without a step: an evaluation's
    fh.seek(0)
    fh.truncate()
    if keys:
        fh.write(",".join(keys) + "\n" + "".join(kept))
        fh.flush()

    class ProgressCSV(CSVOutputFormat):
        def __init__(self):  # noqa: D107 -- CSVOutputFormat's state on the file opened above
            self.file, self.keys, self.separator, self.quotechar = fh, list(keys), ",", '"'

    return ProgressCSV()
