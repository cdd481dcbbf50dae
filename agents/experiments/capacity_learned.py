"""A learned capacity controller (issue 43 item 3): behaviour cloning of the board's best tuned rule, then masked
PPO, on the training days; evaluated against that rule on the held-out days 10-14, paired (docs/results.md,
"Elastic P/D capacity").

The env is pdgym/CapacityControl-v0 on `repro.board` with the calendar forecast in the observation (forecast=true:
the day's diurnal curve a cold start ahead; bursts and mix phases stay unknown). BC: `repro.bc_days` x the rule's
decisions (obs, action), cross-entropy on the masked policy for `repro.bc_epochs`. PPO (sb3-contrib MaskablePPO)
continues from the cloned policy for `repro.ppo_steps` timesteps on the training days 0-9. Both the cloned and the
fine-tuned policy play the held-out days deterministically; differences of the episode reward against the rule are
paired by day with 95% bootstrap intervals. The model zip is written to the run folder (model.zip).

`repro.method=dagger` replaces BC + PPO by the residual policy of capacity_dagger.py (the rule's action in, the rule
exactly at initialisation), taught by `repro.dagger.teacher` (MPC with the true future) on the states it visits on
the training days; rows `residual_init` (must equal the reference), `dagger` (the kept round) and
`dagger_last_round`; the kept round's weights in residual_policy.npz, the rounds' training rewards in rounds.csv.

    pdgym-repro capacity_learned repro.board=diurnal_bursts
    pdgym-repro capacity_learned repro.method=dagger
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from pdgym.agents.evaluation.stats import interval, paired_ratio
from pdgym.baselines.capacity_hindsight import HINDSIGHT_ROWS, MPC_TEACHERS
from pdgym.baselines.capacity_rules import CAPACITY_RULES
from pdgym.envs.capacity_control import CapacityControlEnv
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.capacity_traffic import CAPACITY_SEEDS
from pdgym.envs.sim.validation import check, check_float, check_int
from sb3_contrib import MaskablePPO

from .capacity_dagger import ResidualPolicy, dagger, play_days
from .capacity_room import play
from .harness import Experiment, experiment

METHODS = ("ppo", "dagger")


def check_block(block) -> None:
    """repro.method and the repro.dagger block, in one line each, before any run folder exists."""
    check(block.get("method") in METHODS, "repro.method", f"got {block.get('method')!r}; allowed: {', '.join(METHODS)}")
    check(block.get("reference", {}).get("name") in CAPACITY_RULES, "repro.reference.name",
          f"got {block.get('reference', {}).get('name')!r}; allowed: {', '.join(CAPACITY_RULES)}")
    d = block.get("dagger") or {}
    teachers = {**HINDSIGHT_ROWS, **MPC_TEACHERS}
    check(d.get("teacher") in teachers, "repro.dagger.teacher", f"got {d.get('teacher')!r}; allowed: {', '.join(teachers)}")
    for key in ("rounds", "epochs", "hidden", "mpc_horizon"):
        check_int(d.get(key), f"repro.dagger.{key}", lo=1)
    check_float(d.get("lr"), "repro.dagger.lr", lo_open=True)
    check_float(d.get("prior"), "repro.dagger.prior")


def teacher_of(d):
    name = str(d.teacher)
    if name in MPC_TEACHERS:
        return MPC_TEACHERS[name](horizon=int(d.mpc_horizon))
    return HINDSIGHT_ROWS[name]()


def rule_dataset(env: CapacityControlEnv, rule, days: list[int]):
    """The rule's decisions through the env: observations, actions, masks."""
    obs, act, masks = [], [], []
    for d in days:
        o, _ = env.reset(options={"day": d})
        rule.reset(env.run)
        done = False
        while not done:
            a = rule.act(env.run)
            obs.append(o)
            act.append(a)
            masks.append(env.action_masks())
            o, _, done, _, _ = env.step(a)
    return np.array(obs), np.array(act), np.array(masks)


def clone(model: MaskablePPO, obs, act, masks, epochs: int, seed: int) -> float:
    """Cross-entropy of the masked policy on the rule's actions; returns the final accuracy."""
    pol = model.policy
    opt = torch.optim.Adam(pol.parameters(), lr=1e-3)
    o = torch.as_tensor(obs, dtype=torch.float32)
    a = torch.as_tensor(act)
    m = torch.as_tensor(masks)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(o), generator=g).split(256):
            _, logp, _ = pol.evaluate_actions(o[idx], a[idx], action_masks=m[idx])
            loss = -logp.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        dist = pol.get_distribution(o, action_masks=m.numpy())
        return float((dist.distribution.probs.argmax(-1) == a).float().mean())


def play_agent(env: CapacityControlEnv, model: MaskablePPO, day: int) -> dict:
    o, _ = env.reset(options={"day": day})
    done = False
    while not done:
        a, _ = model.predict(o, action_masks=env.action_masks(), deterministic=True)
        o, _, done, _, info = env.step(int(a))
    return info["summary"]


