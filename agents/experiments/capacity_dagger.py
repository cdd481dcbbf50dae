"""A residual capacity controller taught by DAgger (issue 43, after BC + PPO fell short: docs/agents.md, "Elastic
P/D capacity"): the rule's action is an input, and an untrained policy plays the rule exactly.

`ResidualPolicy`: logits = MLP(observation, one-hot of the rule's action) + `prior` x that one-hot, the MLP's last
layer initialised to zero, masked actions at -inf; so at initialisation the argmax is the rule's action on every
state, and training moves it off the rule only where the data says so (the clone of plain BC had to learn the
rule's rare, decisive actions from scratch and drifted off its states).

`dagger`: the teacher (by default `mpc_true`, MPC with the true future: the better teacher than the rule, +42% on
diurnal_bursts) labels the states the learner itself visits on the training days (DAgger, Ross et al. 2011); the
first batch is the teacher's own days. After each round of training the learner plays the training days; the round
with the best mean training reward is kept, the untrained policy (= the rule) included, so the selection never sees
a held-out day.
"""

from __future__ import annotations

import numpy as np
import torch
from pdgym.envs.capacity_control import CapacityControlEnv
from pdgym.envs.sim.capacity import ACTIONS

N_ACT = len(ACTIONS)


class ResidualPolicy(torch.nn.Module):
    """The rule's action plus learned corrections (the module docstring)."""

    def __init__(self, n_obs: int, hidden: int = 64, prior: float = 4.0):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(n_obs + N_ACT, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, N_ACT))
        torch.nn.init.zeros_(self.net[-1].weight)
        torch.nn.init.zeros_(self.net[-1].bias)
        self.prior = float(prior)

    def logits(self, obs: torch.Tensor, rule: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(rule, N_ACT).float()
        z = self.net(torch.cat([obs, onehot], -1)) + self.prior * onehot
        return z.masked_fill(~mask, -torch.inf)

    @torch.no_grad()
    def act(self, obs: np.ndarray, rule: int, mask: np.ndarray) -> int:
        z = self.logits(torch.as_tensor(obs[None], dtype=torch.float32), torch.tensor([rule]),
                        torch.as_tensor(mask[None]))
        return int(z.argmax(-1))


def play_days(env: CapacityControlEnv, rule, days: list[int], policy: ResidualPolicy | None = None,
              teacher=None) -> tuple[list[dict], dict]:
    """Each day under `policy` (None: the teacher plays), the rule's action fed in; every state labelled with the
    teacher's action when there is one. Returns the days' summaries and the labelled states."""
    obs, rules, masks, labels, out = [], [], [], [], []
    for d in days:
        o, _ = env.reset(options={"day": d})
        rule.reset(env.run)
        if teacher is not None:
            teacher.reset(env.run)
        done = False
        while not done:
            m = env.action_masks()
            ra = int(rule.act(env.run))
            ta = int(teacher.act(env.run)) if teacher is not None else -1
            a = ta if policy is None else policy.act(o, ra, m)
            obs.append(o)
            rules.append(ra)
            masks.append(m)
            labels.append(ta)
            o, _, done, _, info = env.step(a)
        out.append(info["summary"])
    data = {"obs": np.array(obs, np.float32), "rule": np.array(rules), "mask": np.array(masks, bool),
            "label": np.array(labels)}
    return out, data


def fit(policy: ResidualPolicy, data: dict, epochs: int, lr: float, gen: torch.Generator) -> float:
    """Cross-entropy toward the teacher's labels on all the states gathered so far; returns the label accuracy."""
    o = torch.as_tensor(data["obs"])
    r = torch.as_tensor(data["rule"])
    m = torch.as_tensor(data["mask"])
    y = torch.as_tensor(data["label"])
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    for _ in range(epochs):
        for idx in torch.randperm(len(o), generator=gen).split(256):
            loss = torch.nn.functional.cross_entropy(policy.logits(o[idx], r[idx], m[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return float((policy.logits(o, r, m).argmax(-1) == y).float().mean())


def dagger(env: CapacityControlEnv, rule, teacher, days: list[int], rounds: int, epochs: int, lr: float,
           hidden: int, prior: float, seed: int, log=print) -> tuple[ResidualPolicy, ResidualPolicy, list[dict]]:
    """DAgger rounds (the module docstring); returns the best round's policy, the last round's, and one record per
    round."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = ResidualPolicy(env.observation_space.shape[0], hidden, prior)
    rule_days, _ = play_days(env, rule, days, policy)  # the untrained policy: the rule itself
    _, data = play_days(env, rule, days, None, teacher)
    best_r = float(np.mean([s["reward"] for s in rule_days]))
    best = {k: v.clone() for k, v in policy.state_dict().items()}
    history = [{"round": 0, "train_reward": best_r, "label_accuracy": float("nan"), "states": len(data["label"])}]
    log(f"capacity_dagger: round 0 (the rule) train reward {best_r:.0f}")
    for k in range(1, rounds + 1):
        acc = fit(policy, data, epochs, lr, gen)
        days_k, new = play_days(env, rule, days, policy, teacher)
        r = float(np.mean([s["reward"] for s in days_k]))
        data = {key: np.concatenate([data[key], new[key]]) for key in data}
        history.append({"round": k, "train_reward": r, "label_accuracy": acc, "states": len(data["label"])})
        log(f"capacity_dagger: round {k} label accuracy {acc:.3f}, train reward {r:.0f}")
        if r > best_r:
            best_r, best = r, {key: v.clone() for key, v in policy.state_dict().items()}
    kept = ResidualPolicy(env.observation_space.shape[0], hidden, prior)
    kept.load_state_dict(best)
    return kept, policy, history
