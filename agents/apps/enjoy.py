"""`pdgym-enjoy`: watch one policy run one episode of a scenario (rl-baselines3-zoo's `enjoy`).

    pdgym-enjoy policy=RUN_DIR_OR_BASELINE scenario=NAME workload.num_requests=40 every=2 hydra.run.dir=DIR

The policy is resolved as pdgym-eval resolves it (a pdgym-train run directory or model zip, or a baseline
name); the episode runs in the Gymnasium env of its decision point (render_mode "rgb_array"), a trained
agent through its saved network, a baseline through the env's `teacher_action` (the action that does
what the baseline would do; prefill and decode baselines). Every `every`-th decision, up to `max_frames`
(the episode's last state always among them), the cluster is drawn; each frame and its text say the action
taken there in words (PdgymEnv.describe_action: "route req 1234 (980 tok) -> worker 3", "SKIP req 77",
"release the short half ..."). DIR receives frames/frame_NNNN.png, episode.gif (Pillow, which matplotlib
brings), episode.txt (the same decisions as "ansi" text), decisions.txt (every decision, one line each: its
index, simulated time and action) and summary.json (episode return, decisions, requests resolved), each
written to a temporary name and renamed; summary.json comes last. `max_steps` bounds the episode, so an
agent that holds forever still ends.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np
from pdgym.agents.evaluation import candidates
from pdgym.agents.evaluation.evaluate import agent_traffic, check_no_seed, check_policy_given, check_split
from pdgym.agents.evaluation.evaluate import alias_policy_argv as eval_policy_argv
from pdgym.agents.evaluation.runner import agent_horizon, check_policies
from pdgym.envs import render as V
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.metrics import atomic_path
from pdgym.envs.sim.validation import check_bool, check_float, check_int
from pdgym.envs.splits import apply_split

APP = "pdgym-enjoy"
FRAMES = "frames"


def settings(data: dict) -> dict:
    """The checked settings of a composed conf/enjoy.yaml (one-line ConfigError otherwise)."""
    check_policy_given(data.get("enjoy_policy"))
    check_no_seed(data, "pdgym-enjoy replays run index=N of the split (e.g. index=5)")
    split_name = check_split(data)
    ints = {k: check_int(data.get(k), k, lo) for k, lo in
            (("index", 0), ("every", 1), ("max_frames", 1), ("max_steps", 1), ("batch", 1))}
    return {**ints, "fps": check_float(data.get("fps"), "fps", 0.0, 60.0, lo_open=True),
            "gif": check_bool(data.get("gif"), "gif"),
            "split": data["splits"][split_name] if split_name else None, "split_name": split_name}


def candidate(data: dict) -> candidates.Candidate:
    """The policy under test (candidates.resolve), refused up front if the env cannot replay it."""
    spec = data["enjoy_policy"]
    cand = candidates.resolve(spec if isinstance(spec, dict) else str(spec), data.get("point"))
    if cand.kind == "baseline" and not hasattr(_env_class(cand), "teacher_action"):
        raise ConfigError(f"policy: {cand.label!r} is a {cand.point} baseline, and {_env_module(cand).ENV_ID} cannot "
                          "replay baselines (no teacher_action); give a trained run, or run it with pdgym-sim")
    return cand


def _env_id(cand: candidates.Candidate) -> str:
    from pdgym.envs.sim.points import POINTS

    return cand.agent.meta["env_id"] if cand.agent is not None else POINTS[cand.point].env_id


def _env_module(cand: candidates.Candidate):
    return candidates.env_module(_env_id(cand))


def _env_class(cand: candidates.Candidate) -> type:
    from pdgym.envs.base import PdgymEnv

    mod = _env_module(cand)
    return next(c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, PdgymEnv)
                and c is not PdgymEnv and getattr(c, "ENV_ID", None) == mod.ENV_ID)


def validate(cfg) -> None:
    """Before Hydra makes a run folder: settings, the policy and the other points' baselines."""
    from pdgym.agents.common import sim_config_from, to_container

    data = to_container(cfg)
    settings(data)
    cand = candidate(data)
    check_policies({k: v for k, v in (data.get("policy") or {}).items() if k != cand.point})
    sim_config_from(data)


