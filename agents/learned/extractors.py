"""Feature extractors for the padded per-worker / per-instance observations of the pdgym envs.

The envs put one row of `per_slot_dim` features per worker (DP unit, instance) into a fixed-size
padded block of `n_slots` rows, next to `global_dim` features of the whole cluster (pool, buffer,
head request). A flat MLP sees slot i as a different input from slot j; the set extractor below
applies one shared MLP to every slot and pools over the valid ones (Deep Sets), optionally after a
self-attention layer (Set Transformer), so its summary does not depend on worker numbering and the
same weights serve any N up to n_slots.

Layout of the flat Box observation (`SlotLayout`): [global | slots] (`slots_first: false`) or
[slots | global], slots row-major (n_slots x per_slot_dim). Padding rows are all zero unless
`mask_index` names a per-slot feature that is 1 for a real slot and 0 for padding.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from pdgym.envs.sim.config import ConfigError
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn


@dataclass
class SlotLayout:
    n_slots: int
    per_slot_dim: int
    global_dim: int = 0
    slots_first: bool = False
    mask_index: int | None = None  # per-slot feature that flags a real slot (None: any non-zero row)

    def check(self, obs_dim: int, key: str = "agent.features") -> None:
        want = self.n_slots * self.per_slot_dim + self.global_dim
        if want != obs_dim:
            raise ConfigError(f"{key}: n_slots * per_slot_dim + global_dim = {self.n_slots} * {self.per_slot_dim} + "
                              f"{self.global_dim} = {want}, but the observation has {obs_dim} features")
        if self.mask_index is not None and not 0 <= self.mask_index < self.per_slot_dim:
            raise ConfigError(f"{key}.mask_index: got {self.mask_index}; allowed 0..{self.per_slot_dim - 1} or null")

    def split(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(global features (B, G), slot features (B, n_slots, per_slot_dim))."""
        s = self.n_slots * self.per_slot_dim
        if self.slots_first:
            slots, glob = obs[:, :s], obs[:, s:]
        else:
            glob, slots = obs[:, :self.global_dim], obs[:, self.global_dim:]
        return glob, slots.reshape(-1, self.n_slots, self.per_slot_dim)

    def valid(self, slots: torch.Tensor) -> torch.Tensor:
        """(B, n_slots) bool: real slots."""
        if self.mask_index is not None:
            return slots[..., self.mask_index] > 0.5
        return slots.abs().sum(-1) > 0


def layout_from_env(env) -> SlotLayout | None:
    """The layout an env advertises (attribute `obs_layout`: a dict or an object with the fields), if any."""
    for e in (env, getattr(env, "unwrapped", None)):
        lay = getattr(e, "obs_layout", None) if e is not None else None
        if lay is not None:
            if not isinstance(lay, dict):
                lay = {k: getattr(lay, k) for k in SlotLayout.__dataclass_fields__ if hasattr(lay, k)}
            return SlotLayout(**{k: v for k, v in lay.items() if k in SlotLayout.__dataclass_fields__})
    return None


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


