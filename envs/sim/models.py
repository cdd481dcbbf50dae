"""Model architecture profiles: parameter counts, KV bytes per token, MoE layout.

Shipped as `conf/model/NAME.yaml`. The cost models split parameters into the
non-routed part (attention, dense FFNs, shared experts, embeddings: every DP unit
holds it, sharded by TP) and the routed experts (spread over the EP group), since
that split decides both memory fit and what a forward pass reads. The non-routed part
splits again as the kernels run it (from config.json: vocab_size, hidden_size,
tie_word_embeddings): the embedding (a row lookup per token: memory reads only), the LM
head (vocab x hidden, run on decode tokens and on each prompt's last token) and the
decoder (every token's GEMMs).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from .config import check, check_choice, check_positive
from .hardware import load_profile, profile_names, read_profile

KV_DTYPE_BYTES = 2  # every shipped KV cache is BF16; used to recover MLA's latent width


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    """One served model. Units and meanings in conf/model/*.yaml."""

    name: str
    params_total: float
    params_active: float
    layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention: str  # mla | gqa
    kv_bytes_per_token: int
    num_experts: int  # routed experts per MoE layer, 0 = dense
    experts_per_token: int
    shared_experts: int
    moe_layers: int
    expert_params: float  # one routed expert in one MoE layer
    weight_bytes: float
    vocab_size: int  # embedding rows (config.json vocab_size); 0: no embedding or LM head (a bare decoder stack)
    tie_word_embeddings: bool  # the LM head is the embedding matrix (stored once)
    source: str = ""

    ATTENTIONS = ("mla", "gqa")

    @property
    def routed_params(self) -> float:
        return float(self.num_experts * self.moe_layers * self.expert_params)

    @property
    def nonrouted_params(self) -> float:
        return self.params_total - self.routed_params

    @property
    def embedding_params(self) -> float:
        """The token embedding: vocab_size x hidden (looked up, one row per token)."""
        return float(self.vocab_size * self.hidden)

    @property
    def lm_head_params(self) -> float:
        """The LM head's matrix, vocab_size x hidden, whether tied to the embedding or stored apart."""
        return float(self.vocab_size * self.hidden)

    @property
    def decoder_params(self) -> float:
        """Non-routed parameters of the decoder layers (attention, dense FFNs, shared experts, norms, router):
        non-routed minus the embedding and an untied LM head. Every token runs them."""
        head = 0.0 if self.tie_word_embeddings else self.lm_head_params
        return self.nonrouted_params - self.embedding_params - head

    @property
    def kv_width(self) -> float:
        """KV elements cached per token and layer (MLA: the latent every head attends over)."""
        return self.kv_bytes_per_token / (self.layers * KV_DTYPE_BYTES)

    def validate(self, key: str) -> None:
        check_choice(self.attention, f"{key}.attention", self.ATTENTIONS)
        for f in ("params_total", "params_active", "layers", "hidden", "num_heads", "num_kv_heads",
                  "head_dim", "kv_bytes_per_token", "weight_bytes"):
            check_positive(getattr(self, f), f"{key}.{f}")
        for f in ("num_experts", "experts_per_token", "shared_experts", "moe_layers", "expert_params", "vocab_size"):
            check_positive(getattr(self, f), f"{key}.{f}", allow_zero=True)
        check(self.params_active <= self.params_total, f"{key}.params_active", "must be <= params_total")
        if self.num_experts == 0:
            for f in ("experts_per_token", "moe_layers", "expert_params"):
                check(getattr(self, f) == 0, f"{key}.{f}", "must be 0 for a dense model (num_experts 0)")
        else:
            self._validate_moe(key)
        check(self.decoder_params > 0, f"{key}.vocab_size",
              f"the embedding{'' if self.tie_word_embeddings else ' and LM head'} ({self.vocab_size} x {self.hidden}) "
              f"leave no decoder parameters of the {self.nonrouted_params:.4g} non-routed ones")

    def _validate_moe(self, key: str) -> None:
        check(1 <= self.experts_per_token <= self.num_experts, f"{key}.experts_per_token",
              f"got {self.experts_per_token}; allowed 1..num_experts ({self.num_experts})")
        check(1 <= self.moe_layers <= self.layers, f"{key}.moe_layers",
              f"got {self.moe_layers}; allowed 1..layers ({self.layers})")
        check(self.expert_params > 0, f"{key}.expert_params", "must be > 0 for an MoE model")
        check(self.routed_params < self.params_total, f"{key}.expert_params",
              "num_experts * moe_layers * expert_params must be < params_total")


@functools.cache
def _model_by_name(name: str) -> ModelProfile:
    return read_profile(ModelProfile, "model", name)


def load_model(spec: str | Mapping | ModelProfile) -> ModelProfile:
    """A profile from its name (conf/model/NAME.yaml), a mapping of its fields, or a profile."""
    return load_profile(ModelProfile, "model", spec, _model_by_name)


def model_names() -> list[str]:
    return profile_names("model")
