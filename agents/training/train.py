"""`pdgym-train`: train a learned scheduler at one decision point with Stable-Baselines3 / sb3-contrib.

    pdgym-train                                      # MaskablePPO on DecodeRouting-v0 (conf/train.yaml)
    pdgym-train env=prefill_dispatch agent=ppo total_timesteps=50000 n_envs=4
    pdgym-train experiment=decode_bc_maskable_ppo    # a recipe of conf/experiment/
    pdgym-train -m hydra/launcher=joblib agent=ppo,maskable_ppo seed=0,1,2

Everything lands in runs/train/<date>/<name>/: config.yaml (resolved), agent.json (what evaluation
needs to rebuild the observation), checkpoints/, best_model.zip (best on the validation split),
final_model.zip, eval_history.csv, metrics.json, plots, TensorBoard logs (tb/) and the offline
wandb run (wandb/). Running the same name again resumes from its last checkpoint (`resume: auto`).

Traffic: training episodes use the `train` split (conf/splits: seeds from 1000, the first 45% of a
trace's rows, each vector env cycling through its own segments), best-model selection the `val`
split; pdgym-eval and the leaderboard use `test`. Evaluation runs the agent through its env's
`AgentPolicy` inside `simulate()`, the same code path as every baseline.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.metric_keys import METRIC_KEYS
from pdgym.agents.evaluation.runner import evaluate
from pdgym.agents.learned import model_store as M
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import atomic_path, write_json

from . import callbacks as C
from . import curves, run_files
from .env_factory import env_factories, env_kwargs, make_vec_env, probe, scenario_raw
from .schema import AgentSchema, EnvSchema, TrainSchema, identity, identity_diff, register_resolvers, validate

register_resolvers()  # ${pdgym_run_hash:} in conf/train.yaml's default run name


# --------------------------------------------------------------------------- training
def _eval_fn(env: EnvSchema, raw: dict, split: dict, seeds: list[int], algo: str, vec_norm):
    """Held-out evaluation of the model being trained, through simulate() and the env's AgentPolicy."""
    meta = {"env_id": env.id, "point": env.point, "env_kwargs": env_kwargs(env, env.overrides)}

    def run(model) -> dict:
        agent = candidates.LoadedAgent(Path("."), meta, M.predictor(model.policy, algo, vec_norm))
        cand = candidates.Candidate("current", "agent", env.point, agent=agent)
        t0 = time.perf_counter()
        print(f"held-out evaluation at step {model.num_timesteps}: {len(seeds)} validation seed(s)", flush=True)

        def seed_done(done: int, total: int) -> None:  # training's bar is live: a line per seed, not a bar
            print(f"  held-out seed {done}/{total} done, {time.perf_counter() - t0:.0f} s", flush=True)

        ev = evaluate(raw, cand, seeds, split, others=raw["policy"], on_seed=seed_done)
        stopped = {s: m["stopped"] for s, m in zip(ev.seeds, ev.per_seed) if m["stopped"]}
        for s, why in stopped.items():
            print(f"  held-out seed {s} stopped early: {why}", flush=True)
        return {**ev.stats(), C.STOPPED: stopped}

    return run


def _logger(out: Path, wandb_run, resumed_at: int | None):
    """SB3's logger: progress.csv (kept up to `resumed_at` when resuming), TensorBoard in tb/, wandb if on."""
    from stable_baselines3.common.logger import Logger, TensorBoardOutputFormat

    tb = safe_files.make_dir(out / "tb", "hydra.run.dir")
    formats = [run_files.progress_writer(out, resumed_at), TensorBoardOutputFormat(str(tb))]
    if wandb_run is not None:
        from .wandb_utils import WandbWriter

        formats.append(WandbWriter(wandb_run))
    return Logger(str(out), formats)


# What a training run leaves in its folder that a fresh start there would mix with its own outputs.
EARLIER_RUN = (candidates.AGENT_META, "checkpoints", "best_model.zip", "final_model.zip", run_files.HISTORY)


