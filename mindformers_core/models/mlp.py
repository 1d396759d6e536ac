"""SwiGLU MLP (the dense layers and the MoE shared experts; the MoE layer is ``moe.py``).

Layout: ``linear_fc1`` [2F, H] interleaves gate and up rows: row 2i is gate unit i, row 2i+1 is
up unit i (the reference's "periodic (1, 1)" split); ``linear_fc2`` is [H, F].
"""
from __future__ import annotations

from mindspore import nn, ops

from .layers import Linear, linear
from .precision import Precision


def swiglu(x, w_fc1, w_fc2, precision: Precision):
    """W2 (silu(gate) * up) for x [..., H], with ``w_fc1`` [2F, H] interleaving gate/up rows.

    The weight is de-interleaved (one copy of [2F, H]) so that gate and up are two 2-D matmuls
    with contiguous outputs; slicing the [T, 2F] activations instead costs strided copies of
    the (much larger) activations forward and backward.
    """
    w = precision.cast(w_fc1)
    w_gate, w_up = ops.unstack(w.reshape(w.shape[0] // 2, 2, w.shape[1]), 1)
    return linear(ops.silu(linear(x, w_gate, precision)) * linear(x, w_up, precision), w_fc2,
                  precision)


class MLP(nn.Cell):
    """y = W2 (silu(gate) * up), [gate, up] interleaved rows of W1 = ``linear_fc1``."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, precision: Precision):
        super().__init__()
        self.precision = precision
        self.linear_fc1 = Linear(hidden_size, 2 * ffn_hidden_size, precision)
        self.linear_fc2 = Linear(ffn_hidden_size, hidden_size, precision)

    def weights(self) -> tuple:
        return (self.linear_fc1.weight, self.linear_fc2.weight)

    def apply(self, x, w_fc1, w_fc2):
        return swiglu(x, w_fc1, w_fc2, self.precision)

    def construct(self, x):
        return self.apply(x, *self.weights())

