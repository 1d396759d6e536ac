"""SwiGLU MLP (the dense layers and the MoE shared experts; the MoE layer is ``moe.py``).

Layout: ``linear_fc1`` [2F, H] interleaves gate and up rows: row 2i is gate unit i, row 2i+1 is
up unit i (the reference's "periodic (1, 1)" split); ``linear_fc2`` is [H, F].
"""
from __future__ import annotations

from mindspore import nn, ops

from .layers import Linear
from .precision import Precision


def swiglu_interleaved(h):
    """silu(gate) * up for h [..., 2F] whose last dim interleaves (gate_i, up_i)."""
    pairs = h.reshape(h.shape[:-1] + (h.shape[-1] // 2, 2))
    return ops.silu(pairs[..., 0]) * pairs[..., 1]


class MLP(nn.Cell):
    """y = W2 (silu(gate) * up), [gate, up] interleaved rows of W1 = ``linear_fc1``."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, precision: Precision):
        super().__init__()
        self.linear_fc1 = Linear(hidden_size, 2 * ffn_hidden_size, precision)
        self.linear_fc2 = Linear(ffn_hidden_size, hidden_size, precision)

    def construct(self, x):
        return self.linear_fc2(swiglu_interleaved(self.linear_fc1(x)))