def resume_point(app: TrainSchema, env: EnvSchema, data: dict, out: Path) -> Path | None:
    """The checkpoint this run continues (None: a fresh start). With `resume: auto` the run directory
    must hold this very configuration: a different one stops here, before anything is written, as does a file
    there this run would read back and cannot (run_files.check_earlier)."""
    if app.resume not in ("never", "auto") and not Path(app.resume).is_file():
        raise ConfigError(f"resume: {app.resume!r} is not a checkpoint file (or use auto / never)")
    if app.resume == "never":
        earlier = [n for n in EARLIER_RUN if os.path.lexists(out / n)]
        if earlier:
            raise ConfigError(f"resume: never, but {out} holds an earlier training run ({', '.join(earlier)}): its "
                              "best model, history and checkpoints would mix with this run's; give another name= (or "
                              "hydra.run.dir=) to start over, or resume=auto to continue it")
    ckpt = None if app.resume == "never" else Path(app.resume) if app.resume != "auto" else _auto_resume(data, out)
    if out.is_dir():  # what this run reads back from an earlier one there, checked before anything is written
        run_files.check_earlier(out, env.primary, resuming=ckpt is not None)
    return ckpt


def _auto_resume(data: dict, out: Path) -> Path | None:
    """`resume: auto`: the last complete checkpoint of a run folder holding this very configuration."""
    meta_path, ckpts = out / candidates.AGENT_META, M.checkpoints(out / "checkpoints")
    old = candidates.read_agent_meta(out, "resume").get("identity") if os.path.lexists(meta_path) else None
    if old is None and ckpts:
        raise ConfigError(f"resume: {out} holds checkpoints but no recorded configuration (an older pdgym run); "
                          "give another name= to start over")
    if old is not None:
        diff = identity_diff(old, identity(data))
        if diff:
            shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
            raise ConfigError(f"resume: {out} was trained with another configuration (differs in {shown}); "
                              "give another name= to start over")
    if not ckpts:
        return None
    ckpt = M.latest_complete(out / "checkpoints")
    if ckpt is None:
        raise ConfigError(f"resume: no complete checkpoint in {out / 'checkpoints'} ({len(ckpts)} damaged); give "
                          "another name= to start over")
    return ckpt


def build_model(app: TrainSchema, agent: AgentSchema, venv, ckpt: Path | None):
    """The model (fresh, or restored from `ckpt`), its vector env (under VecNormalize if asked), the
    VecNormalize (or None) and the Saver that writes it (model_store: plain data, no pickle)."""
    from stable_baselines3.common.vec_env import VecNormalize

    cls = M.algo_class(agent.algo)
    vec_norm = None
    if app.normalize.obs or app.normalize.reward:
        venv = vec_norm = VecNormalize(venv, norm_obs=app.normalize.obs, norm_reward=app.normalize.reward,
                                       clip_obs=app.normalize.clip_obs, gamma=app.normalize.gamma)
    spec = M.NetSpec.from_env(agent.algo, agent.policy, agent.features, agent.net_arch, probe(venv))
    try:
        model = cls(spec.policy_class(), venv, seed=app.seed, device="cpu", verbose=0,
                    policy_kwargs=spec.policy_kwargs(), **agent.kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"agent.kwargs: {str(exc).splitlines()[0]}") from None
    if ckpt is not None:
        M.restore(model, ckpt, vec_norm)
    return model, venv, vec_norm, M.Saver(spec, vec_norm)