class SlotSetExtractor(BaseFeaturesExtractor):
    """Shared per-slot MLP (+ optional self-attention) + masked mean/max pooling + global MLP.

    Output: [pooled mean | pooled max | global embedding] and, with `keep_slots`, the per-slot
    embeddings too (permutation-equivariant rows, so the action head can point at a worker).
    Padding slots take no part in attention or pooling.
    """

    def __init__(self, observation_space: gym.spaces.Box, n_slots: int, per_slot_dim: int, global_dim: int = 0,
                 slots_first: bool = False, mask_index: int | None = None, slot_hidden: tuple = (64, 64),
                 global_hidden: tuple = (64,), attention_heads: int = 0, keep_slots: bool = True):
        layout = SlotLayout(int(n_slots), int(per_slot_dim), int(global_dim), bool(slots_first), mask_index)
        layout.check(int(np.prod(observation_space.shape)))
        slot_hidden, global_hidden = list(slot_hidden), list(global_hidden)
        if not slot_hidden:
            raise ConfigError("agent.features.slot_hidden: must list at least one layer width")
        d = slot_hidden[-1]
        g = global_hidden[-1] if (global_dim and global_hidden) else global_dim
        out = 2 * d + g + (n_slots * d if keep_slots else 0)
        super().__init__(observation_space, features_dim=out)
        self.layout = layout
        self.keep_slots = keep_slots
        self.slot_net = _mlp([per_slot_dim, *slot_hidden])
        self.global_net = _mlp([global_dim, *global_hidden]) if (global_dim and global_hidden) else nn.Identity()
        if attention_heads:
            if d % attention_heads:
                raise ConfigError(f"agent.features.attention_heads: {attention_heads} must divide the slot width {d}")
            self.attn = nn.MultiheadAttention(d, attention_heads, batch_first=True)
            self.norm = nn.LayerNorm(d)
        else:
            self.attn = None

    def _encode(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Slot embeddings h (after the optional attention layer), the slot mask m and the pooled
        context [masked mean | masked max | global embedding]."""
        glob, slots = self.layout.split(obs)
        valid = self.layout.valid(slots)
        valid = valid | ~valid.any(-1, keepdim=True)  # an all-padding row would make pooling undefined
        h = self.slot_net(slots)
        if self.attn is not None:
            a, _ = self.attn(h, h, h, key_padding_mask=~valid, need_weights=False)
            h = self.norm(h + a)
        m = valid.unsqueeze(-1).to(h.dtype)
        hm = h * m
        ctx = torch.cat([hm.sum(1) / m.sum(1).clamp_min(1.0), hm.masked_fill(m == 0, -1e9).max(1).values,
                         self.global_net(glob)], dim=1)
        return h, m, ctx

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h, m, ctx = self._encode(obs)
        return torch.cat([ctx, (h * m).flatten(1)], dim=1) if self.keep_slots else ctx


class SlotPointerExtractor(SlotSetExtractor):
    """Per-slot scores for "pick a worker" actions: logit_w = MLP([h_w | context]) with the same weights for
    every worker (permutation-equivariant), plus `n_actions - n_slots` extra logits (END, SKIP, ...) from the
    context [pooled mean | pooled max | global embedding], after the slots' logits (or before them with
    `extra_first`). Output: [logits (n_actions) | context]; the
    pointer policies below read the logits directly (no linear action head) and feed the context to the
    value network."""

    def __init__(self, observation_space: gym.spaces.Box, n_actions: int, score_hidden: tuple = (64,),
                 extra_first: bool = False, **kwargs):
        kwargs["keep_slots"] = False
        super().__init__(observation_space, **kwargs)
        n_slots = self.layout.n_slots
        if n_actions < n_slots:
            raise ConfigError(f"agent.features.n_actions: got {n_actions}; the env has {n_slots} slots")
        ctx = self.features_dim
        d = self.slot_net[-2].out_features
        self.n_actions = int(n_actions)
        self.extra_first = bool(extra_first)  # action order [extras | slots] (e.g. PrefillDispatch: 0 = hold)
        self.score = nn.Sequential(_mlp([d + ctx, *score_hidden]), nn.Linear(([d + ctx, *score_hidden])[-1], 1))
        self.extra = nn.Linear(ctx, n_actions - n_slots) if n_actions > n_slots else None
        self._features_dim = n_actions + ctx

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h, _, ctx = self._encode(obs)
        n = self.layout.n_slots
        logits = self.score(torch.cat([h, ctx.unsqueeze(1).expand(-1, n, -1)], dim=2)).squeeze(-1)
        heads = [logits] + ([self.extra(ctx)] if self.extra is not None else [])
        if self.extra_first:
            heads.reverse()
        return torch.cat([*heads, ctx], dim=1)


class _TakeLogits(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return latent[:, :self.n]


class _PointerMixin:
    """Actor-critic policy whose action logits are the pointer extractor's scores (pi net_arch empty)."""

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        self.action_net = _TakeLogits(self.action_space.n)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)


class MaskablePointerPolicy(_PointerMixin, MaskableActorCriticPolicy):
    """MaskablePPO policy with pointer logits."""


class PointerPolicy(_PointerMixin, ActorCriticPolicy):
    """PPO / A2C policy with pointer logits."""


def pointer_policy(algo: str) -> type:
    """The pointer policy class for an algorithm (maskable_ppo: masked; ppo / a2c: plain)."""
    if algo == "maskable_ppo":
        return MaskablePointerPolicy
    if algo in ("ppo", "a2c"):
        return PointerPolicy
    raise ConfigError(f"agent.features.kind: pointer needs an actor-critic algorithm (maskable_ppo, ppo, a2c), "
                      f"not {algo}")


def policy_kwargs(features: dict, net_arch, env=None) -> dict:
    """SB3 `policy_kwargs` from the agent config: `features.kind` flat (SB3's MLP) | set | attention.

    For set / attention, n_slots / per_slot_dim / global_dim come from the config or, when left
    null, from the env's `obs_layout` attribute.
    """
    features = dict(features or {})
    kind = features.pop("kind", "flat")
    out: dict = {"net_arch": list(net_arch)} if net_arch is not None else {}
    if kind == "flat":
        if features:
            raise ConfigError(f"agent.features.{next(iter(features))}: only for kind=set or attention")
        return out
    if kind not in ("set", "attention", "pointer"):
        raise ConfigError(f"agent.features.kind: got {kind!r}; allowed: flat, set, attention, pointer")
    lay = layout_from_env(env) if env is not None else None
    for k in ("n_slots", "per_slot_dim", "global_dim", "slots_first", "mask_index"):
        if features.get(k) is None:
            features.pop(k, None)
            if lay is not None:
                features[k] = getattr(lay, k)
    missing = [k for k in ("n_slots", "per_slot_dim") if k not in features]
    if missing:
        raise ConfigError(f"agent.features.{missing[0]}: needed for kind={kind} (the env advertises no obs_layout)")
    if kind == "attention":
        features.setdefault("attention_heads", 4)
    cls = SlotPointerExtractor if kind == "pointer" else SlotSetExtractor
    allowed = _params(SlotSetExtractor) | (_params(SlotPointerExtractor) - {"kwargs"} if kind == "pointer" else set())
    if kind == "pointer":
        allowed.discard("keep_slots")
        if env is not None:
            features.setdefault("n_actions", int(env.action_space.n))
        # the logits come straight from the extractor; the critic gets a small MLP over the same features
        out["net_arch"] = {"pi": [], "vf": list(net_arch) if isinstance(net_arch, list) else [64]}
    for k in features:
        if k not in allowed:
            raise ConfigError(f"agent.features.{k}: unknown; allowed: kind, {', '.join(sorted(allowed))}")
    out["features_extractor_class"] = cls
    out["features_extractor_kwargs"] = features
    return out


def _params(cls) -> set[str]:
    code = cls.__init__.__code__
    return set(code.co_varnames[2:code.co_argcount])
