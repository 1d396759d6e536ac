"""The metadata object returned by ``model.get_gpt_transformer_config()``.

Field names follow Megatron's TransformerConfig / MLATransformerConfig, which is what the
optimizers (Muon checks, split rules, QK-Clip) read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GPTTransformerConfig:
    multi_latent_attention: bool
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int                 # per-head dim of a non-MLA model
    ffn_hidden_size: int
    q_lora_rank: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_head_dim: Optional[int] = None          # = qk_nope_head_dim
    qk_pos_emb_head_dim: Optional[int] = None  # = qk_rope_head_dim
    v_head_dim: Optional[int] = None
    num_moe_experts: Optional[int] = None
    moe_router_topk: Optional[int] = None
    moe_ffn_hidden_size: Optional[int] = None
    first_k_dense_replace: int = 0
