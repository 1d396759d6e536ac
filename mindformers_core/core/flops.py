"""The training FLOP count of a model (pure): what the trainer's MFU divides by
(trainer/throughput.py re-exports it) and what the layout advisor's cost model
(core/layout_cost.py) spends per rank.

FLOPs per token (PaLM, appendix B; Megatron uses the same count): a forward + backward pass is
``6 * N`` FLOPs per token for every matrix parameter it multiplies with plus
``12 * num_layers * hidden_size * seq_length`` for the attention scores and the weighted sum
(with the attention's own widths where they are not the hidden size).

Default peaks per device (override with ``logging.peak_flops``): ``CPU`` 1e11 (an assumed
100 GFLOP/s per process: 2 cores x 3 GHz x 16 fp32 FLOP/cycle with AVX2 FMA), ``Ascend``
3.2e14 (Ascend 910 class, fp16/bf16 dense), ``GPU`` 9.89e14 (H100 SXM bf16 dense).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

__all__ = ["PEAK_FLOPS", "flops_per_token", "attention_widths"]

PEAK_FLOPS = {"CPU": 1e11, "Ascend": 3.2e14, "GPU": 9.89e14}


def flops_per_token(counts: Dict[str, int], num_layers: int, hidden_size: int,
                    seq_length: int, vocab_size: int, tied: bool = False,
                    attention_widths: Optional[Tuple[int, int]] = None) -> float:
    """Training FLOPs per token (forward + backward) of the PaLM count.

    ``attention_widths`` = ``(heads x query/key head dim, heads x value head dim)``, the widths
    of the score and weighted-sum matmuls; None means ``(hidden_size, hidden_size)``, PaLM's
    ``12 * L * H * T`` term. They differ from the hidden size for an explicit head dim (Qwen3's
    ``head_dim``) and for MLA (``qk_nope + qk_rope`` against ``v_head_dim`` per head)."""
    readout = vocab_size * hidden_size if tied else counts["output_layer"]
    matmul_params = counts["non_embedding"] + readout
    qk, v = attention_widths if attention_widths is not None else (hidden_size, hidden_size)
    return 6.0 * matmul_params + 6.0 * num_layers * (qk + v) * seq_length


def attention_widths(model_cfg) -> Tuple[int, int]:
    """``(heads x query/key head dim, heads x value head dim)`` of a ``ModelConfig``."""
    heads = model_cfg.num_attention_heads
    if model_cfg.resolved_multi_latent_attention():
        return (heads * (model_cfg.qk_nope_head_dim + model_cfg.qk_rope_head_dim),
                heads * model_cfg.v_head_dim)
    return (heads * model_cfg.resolved_kv_channels(),) * 2