def make_env(data: dict, cand: candidates.Candidate, split: dict | None, index: int):
    """(the env of the candidate's point on the composed scenario, with run `index`'s split segment, seed)."""
    from pdgym.agents.common import SIM_KEYS
    from pdgym.baselines.registry import named_by_stored_file

    raw, seed = apply_split(data, split, index)
    if cand.kind == "agent" and not math.isfinite(float(raw.get("max_sim_time_s", math.inf))):
        raw = dict(raw, max_sim_time_s=agent_horizon(raw["workload"]))
    if cand.agent is not None:  # the agent's own env options (observation code, baselines elsewhere)
        kwargs = {k: v for k, v in cand.agent.meta["env_kwargs"].items() if k not in ("scenario", "overrides")}
    else:
        takes = _env_class(cand).env_keys()  # the other points' baselines it runs (a colocated env has no decode)
        kwargs = {k: v for k, v in (data.get("policy") or {}).items() if k != cand.point and k in takes}
    config = {k: raw[k] for k in SIM_KEYS if k in raw}
    with named_by_stored_file(cand.agent.source if cand.agent is not None else None):  # policies stored settings name
        env = candidates.make_env(_env_id(cand), scenario=data.get("scenario_name"), config=config, trace_split=None,
                                  render_mode="rgb_array", **kwargs)
    return env, seed


def _render(env, mode: str, chosen: str | None = None, step: int = 0):
    """The env's view as text or as an image (envs/render.py); with `chosen`, the action taken at decision
    `step`: in the image it replaces the list of allowed actions, the text keeps both."""
    if chosen is not None and mode == "rgb_array":
        u = env.unwrapped
        return V.to_rgb(V.cluster_view(u.sim, u.POINT, f"decision {step}: {chosen}"))
    env.render_mode = mode
    try:
        out = env.render()
    finally:
        env.render_mode = "rgb_array"
    return out if chosen is None else f"{out}chosen: {chosen}\n"


def _write_png(path: Path, img: np.ndarray) -> None:
    import matplotlib.image as mpimg

    mpimg.imsave(path, img, format="png")


def _write_gif(path: Path, frames: list[np.ndarray], fps: float) -> bool:
    try:
        from PIL import Image
    except ImportError:  # Pillow comes with matplotlib; without it, no GIF
        return False
    imgs = [Image.fromarray(f) for f in frames]
    with atomic_path(path) as tmp:
        imgs[0].save(tmp, format="GIF", save_all=True, append_images=imgs[1:], duration=int(1000 / fps), loop=0)
    return True


def replay(env, cand: candidates.Candidate, seed: int, s: dict, on_frame=None) -> dict:
    """Run one episode; returns {frames (RGB arrays), texts, return, decisions, end, summary, ...}."""
    policy = cand.build() if cand.kind == "baseline" else None
    obs, info = env.reset(seed=seed)
    u = env.unwrapped
    frames, texts, decisions, ret, steps, end = [], [], [], 0.0, 0, ""

    def draw(chosen: str | None = None, final: bool = False) -> None:
        if len(frames) >= s["max_frames"]:
            if not final:
                return
            frames.pop(), texts.pop()  # the last state replaces the newest sampled frame
        frames.append(_render(env, "rgb_array", chosen, steps))
        texts.append(_render(env, "ansi", chosen, steps))
        if on_frame is not None:
            on_frame(len(frames), steps, u.sim, chosen)

    done = bool(u._done)
    while not done:
        if steps >= s["max_steps"]:
            end = f"max_steps={s['max_steps']} decisions reached"
            break
        mask = np.asarray(env.action_masks(), dtype=bool)
        a = u.teacher_action(policy) if policy is not None else cand.agent.predict(obs, mask)
        chosen = u.describe_action(a, mask)
        decisions.append(f"{steps:>6}  t = {u.sim.now:9.3f} s  {chosen}")
        if steps % s["every"] == 0:
            draw(chosen)
        obs, r, term, trunc, info = env.step(a)
        ret += float(r)
        steps += 1
        done = term or trunc
        if trunc:
            end = "stalled (no progress for env.stall_s of simulated time)" if info.get("stalled") else "truncated"
        elif term:
            end = "every request resolved"
    draw(final=True)
    sim = u.sim
    return {"frames": frames, "texts": texts, "decisions_text": decisions, "return": ret, "decisions": steps, "end": end,
            "resolved": int(sim.n_resolved), "requests": int(sim.req.n), "finished": len(sim.completed),
            "invalid_actions": int(info.get("invalid_actions", 0)), "sim_time_s": float(sim.now),
            "summary": u.summary()}