def train(data: dict, out: Path) -> dict:
    """Train from a composed config (plain dict); returns the run summary written to metrics.json."""
    import torch

    from . import imitation, wandb_utils

    t0 = time.perf_counter()
    app, env, agent = validate(data)
    out = Path(out)
    resumed = resume_point(app, env, data, out)  # checks the run directory before anything is written
    torch.set_num_threads(app.torch_threads)
    raw = scenario_raw(env)
    train_split = data["splits"]["train"]
    venv = make_vec_env(app, env, raw, train_split)
    try:
        model, venv, vec_norm, saver = build_model(app, agent, venv, resumed)
    except BaseException:
        venv.close()
        raise
    out.mkdir(parents=True, exist_ok=True)
    from omegaconf import OmegaConf

    with atomic_path(out / run_files.CONFIG) as tmp:  # replaced, never written through a link an earlier run left
        tmp.write_text(OmegaConf.to_yaml(data))
    meta = {"name": app.name, "algo": agent.algo, "env_id": env.id, "point": env.point, "scenario": env.scenario,
            "overrides": env.overrides, "env_kwargs": env_kwargs(env, env.overrides),
            "policies": env.policies, "primary": env.primary,
            "seed": app.seed, "splits": data["splits"], "identity": identity(data)}
    write_json(out / candidates.AGENT_META, meta)
    if resumed is not None:
        print(f"{app.name}: resuming from {resumed} at step {model.num_timesteps}", flush=True)

    run_id_file = out / run_files.WANDB_ID
    wrun = wandb_utils.init(data.get("wandb") or {}, out, data, app.name,
                            run_files.wandb_id(out) if resumed else None)
    if wrun is not None:
        with atomic_path(run_id_file) as tmp:
            tmp.write_text(wrun.id)
    model.set_logger(_logger(out, wrun, int(model.num_timesteps) if resumed is not None else None))

    bc_stats = None
    if agent.bc.teacher and resumed is None:
        factory = env_factories(env, raw, train_split, 1, 8)[0]
        # a line before and after: off a terminal the bar is off, and cloning takes most of a short run's time
        print(f"BC: cloning {agent.bc.teacher} (up to {agent.bc.max_steps} decisions of {agent.bc.episodes} "
              f"episodes, {agent.bc.epochs} epochs)", flush=True)
        bc_stats = imitation.warm_start(model, env, factory, train_split, agent.bc, vec_norm, app.seed,
                                        progress=app.progress)
        print(f"BC: {bc_stats['samples']} decisions, held-out accuracy {bc_stats['val_accuracy']:.3f}, "
              f"{bc_stats['wall_time_s']:.0f} s", flush=True)
        write_json(out / "bc.json", bc_stats)

    val_split = data["splits"][app.eval.split]
    evaluator = C.HeldOutEval(_eval_fn(env, raw, val_split, app.eval.seeds, agent.algo, vec_norm), app.eval.freq,
                              env.primary, out, saver)
    ckpt = C.CheckpointEvery(app.checkpoint_freq, safe_files.make_dir(out / "checkpoints", "hydra.run.dir"), saver)
    log = C.ProgressLog(app.total_timesteps, app.log_freq or max(1, app.total_timesteps // 20), app.name, evaluator)
    done = int(model.num_timesteps)
    remaining = max(0, app.total_timesteps - done)
    if bc_stats is not None:  # the warm-started policy is the first candidate for the best model
        evaluator.init_callback(model)
        evaluator.run()
    if not remaining and app.total_timesteps == 0:
        print(f"{app.name}: total_timesteps=0: the behaviour-cloned policy only (no reinforcement-learning step)",
              flush=True)
    elif not remaining:
        print(f"{app.name}: already at step {done} of total_timesteps={app.total_timesteps}; nothing to train",
              flush=True)
    else:
        model.learn(remaining, callback=[C.EpisodeMetricsCallback(), log, evaluator, ckpt],
                    progress_bar=app.progress and sys.stdout.isatty(), reset_num_timesteps=resumed is None)
    ckpt.init_callback(model)
    ckpt.save()
    saver(model, out / "final_model.zip")
    if evaluator.last != model.num_timesteps or evaluator.last_stats is None:
        evaluator.init_callback(model)
        evaluator.run()
    final = evaluator.last_stats
    best = run_files.best(out, env.primary)
    best_val = best["metrics"][env.primary]["mean"] if best else final[env.primary]["mean"]
    summary = {"name": app.name, "algo": agent.algo, "env_id": env.id, "timesteps": int(model.num_timesteps),
               "resumed_from": str(resumed) if resumed else None, "bc": bc_stats, "primary": env.primary,
               "objective": best_val, "best_timesteps": best["timesteps"] if best else None,
               "val_final": {k: final[k]["mean"] for k in METRIC_KEYS},
               "wall_time_s": time.perf_counter() - t0}
    write_json(out / "metrics.json", summary)
    try:  # the figure is a by-product: a log it cannot read costs the figure, not the trained run
        curves.run_curves(out, env.primary)
    except ConfigError as exc:
        print(f"{app.name}: curves.png not drawn: {exc}", flush=True)
    venv.close()
    if wrun is not None:
        wrun.summary.update({f"val_final/{k}": v for k, v in summary["val_final"].items()
                             if v is not None and math.isfinite(v)})
        wrun.finish()
    return summary


def train_from_overrides(overrides: list[str], out: Path, name: str | None = None) -> dict:
    """Compose conf/train.yaml with overrides (outside the command line) and train into `out`."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from pdgym.agents.common import to_container

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module("pdgym.conf", version_base=None):
        try:
            cfg = compose(config_name="train", overrides=[*overrides, f"name={name or Path(out).name}"])
        except HydraException as exc:
            raise ConfigError(f"train overrides: {str(exc).splitlines()[0]}") from None
    return train(to_container(cfg), out)


def kept_line(s: dict) -> str:
    """Which model best_model.zip is, in words: a run whose RL steps never beat its behaviour-cloned start on
    validation ships the clone, and says so (the default run did: 2,048 MaskablePPO steps, best at step 0)."""
    best, primary = s.get("best_timesteps"), s["primary"]
    value = f"{primary} {s['objective']:.6g} on validation"
    if best == 0 and s.get("bc"):
        steps = s["timesteps"]
        return (f"best model: the behaviour-cloned policy (step 0, a clone of {s['bc']['teacher']}): "
                + (f"the {steps} RL steps never beat it ({value}); more total_timesteps or another agent may"
                   if steps else f"no RL step ran ({value})"))
    return f"best model: step {best} of {s['timesteps']} ({value})"


def _task(cfg) -> float | None:
    """One training run in Hydra's run directory (looked up by name: launchers may run it elsewhere)."""
    from pdgym.agents.common import run_dir, to_container
    from pdgym.envs.sim.shell import app_command

    data = to_container(cfg)
    s = train(data, run_dir())
    print(f"{s['name']}: {s['timesteps']} steps in {s['wall_time_s']:.0f} s; run in {run_dir()}")
    print(kept_line(s))
    env = validate(data)[1]  # the next step: the test windows of the scenario it was trained on
    print(f"evaluate it: {app_command('pdgym-eval')} policy={run_dir()} scenario={env.scenario}"
          + (f"  (trained with {' '.join(env.overrides)})" if env.overrides else ""))
    return s["objective"]  # for sweepers (Optuna): the best validation value of env.primary


def _check(cfg) -> None:
    """Before Hydra touches the run directory: the config's values, and that an existing run directory
    of this name holds the same configuration (Hydra would rewrite its .hydra/ files otherwise)."""
    from hydra.core.hydra_config import HydraConfig
    from pdgym.agents.common import to_container

    data = to_container(cfg)
    app, env, _ = validate(data)
    out = Path(str(HydraConfig.get().run.dir))
    if out.is_dir():
        resume_point(app, env, data, out)


def unused_keys() -> dict[str, str]:
    """Root-config keys pdgym-train composes but never reads (the env's scenario is composed anew from env.scenario
    and env.overrides), each with what to use instead: refused, not dropped."""
    from pdgym.agents.common import SIM_KEYS

    traffic = "the env's scenario sets the training traffic: scenario=NAME, and env.overrides=[KEY=VALUE,...] to change it"
    return {**{k: traffic for k in (*SIM_KEYS, "memory_limit_gb")},
            "policy": "the baselines at the other decision points are env.policies (env.policies.prefill=NAME)",
            "compare": "policy sets head to head are pdgym-sim's", "plots": "pdgym-train always draws curves.png",
            "tables": "pdgym-train writes no request tables", "trace": "pdgym-train writes no trace"}


def main(argv: list[str] | None = None) -> float | None:
    """pdgym-train: one-line errors, no run folder before the config composes (agents/front_door.hydra_cli)."""
    from pdgym.agents.front_door import hydra_cli

    return hydra_cli("pdgym-train", "train", validate=_check, unused=unused_keys())(_task)(argv)


if __name__ == "__main__":
    sys.exit(main())
