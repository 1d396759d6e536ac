"""SwiGLU MLP and the DeepSeek-V3 mixture of experts.

Layouts:

* ``linear_fc1`` [2F, H] interleaves gate and up rows: row 2i is gate unit i, row 2i+1 is up
  unit i (the reference's "periodic (1, 1)" split); ``linear_fc2`` is [H, F].
* ``experts.weight1`` [E, H, 2F]: x @ weight1[e] gives [gate (F) | up (F)] (block halves of the
  last dim); ``experts.weight2`` [E, F, H].
* ``router.weight`` [E, H]; ``router.expert_bias`` [E] is a non-trainable float32 Parameter
  used only for expert selection (auxiliary-loss-free balancing).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, nn, ops

from .layers import Linear, _placeholder, linear
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


class Router(nn.Cell):
    """Sigmoid-scored top-k router with an auxiliary-loss-free selection bias."""

    def __init__(self, hidden_size: int, num_experts: int, precision: Precision):
        super().__init__()
        self.weight = _placeholder((num_experts, hidden_size), precision.param, "weight")
        self.expert_bias = _placeholder((num_experts,), ms.float32, "expert_bias",
                                        requires_grad=False)

    def construct(self, x2d):
        """Router scores s = sigmoid(x W^T) [T, E] in float32."""
        logits = mint.nn.functional.linear(x2d.astype(ms.float32), self.weight.astype(ms.float32))
        return ops.sigmoid(logits)


class GroupedExperts(nn.Cell):
    """E SwiGLU experts held as two 3-D weights; computed with batched matmuls."""

    def __init__(self, hidden_size: int, num_experts: int, ffn: int, precision: Precision):
        super().__init__()
        self.precision = precision
        self.ffn = ffn
        self.weight1 = _placeholder((num_experts, hidden_size, 2 * ffn), precision.param, "weight1")
        self.weight2 = _placeholder((num_experts, ffn, hidden_size), precision.param, "weight2")

    def construct(self, x2d, combine):
        """sum_e combine[t, e] * expert_e(x_t).

        Dense over experts: every expert runs on every token and unselected experts get
        weight 0 (exact, gradients reach only selected experts). It is the fewest-kernel form
        for the small expert counts of the CPU configs; cost grows as E/k over a dispatch.
        """
        p = self.precision
        e = self.weight1.shape[0]
        t, hdim = x2d.shape
        xe = p.cast(x2d)[None].broadcast_to((e, t, hdim))
        h = mint.bmm(xe, p.cast(self.weight1))                        # [E, T, 2F]
        act = ops.silu(h[..., : self.ffn]) * h[..., self.ffn:]
        y = mint.bmm(act, p.cast(self.weight2))                       # [E, T, H]
        w = combine.transpose(1, 0)[..., None].astype(y.dtype)        # [E, T, 1]
        return (y * w).sum(0)


class MoE(nn.Cell):
    """DeepSeek-V3 MoE: sigmoid router, top-k on (score + bias), optional shared experts.

    gate weights g_t,i = s_t,i for the selected i (divided by their sum when norm_topk_prob),
    times routed_scaling_factor. Sequence aux loss (coefficient alpha):
    L = alpha * mean_b sum_i f_b,i P_b,i, f_b,i = E/(k S) * #tokens of sequence b routed to i,
    P_b,i = mean_t s_t,i / sum_j s_t,j. Token counts per expert are accumulated (detached) in
    ``tokens_per_expert`` until ``reset_stats``.
    """

    def __init__(self, hidden_size, num_experts, top_k, moe_ffn, n_shared, norm_topk_prob,
                 routed_scaling_factor, aux_loss_coeff, precision: Precision):
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.routed_scaling_factor = routed_scaling_factor
        self.aux_loss_coeff = aux_loss_coeff
        self.router = Router(hidden_size, num_experts, precision)
        self.experts = GroupedExperts(hidden_size, num_experts, moe_ffn, precision)
        if n_shared > 0:
            self.shared_experts = MLP(hidden_size, moe_ffn * n_shared, precision)
        else:
            self.shared_experts = None
        self._eye = Tensor(np.eye(num_experts, dtype=np.float32))
        self.tokens_per_expert = None
        self.last_topk = None

    def reset_stats(self):
        self.tokens_per_expert = None

    def construct(self, x):
        b, s, hdim = x.shape
        x2d = x.reshape(b * s, hdim)
        scores = self.router(x2d)                                              # [T, E] fp32
        _, idx = ops.topk(scores + ops.stop_gradient(self.router.expert_bias), self.top_k)
        onehot = ops.gather(self._eye, idx, 0)                                 # [T, k, E]
        w = (onehot * scores[:, None, :]).sum(-1)                              # [T, k]
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdims=True) + 1e-20)
        w = w * self.routed_scaling_factor
        combine = (onehot * w[..., None]).sum(1)                               # [T, E]
        out = self.experts(x2d, combine)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x2d)
        counts = ops.stop_gradient(onehot.sum((0, 1)))
        self.tokens_per_expert = counts if self.tokens_per_expert is None else self.tokens_per_expert + counts
        self.last_topk = ops.stop_gradient(idx)
        aux = None
        if self.aux_loss_coeff > 0:
            e, k = self.num_experts, self.top_k
            f = onehot.reshape(b, s * k, e).sum(1) * (e / (k * s))              # [B, E]
            p = (scores / scores.sum(-1, keepdims=True)).reshape(b, s, e).mean(1)
            aux = self.aux_loss_coeff * (ops.stop_gradient(f) * p).sum(-1).mean()
        return out.reshape(b, s, hdim).astype(x.dtype), aux