def write_outputs(out: Path, ep: dict, s: dict) -> dict:
    """frames/ (a temporary folder renamed whole), episode.gif, episode.txt; returns their paths."""
    from pdgym.agents.common import inside
    from pdgym.envs.sim import safe_files

    out.mkdir(parents=True, exist_ok=True)
    inside(out, FRAMES)
    final = out / FRAMES
    tmp = safe_files.fresh_dir(out, FRAMES)  # fresh: no link planted there
    try:
        for i, img in enumerate(ep["frames"]):
            _write_png(tmp / f"frame_{i:04d}.png", img)  # names from the counter only
        if os.path.islink(final) or os.path.isfile(final):
            os.unlink(final)  # a link (or file) at frames/ is replaced, never followed
        elif final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    paths = {"frames": str(final), "n_frames": len(ep["frames"])}
    if s["gif"] and _write_gif(out / "episode.gif", ep["frames"], s["fps"]):
        paths["gif"] = str(out / "episode.gif")
    txt = out / "episode.txt"
    with atomic_path(txt) as tmp_txt:
        tmp_txt.write_text("\n".join(ep["texts"]))
    paths["text"] = str(txt)
    log = out / "decisions.txt"
    with atomic_path(log) as tmp_log:
        tmp_log.write_text("".join(f"{ln}\n" for ln in ep["decisions_text"]))
    paths["decisions_log"] = str(log)
    return paths


def _app(cfg) -> dict:
    from pdgym.agents.common import run_dir, to_container
    from pdgym.envs.sim.metrics import write_json

    data = to_container(cfg)
    s = settings(data)
    cand = candidate(data)
    scenario = data.get("scenario_name", "scenario")
    data = agent_traffic(data, cand, scenario, APP)  # as pdgym-eval: a transfer warns, a zoo agent meets its own traffic
    env, seed = make_env(data, cand, s["split"], s["index"])
    print(f"{APP}: {cand.label} ({cand.kind}, {cand.point}) on {scenario}, {s['split_name'] or 'no'} split, "
          f"index {s['index']}: a frame every {s['every']} decisions, at most {s['max_frames']}")

    def progress(n: int, steps: int, sim, chosen: str | None) -> None:
        if n % s["batch"] == 0:
            print(f"frames {n}: decision {steps}, t = {sim.now:.2f} s, {sim.n_resolved}/{sim.req.n} requests resolved"
                  + (f" | {chosen}" if chosen else ""), flush=True)

    try:
        ep = replay(env, cand, seed, s, progress)
    finally:
        env.close()
    out = run_dir()
    paths = write_outputs(out, ep, s)
    doc = {"scenario": scenario, "policy": cand.label, "kind": cand.kind, "point": cand.point,
           "source": str(cand.agent.path) if cand.agent else cand.spec, "split": s["split_name"], "index": s["index"],
           "episode_return": ep["return"], "decisions": ep["decisions"], "requests_resolved": ep["resolved"],
           "requests": ep["requests"], "finished": ep["finished"], "invalid_actions": ep["invalid_actions"],
           "sim_time_s": ep["sim_time_s"], "ended": ep["end"], **paths, "metrics": ep["summary"]}
    write_json(out / "summary.json", doc)
    print(f"episode return {ep['return']:.4g} | {ep['decisions']} decisions | {ep['resolved']}/{ep['requests']} "
          f"requests resolved ({ep['finished']} finished) | t = {ep['sim_time_s']:.2f} s | ended: {ep['end']}")
    print(f"{paths['n_frames']} frames in {paths['frames']}" + (f", {paths['gif']}" if "gif" in paths else "")
          + f"; summary in {out / 'summary.json'}")
    return doc


def alias_policy_argv(argv: list[str]) -> list[str]:
    """`policy=X` names the policy to watch (`policy` is also a config group): rewritten to `enjoy_policy`."""
    return [a.replace("eval_policy=", "enjoy_policy=", 1) if a.startswith("eval_policy=") else a
            for a in eval_policy_argv(argv)]


# Root-config keys pdgym-enjoy composes but never reads: refused, not dropped (agents/front_door.refuse_unused).
UNUSED = {"compare": "pdgym-enjoy replays one policy", "trace": "pdgym-enjoy writes no trace: pdgym-sim trace=true does",
          "tables": "pdgym-enjoy writes no request tables", "plots": "pdgym-enjoy draws frames and a GIF (gif=true|false)"}


def main(argv: list[str] | None = None) -> None:
    """pdgym-enjoy: one-line errors and no run folder on bad input (agents/front_door.hydra_cli)."""
    from pdgym.agents.front_door import hydra_cli

    hydra_cli(APP, "enjoy", validate=validate, rewrite_argv=alias_policy_argv, unused=UNUSED)(_app)(argv)


if __name__ == "__main__":
    main()