def setup(p) -> tuple:
    """What both methods start from: the board, the reference rule (class, parameters), the training env, the
    held-out env (forecast in the observation) and the held-out days."""
    board = str(p.board)
    train = CapacityControlEnv(board, days="train", forecast=True)
    evalenv = CapacityControlEnv(board, days=CAPACITY_SEEDS["test"], forecast=True)
    return (board, CAPACITY_RULES[str(p.reference.name)], dict(p.reference.params), train, evalenv,
            [int(s) for s in p.seeds])


@experiment(check=check_block)
def run(exp: Experiment) -> dict:
    p = exp.p
    if str(p.method) == "dagger":
        return run_dagger(exp)
    board, ref_cls, ref_params, train, evalenv, seeds = setup(p)
    assert not set(seeds) & set(CAPACITY_SEEDS["train"]), "held-out days overlap the training days"
    torch.manual_seed(exp.seed)
    torch.set_num_threads(1)  # a 128x128 MLP: torch's thread pool only spins (5x fewer PPO steps per CPU second)
    model = MaskablePPO("MlpPolicy", train, n_steps=int(p.n_steps), batch_size=256, learning_rate=float(p.lr),
                        gamma=float(p.gamma), ent_coef=float(p.ent_coef), seed=exp.seed, verbose=0,
                        policy_kwargs={"net_arch": [128, 128]})
    obs, act, masks = rule_dataset(train, ref_cls(**ref_params), [int(d) for d in p.bc_days])
    acc = clone(model, obs, act, masks, int(p.bc_epochs), exp.seed)
    print(f"capacity_learned: BC accuracy {acc:.3f} on {len(act)} decisions", flush=True)
    rows = {"reference": [play(evalenv.model, ref_cls(**ref_params), s) for s in seeds],
            "bc": [play_agent(evalenv, model, s) for s in seeds]}
    if int(p.ppo_steps) > 0:
        model.learn(total_timesteps=int(p.ppo_steps))
        rows["bc_ppo"] = [play_agent(evalenv, model, s) for s in seeds]
    model.save(exp.path("model.zip"))
    out = compare(exp, rows)
    return {"board": board, "seeds": seeds, "bc_accuracy": acc,
            "rows": {r["row"]: [r["reward"], r["vs_reference"], r["rel_lo"], r["rel_hi"]] for r in out}}


def compare(exp: Experiment, rows: dict) -> list[dict]:
    """Each row's episode rewards paired by day against the reference's; results.csv / results.md."""
    ref = np.array([m["reward"] for m in rows["reference"]])
    out = []
    for k, ms in rows.items():
        v = np.array([m["reward"] for m in ms])
        pr, d = paired_ratio(v, ref), interval(v - ref)
        out.append({"row": k, "reward": float(v.mean()), "gpu_seconds": float(np.mean([m["gpu_seconds"] for m in ms])),
                    "slo_attainment": float(np.mean([m["slo_attainment"] for m in ms])),
                    "goodput_per_gpu": float(np.mean([m["goodput_per_gpu"] for m in ms])),
                    "vs_reference": pr["rel"], "rel_lo": pr["ci_low"], "rel_hi": pr["ci_high"],
                    "diff_lo": d["ci_low"], "diff_hi": d["ci_high"]})
    exp.table(pd.DataFrame(out))
    return out


def run_dagger(exp: Experiment) -> dict:
    """The residual policy taught by DAgger on the training days, then the held-out days against the rule."""
    p, d = exp.p, exp.p.dagger
    board, ref_cls, ref_params, train, evalenv, seeds = setup(p)
    days = [int(x) for x in p.bc_days]
    assert not set(seeds) & set(days), "held-out days overlap the training days"
    torch.set_num_threads(1)
    init = ResidualPolicy(train.observation_space.shape[0], int(d.hidden), float(d.prior))
    rows = {"reference": [play(evalenv.model, ref_cls(**ref_params), s) for s in seeds],
            "residual_init": play_days(evalenv, ref_cls(**ref_params), seeds, init)[0]}
    policy, last, history = dagger(train, ref_cls(**ref_params), teacher_of(d), days, int(d.rounds), int(d.epochs),
                             float(d.lr), int(d.hidden), float(d.prior), exp.seed,
                             log=lambda s: print(s, flush=True))
    rows["dagger"] = play_days(evalenv, ref_cls(**ref_params), seeds, policy)[0]
    rows["dagger_last_round"] = play_days(evalenv, ref_cls(**ref_params), seeds, last)[0]
    rows[str(d.teacher)] = [play(evalenv.model, teacher_of(d), s) for s in seeds]
    with safe_files.atomic_path(exp.path("residual_policy.npz")) as tmp, open(tmp, "wb") as f:
        np.savez(f, **{k: v.numpy() for k, v in policy.state_dict().items()})
    exp.csv(pd.DataFrame(history), "rounds.csv")
    out = compare(exp, rows)
    best = max(history, key=lambda h: h["train_reward"])["round"]
    return {"board": board, "seeds": seeds, "method": "dagger", "teacher": str(d.teacher), "kept_round": best,
            "rows": {r["row"]: [r["reward"], r["vs_reference"], r["rel_lo"], r["rel_hi"]] for r in out}}
