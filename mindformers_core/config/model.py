"""`model:` section. Owned by the models package (field set may grow with the models)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from .schema import Section, check_range

DType = Literal["float32", "bfloat16", "float16"]


@dataclass
class ModelConfig(Section):
    """Decoder-only LM. Defaults are a tiny CPU-sized dense GPT."""
    model_type: Literal["gpt", "deepseek_v3"] = "gpt"
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    num_query_groups: Optional[int] = None       # GQA groups; None = num_attention_heads
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
    q_lora_rank: Optional[int] = None
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

    def validate(self, path: str) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "seq_length"):
            check_range(getattr(self, name), f"{path}.{name}", lo=1)
        check_range(self.initializer_range, f"{path}.initializer_range", lo=0, lo_open=True)
