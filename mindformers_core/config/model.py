"""`model:` section (owned by the models package).

Defaults are a tiny CPU-sized dense GPT; ``model_type: qwen3`` changes some of them
(config/model_types.py). DeepSeek-V3 fields use the Hugging Face / MindFormers names. Derived
values: ``multi_latent_attention`` None means True for ``deepseek_v3`` and False otherwise;
``num_query_groups`` None means ``num_attention_heads``; ``kv_channels`` None means
hidden_size // num_attention_heads; ``qk_layernorm`` None means True for ``qwen3`` and for MLA
(its latent norms), False otherwise; ``ffn_hidden_size`` None means 4 * hidden_size;
``moe_intermediate_size`` None means ffn_hidden_size // 2 (see the ``resolved_*`` helpers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from .moe import validate_moe_routing
from .model_pretrain import validate_pretrain_fields
from .model_types import with_model_type_defaults
from .compat.noop import require_noop
from .schema import Section, check, check_range
from .compat.upstream_names import check_upstream_only, join_model_section, split_model_section

#: largest hidden / FFN width accepted (an error at --check, not an allocation at build time)
MAX_WIDTH = 2 ** 20

DType = Literal["float32", "bfloat16", "float16"]


@dataclass
class ModelConfig(Section):
    """Decoder-only LM."""
    model_type: Literal["gpt", "deepseek_v3", "qwen3"] = "gpt"
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    num_query_groups: Optional[int] = None       # GQA groups; None = num_attention_heads
    kv_channels: Optional[int] = None            # head dim (non-MLA); None = hidden / heads
    qk_layernorm: Optional[bool] = None          # per-head q/k RMSNorm; None = qwen3 or MLA
    ffn_hidden_size: Optional[int] = None        # None = 4 * hidden_size
    seq_length: int = 64
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-6
    initializer_range: float = 0.02
    params_dtype: DType = "float32"
    compute_dtype: DType = "float32"
    tie_word_embeddings: bool = False
    # DeepSeek-V3 (MLA + MoE)
    multi_latent_attention: Optional[bool] = None  # None = True for deepseek_v3, False for gpt
    q_lora_rank: Optional[int] = 32             # null = no q compression (linear_q_proj)
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    first_k_dense_replace: int = 1
    n_routed_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: Optional[int] = None  # None = ffn_hidden_size // 2
    n_shared_experts: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    moe_router_enable_expert_bias: bool = True
    moe_router_bias_update_rate: float = 1e-3
    moe_aux_loss_coeff: float = 0.0
    # YaRN RoPE scaling (models/yarn.py) and multi-token prediction (models/mtp.py), upstream's
    # names; max_position_embeddings is YaRN's original context (None = seq_length)
    position_embedding_type: Literal["rope", "yarn"] = "rope"
    rotary_scaling_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    max_position_embeddings: Optional[int] = None
    num_nextn_predict_layers: int = 0
    mtp_loss_scaling_factor: float = 0.1
    use_flash_attention: bool = False   # memory-efficient attention (models/blockwise_attention.py)

    # DeepSeek-V3 router and dispatch options (upstream MindFormers names; rules in config/moe.py)
    n_group: Optional[int] = None                # expert groups for group-limited routing
    topk_group: Optional[int] = None             # groups eligible per token; None = no limit
    scoring_func: Literal["sigmoid", "softmax"] = "sigmoid"
    moe_router_load_balancing_type: Literal["seq_aux_loss", "aux_loss", "none"] = "seq_aux_loss"
    moe_shared_expert_intermediate_size: Optional[int] = None  # None = n_shared * moe_intermediate
    moe_expert_capacity_factor: Optional[float] = None         # None = dropless
    moe_token_drop_policy: Literal["probs", "position"] = "probs"
    #: upstream's padded dispatch: every expert computes a fixed number of rows (its capacity,
    #: or the micro-batch's tokens when dropless) so the shapes never depend on the routing;
    #: the same loss and gradients as the unpadded dispatch (models/dispatch.py)
    use_pad_tokens: bool = False
    #: expert-parallel token exchange: one row per (token, expert) pair, or
    #: ``alltoall_deredundancy``: a token routed to several experts of one rank goes there once
    #: (models/ep_dedup.py); ``parallelism.moe_token_dispatcher_type`` sets it too (config/moe.py)
    moe_token_dispatcher_type: Literal["alltoall", "alltoall_deredundancy"] = "alltoall"

    # ------------------------------------------------------------------ both naming schemes
    @classmethod
    def from_dict(cls, data, path: str):
        """Upstream MindFormers names or this project's (config/compat/upstream_names.py)."""
        canonical, spelling = split_model_section(cls.mapping_of(data, path), path,
                                                  cls.field_names())
        obj = super().from_dict(with_model_type_defaults(canonical, cls.model_type), path)
        check_upstream_only(spelling, path, obj)
        object.__setattr__(obj, "_spelling", spelling)
        return obj

    def to_dict(self):
        return join_model_section(super().to_dict(), getattr(self, "_spelling", None))

    # ------------------------------------------------------------------ derived values
    def resolved_multi_latent_attention(self) -> bool:
        if self.multi_latent_attention is None:
            return self.model_type == "deepseek_v3"
        return self.multi_latent_attention

    def resolved_num_query_groups(self) -> int:
        return self.num_attention_heads if self.num_query_groups is None else self.num_query_groups

    def resolved_kv_channels(self) -> int:
        """Per-head dim of q, k and v in standard (non-MLA) attention."""
        if self.kv_channels is None:
            return self.hidden_size // self.num_attention_heads
        return self.kv_channels

    def resolved_qk_layernorm(self) -> bool:
        """Standard attention: per-head RMSNorm of q and k before RoPE (Qwen3); MLA: its q/kv
        latent norms (always on)."""
        if self.qk_layernorm is None:
            return self.model_type == "qwen3" or self.resolved_multi_latent_attention()
        return self.qk_layernorm

    def resolved_ffn_hidden_size(self) -> int:
        return 4 * self.hidden_size if self.ffn_hidden_size is None else self.ffn_hidden_size

    def resolved_moe_intermediate_size(self) -> int:
        if self.moe_intermediate_size is None:
            return max(1, self.resolved_ffn_hidden_size() // 2)
        return self.moe_intermediate_size

    def resolved_shared_expert_intermediate_size(self) -> int:
        """Shared-expert width; 0 = no shared expert."""
        if self.moe_shared_expert_intermediate_size is not None:
            return self.moe_shared_expert_intermediate_size
        return self.n_shared_experts * self.resolved_moe_intermediate_size()

    # ------------------------------------------------------------------ validation
    def validate(self, path: str) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "seq_length",
                     "num_query_groups", "ffn_hidden_size", "kv_lora_rank", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                     "moe_intermediate_size", "q_lora_rank", "kv_channels"):
            check_range(getattr(self, name), f"{path}.{name}", lo=1)
        for name in ("hidden_size", "ffn_hidden_size", "moe_intermediate_size"):
            # a width beyond 2**20 is a typo, not a model (one such square weight is 4 TiB)
            check_range(getattr(self, name), f"{path}.{name}", hi=MAX_WIDTH)
        check_range(self.n_shared_experts, f"{path}.n_shared_experts", lo=0)
        check_range(self.initializer_range, f"{path}.initializer_range", lo=0, lo_open=True)
        check_range(self.norm_epsilon, f"{path}.norm_epsilon", lo=0, lo_open=True)
        check_range(self.rope_theta, f"{path}.rope_theta", lo=0, lo_open=True)
        check_range(self.routed_scaling_factor, f"{path}.routed_scaling_factor", lo=0, lo_open=True)
        check_range(self.moe_router_bias_update_rate, f"{path}.moe_router_bias_update_rate", lo=0)
        check_range(self.moe_aux_loss_coeff, f"{path}.moe_aux_loss_coeff", lo=0)
        validate_pretrain_fields(self, path)
        mla = self.resolved_multi_latent_attention()
        if not mla:
            if self.kv_channels is None:
                check(self.hidden_size % self.num_attention_heads == 0,
                      f"{path}.num_attention_heads", f"must divide hidden_size "
                      f"({self.hidden_size}), got {self.num_attention_heads}")
                check((self.hidden_size // self.num_attention_heads) % 2 == 0,
                      f"{path}.hidden_size", f"hidden_size / num_attention_heads must be even "
                      f"for rotary embeddings, got {self.hidden_size} / "
                      f"{self.num_attention_heads}")
            else:
                check(self.kv_channels % 2 == 0, f"{path}.kv_channels",
                      f"must be even for rotary embeddings, got {self.kv_channels}")
            groups = self.resolved_num_query_groups()
            check(self.num_attention_heads % groups == 0, f"{path}.num_query_groups",
                  f"must divide num_attention_heads ({self.num_attention_heads}), got {groups}")
        else:
            check(self.qk_rope_head_dim % 2 == 0, f"{path}.qk_rope_head_dim",
                  f"must be even (rotary pairs), got {self.qk_rope_head_dim}")
            # upstream's MLA normalises the q and kv latents under this flag; here it always does
            if self.qk_layernorm is not None:
                require_noop(f"{path}.qk_layernorm", self.qk_layernorm, (True,),
                             "MLA without latent norms")
        if self.model_type == "deepseek_v3":
            check_range(self.first_k_dense_replace, f"{path}.first_k_dense_replace", lo=0,
                        hi=self.num_layers)
            check(self.num_experts_per_tok <= self.n_routed_experts, f"{path}.num_experts_per_tok",
                  f"must be <= n_routed_experts ({self.n_routed_experts}), got "
                  f"{self.num_experts_per_tok}")
        validate_moe_routing(self, path)
