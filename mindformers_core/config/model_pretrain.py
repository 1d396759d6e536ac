"""Checks of the model fields for YaRN RoPE scaling and multi-token prediction (declared in
``config/model.py``; the math lives in ``models/yarn.py`` and ``models/mtp.py``)."""
from __future__ import annotations

from .schema import check_range


def validate_pretrain_fields(cfg, path: str) -> None:
    """Range checks of the YaRN and MTP fields of a ModelConfig ``cfg`` at ``path``."""
    check_range(cfg.rotary_scaling_factor, f"{path}.rotary_scaling_factor", lo=0, lo_open=True)
    check_range(cfg.beta_fast, f"{path}.beta_fast", lo=0, lo_open=True)
    check_range(cfg.beta_slow, f"{path}.beta_slow", lo=0, lo_open=True)
    check_range(cfg.mscale, f"{path}.mscale", lo=0)
    check_range(cfg.mscale_all_dim, f"{path}.mscale_all_dim", lo=0)
    check_range(cfg.max_position_embeddings, f"{path}.max_position_embeddings", lo=1)
    check_range(cfg.num_nextn_predict_layers, f"{path}.num_nextn_predict_layers", lo=0)
    check_range(cfg.mtp_loss_scaling_factor, f"{path}.mtp_loss_scaling_factor", lo=0)
