"""Behaviour cloning: warm-start a policy-gradient agent from a baseline's decisions, then fine-tune by RL.

RL on routing collapses from scratch (a random router overloads a worker long before any reward says
why), so the agent first imitates a strong heuristic (BR-0, PBAA, EB*). The teacher's decisions are
collected *through the same env* the agent trains in: at each decision the env translates what the
teacher policy would do into the env's action (`teacher_action`), the env steps with it, and we keep
(observation, action mask, action, discounted return). The policy head is then fitted by maximum
likelihood (masked for MaskablePPO) and the value head by regression on the returns, so PPO starts from
the teacher's behaviour with a critic that already knows its value.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from pdgym.envs.sim.config import ConfigError
from torch import nn


def teacher_action(env, teacher) -> int:
    """The env's action that reproduces what `teacher` (a policy object of the env's decision point)
    would do at the current decision; the env implements it because only it knows its action encoding."""
    fn = getattr(env, "teacher_action", None) or getattr(env.unwrapped, "teacher_action", None)
    if fn is None:
        raise ConfigError(f"agent.bc.teacher: {type(env.unwrapped).__name__} has no teacher_action(policy) "
                          "method, so a baseline's decisions cannot be collected through it")
    return int(fn(teacher))


def collect(make_env, teacher_spec, point: str, episodes: int, max_steps: int, gamma: float, seed: int,
            progress: bool = False) -> dict:
    """Run the teacher through the env for `episodes` episodes (or `max_steps` decisions)."""
    from pdgym.baselines import make_policy
    from tqdm import tqdm

    env = make_env()
    obs_l, mask_l, act_l, ret_l, ep_returns = [], [], [], [], []
    bar = tqdm(total=max_steps, desc=f"BC: collecting {teacher_spec}", disable=not progress or None, leave=False)
    n = 0
    for ep in range(episodes):
        teacher = make_policy(point, teacher_spec)
        obs, _ = env.reset(seed=seed + ep)
        rewards = []
        done = False
        while not done and n < max_steps:
            mask = np.asarray(env.action_masks(), dtype=bool)
            a = teacher_action(env, teacher)
            obs_l.append(obs)
            mask_l.append(mask)
            act_l.append(a)
            obs, r, term, trunc, _ = env.step(a)
            rewards.append(float(r))
            done = term or trunc
            n += 1
            bar.update(1)
        g, rets = 0.0, []
        for r in reversed(rewards):
            g = r + gamma * g
            rets.append(g)
        ret_l.extend(reversed(rets))
        ep_returns.append(sum(rewards))
        if n >= max_steps:
            break
    bar.close()
    env.close()
    if not act_l:
        raise ConfigError("agent.bc: the teacher produced no decisions (episodes or max_steps too small?)")
    return {"obs": np.asarray(obs_l, dtype=np.float32), "mask": np.asarray(mask_l, dtype=bool),
            "act": np.asarray(act_l, dtype=np.int64), "ret": np.asarray(ret_l, dtype=np.float32),
            "episode_returns": ep_returns}


def _log_prob_values(policy, obs, act, mask, masked: bool):
    if masked:
        values, logp, _ = policy.evaluate_actions(obs, act, action_masks=mask)
    else:
        values, logp, _ = policy.evaluate_actions(obs, act)
    return values.flatten(), logp


def _accuracy(policy, obs, act, mask, masked: bool) -> float:
    with torch.no_grad():
        dist = policy.get_distribution(obs, action_masks=mask) if masked else policy.get_distribution(obs)
        logits = dist.distribution.logits
        logits = logits.masked_fill(~mask, -1e9)
        return float((logits.argmax(-1) == act).float().mean())


def fit(model, data: dict, epochs: int, batch_size: int, lr: float, value_coef: float, seed: int,
        balance: bool = False) -> dict:
    """Maximum-likelihood fit of the policy to the teacher actions (+ value regression); 10% held out.

    `balance` weights each decision by the inverse frequency of its action, so rare decisions that matter
    (a prefill scheduler's releases among many holds) are not drowned by the common one."""
    policy = model.policy
    masked = type(model).__name__ == "MaskablePPO"
    g = torch.Generator().manual_seed(seed)
    n = len(data["act"])
    perm = torch.randperm(n, generator=g)
    n_val = max(1, n // 10) if n >= 20 else 0
    val, tr = perm[:n_val], perm[n_val:]
    obs = torch.as_tensor(data["obs"])
    act = torch.as_tensor(data["act"])
    mask = torch.as_tensor(data["mask"])
    ret = torch.as_tensor(data["ret"])
    ret_scale = max(float((ret**2).mean()), 1e-12)  # the untrained critic's error is about this
    counts = torch.bincount(act[tr], minlength=int(act.max()) + 1).float() if n else torch.ones(1)
    weight = (1.0 / counts.clamp_min(1.0))[act] if balance else torch.ones(n)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    policy.set_training_mode(True)
    loss_v = math.nan
    for _ in range(epochs):
        order = tr[torch.randperm(len(tr), generator=g)]
        for i in range(0, len(order), batch_size):
            b = order[i:i + batch_size]
            values, logp = _log_prob_values(policy, obs[b], act[b], mask[b], masked)
            # value error relative to the returns' scale, so the critic's gradients never drown the policy's
            w = weight[b]
            loss = -(w * logp).sum() / w.sum() + value_coef * nn.functional.mse_loss(values, ret[b]) / ret_scale
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            loss_v = loss.item()
    policy.set_training_mode(False)
    out = {"samples": n, "loss": loss_v, "train_accuracy": _accuracy(policy, obs[tr], act[tr], mask[tr], masked)}
    out["val_accuracy"] = _accuracy(policy, obs[val], act[val], mask[val], masked) if n_val else math.nan
    return out


def warm_start(model, env_cfg, factory, split: dict, bc, vec_norm, seed: int, progress: bool = False) -> dict:
    """Collect the teacher's decisions on the training split (envs built by `factory`) and clone them into `model`."""
    t0 = time.perf_counter()
    data = collect(factory, bc.teacher, env_cfg.point, bc.episodes, bc.max_steps, float(model.gamma),
                   int(split["seed_base"]) + 7919 * (seed + 1), progress)
    if vec_norm is not None:
        if vec_norm.norm_obs:  # start the running statistics from the teacher's states
            vec_norm.obs_rms.update(data["obs"])
            data["obs"] = vec_norm.normalize_obs(data["obs"]).astype(np.float32)
        if vec_norm.norm_reward:  # the critic would be fitted on another scale than PPO's
            bc.value_coef = 0.0
    stats = fit(model, data, bc.epochs, bc.batch_size, bc.lr, bc.value_coef, seed, bc.balance)
    stats.update(teacher=bc.teacher, episodes=len(data["episode_returns"]),
                 teacher_return_mean=float(np.mean(data["episode_returns"])), wall_time_s=time.perf_counter() - t0)
    return stats
