"""``build_model``: config -> initialised model."""
from __future__ import annotations

from typing import Optional, Union

import math

import mindspore as ms

from ..config.model import ModelConfig
from ..core.documents import Documents
from .init import init_weights
from .language_model import GPTModel
from .precision import resolve_precision
from .transformer_config import GPTTransformerConfig


def transformer_config(cfg: ModelConfig) -> GPTTransformerConfig:
    """The Megatron-style metadata of ``cfg`` (what ``get_gpt_transformer_config`` returns)."""
    mla = cfg.resolved_multi_latent_attention()
    moe = cfg.model_type == "deepseek_v3"
    return GPTTransformerConfig(
        multi_latent_attention=mla, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.resolved_num_query_groups(),
        kv_channels=cfg.resolved_kv_channels(),
        ffn_hidden_size=cfg.resolved_ffn_hidden_size(),
        q_lora_rank=cfg.q_lora_rank if mla else None,
        kv_lora_rank=cfg.kv_lora_rank if mla else None,
        qk_head_dim=cfg.qk_nope_head_dim if mla else None,
        qk_pos_emb_head_dim=cfg.qk_rope_head_dim if mla else None,
        v_head_dim=cfg.v_head_dim if mla else None,
        num_moe_experts=cfg.n_routed_experts if moe else None,
        moe_router_topk=cfg.num_experts_per_tok if moe else None,
        moe_ffn_hidden_size=cfg.resolved_moe_intermediate_size() if moe else None,
        first_k_dense_replace=cfg.first_k_dense_replace if moe else cfg.num_layers,
    )


def check_mup_width_mult(mup_width_mult) -> Optional[float]:
    """None, or ``mup_width_mult`` as a finite positive float (ValueError otherwise)."""
    if mup_width_mult is None:
        return None
    if isinstance(mup_width_mult, bool) or not isinstance(mup_width_mult, (int, float)) \
            or not math.isfinite(mup_width_mult) or mup_width_mult <= 0:
        raise ValueError(f"mup_width_mult must be a finite positive number, got {mup_width_mult!r}")
    return float(mup_width_mult)


def build_model(model_cfg: Union[ModelConfig, dict, None] = None, seed: Optional[int] = None,
                mup_width_mult: Optional[float] = None, jit: str = "none",
                documents: Optional[Documents] = None) -> GPTModel:
    """Build and initialise the model of a ``model:`` section (ModelConfig or dict).

    Weights come from numpy streams keyed by ``seed`` and the parameter name (``models.init``),
    so two builds with the same seed are bit-identical whatever MindSpore's RNG state.
    ``seed=None`` uses ``mindspore.get_seed()`` when set, else 0.

    ``mup_width_mult`` w (= hidden_size / optimizer.mup.base_hidden_size, see
    ``optim.mup.mup_width_mult``) builds the muP model: hidden matrices initialised with std / sqrt(w)
    and logits multiplied by 1/w (readout multiplier). None or 1.0: the plain model, bit-identical.
    The optimizer side (per-group lr / eps) is ``optim.mup.get_mup_config_overrides``.
    ``jit`` is ``training.jit`` (``models.compiled``). ``documents``: document masking
    (``models/documents.py``; the run's from ``train_dataset``), or None.
    """
    mup_width_mult = check_mup_width_mult(mup_width_mult)
    cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg, "model")
    if seed is None:
        seed = ms.get_seed()
        seed = 0 if seed is None else int(seed)
    precision = resolve_precision(cfg.params_dtype, cfg.compute_dtype)
    model = GPTModel(cfg, precision, transformer_config(cfg), mup_width_mult=mup_width_mult,
                     documents=documents)
    init_weights(model, seed, cfg.initializer_range, cfg.num_layers, mup_width_mult)
    model.set_jit(jit)
    return model
