"""Models: dense GPT and DeepSeek-V3-style (MLA + MoE) decoders, PyNative MindSpore.

``build_model(model_cfg, seed=None, mup_width_mult=None) -> GPTModel`` (an ``nn.Cell``; muP:
logits x 1/w, hidden-matrix init std / sqrt(w)); see ``language_model`` for the forward contract
and ``qk_clip`` for the MLA row layout.
"""
from .build import build_model
from .language_model import GPTModel
from .transformer_config import GPTTransformerConfig

__all__ = ["build_model", "GPTModel", "GPTTransformerConfig"]
