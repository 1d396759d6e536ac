"""What ``model.model_type`` selects: the network, and the defaults it changes.

* ``gpt``: dense Llama-style decoder (the ``ModelConfig`` field defaults, a tiny CPU model).
* ``deepseek_v3``: MLA + MoE (the same field defaults; MLA and MoE are derived from the type).
* ``qwen3``: the dense GPT decoder with Qwen3's structure -- per-head RMSNorm on q and k
  before RoPE (``qk_layernorm``, derived from the type: ``ModelConfig.resolved_qk_layernorm``)
  and an explicit head dim (``kv_channels``, upstream's ``head_dim``) -- and the defaults of upstream MindFormers' ``Qwen3Config`` (Qwen3-8B-like
  sizes, ``seq_length`` 4096). ``num_query_groups`` stays "= num_attention_heads", which is
  upstream's default of 32 key/value heads at its 32 heads and keeps the two tied when only
  the head count is changed.

A key the user writes always wins over these defaults; a field not listed here keeps its
``ModelConfig`` default. ``MODEL_TYPE_DEFAULTS`` is the one place these values live.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

__all__ = ["MODEL_TYPE_DEFAULTS", "with_model_type_defaults"]

#: model_type -> canonical field -> its default under that type
MODEL_TYPE_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "ffn_hidden_size": 22016,
        "num_layers": 32,
        "num_attention_heads": 32,
        "kv_channels": 128,
        "seq_length": 4096,
        "max_position_embeddings": 32768,
        "rope_theta": 10000.0,
        "norm_epsilon": 1e-6,
        "tie_word_embeddings": False,
    },
}


def with_model_type_defaults(canonical: Mapping[str, Any], default_type: str) -> Dict[str, Any]:
    """``canonical`` (a `model:` mapping in this project's names) with the defaults of its
    ``model_type`` filled in where the user wrote nothing."""
    model_type = canonical.get("model_type", default_type)
    defaults = MODEL_TYPE_DEFAULTS.get(model_type, {}) if isinstance(model_type, str) else {}
    return {**defaults, **canonical}
