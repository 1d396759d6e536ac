"""The DeepSeek-V3 mixture-of-experts layer: wires the router math (``router``) and the token
dispatch (``dispatch``) to its parameters.

Parameters (names and layouts are what Muon's routing and the checkpoints read):

* ``router.weight`` [E, H]; ``router.expert_bias`` [E], a non-trainable float32 Parameter used
  only for expert selection (auxiliary-loss-free balancing);
* ``experts.weight1`` [E, H, 2F]: x @ weight1[e] = [gate (F) | up (F)]; ``experts.weight2``
  [E, F, H];
* ``shared_experts`` (when the shared width is > 0): a SwiGLU ``MLP`` of width
  ``moe_shared_expert_intermediate_size`` (default n_shared_experts * moe_intermediate_size).

y = sum_j g_t,j expert_{idx_t,j}(x_t) + shared(x_t), returned with the auxiliary loss
(``router.aux_loss``, None when there is none). ``static_apply`` is the same layer with the
dispatch of ``static_dispatch`` (static shapes, no host state): a pure function the layer graph
of ``training.jit: layer`` compiles, router included; it returns the statistics, which
:meth:`MoE.record` adds (``static_ok`` says when it applies). Statistics since ``reset_stats`` (no gradient):
``tokens_per_expert`` [E] routed pairs (before capacity drops; the expert-bias update and the
load metrics read it), ``dropped`` pairs, ``aux_sum`` / ``num_forwards`` (mean aux loss).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mindspore as ms
from mindspore import mint, nn, ops

from . import router as rt
from .dispatch import expert_ffn, uses_grouped_matmul
from .ep_dedup import DEREDUNDANT, dedup_expert_ffn
from .ep_dispatch import ep_expert_ffn
from .layers import placeholder
from .mlp import MLP
from .precision import Precision
from .static_dispatch import static_expert_ffn


@dataclass(frozen=True)
class MoESpec:
    """The routing and expert options of one MoE layer; defaults and checks are the ``model:``
    section's (``from_model_config``)."""
    num_experts: int
    top_k: int
    ffn: int                              # moe_intermediate_size
    shared_ffn: int                       # 0 = no shared expert
    norm_topk_prob: bool
    routed_scaling_factor: float
    scoring_func: str
    n_group: Optional[int]
    topk_group: Optional[int]
    load_balancing_type: str
    aux_loss_coeff: float
    capacity_factor: Optional[float]
    drop_policy: str
    pad_tokens: bool = False              # use_pad_tokens: static padded dispatch
    deredundant: bool = False             # alltoall_deredundancy (models/ep_dedup.py)

    @classmethod
    def from_model_config(cls, cfg) -> "MoESpec":
        return cls(num_experts=cfg.n_routed_experts, top_k=cfg.num_experts_per_tok,
                   ffn=cfg.resolved_moe_intermediate_size(),
                   shared_ffn=cfg.resolved_shared_expert_intermediate_size(),
                   norm_topk_prob=cfg.norm_topk_prob,
                   routed_scaling_factor=cfg.routed_scaling_factor,
                   scoring_func=cfg.scoring_func, n_group=cfg.n_group, topk_group=cfg.topk_group,
                   load_balancing_type=cfg.moe_router_load_balancing_type,
                   aux_loss_coeff=cfg.moe_aux_loss_coeff,
                   capacity_factor=cfg.moe_expert_capacity_factor,
                   drop_policy=cfg.moe_token_drop_policy, pad_tokens=cfg.use_pad_tokens,
                   deredundant=cfg.moe_token_dispatcher_type == DEREDUNDANT)


class Router(nn.Cell):
    """Holds ``weight`` [E, H] and ``expert_bias`` [E]; returns float32 logits [T, E]."""

    def __init__(self, hidden_size: int, num_experts: int, precision: Precision):
        super().__init__()
        self.weight = placeholder((num_experts, hidden_size), precision.param, "weight")
        self.expert_bias = placeholder((num_experts,), ms.float32, "expert_bias",
                                        requires_grad=False)

    def construct(self, x2d):
        return router_logits(x2d, self.weight)


def router_logits(x2d, weight):
    """float32 router logits [T, E] of x2d [T, H] with the router weight [E, H]."""
    return mint.nn.functional.linear(x2d.astype(ms.float32), weight.astype(ms.float32))


class GroupedExperts(nn.Cell):
    """E SwiGLU experts held as two 3-D weights, run by token dispatch (``dispatch.expert_ffn``).

    Under expert parallelism (``models.expert_parallel.shard_experts``) the weights hold this
    rank's ``E / ep`` experts and the tokens travel by all-to-all (``ep_dispatch``)."""

    def __init__(self, hidden_size: int, num_experts: int, ffn: int, precision: Precision):
        super().__init__()
        self.precision = precision
        self.ffn = ffn
        self.weight1 = placeholder((num_experts, hidden_size, 2 * ffn), precision.param, "weight1")
        self.weight2 = placeholder((num_experts, ffn, hidden_size), precision.param, "weight2")
        self.ep_comm = None       # GroupCommunicator once the experts are split over "ep"
        self.exchange = None      # ep_dispatch.AllToAll over "ep"
        self.deredundant = False  # each token sent once per EP rank (models/ep_dedup.py)
        self.specs = {}           # parameter name -> ShardSpec (empty: replicated)

    def sharded_params(self) -> dict:
        """Parameter name -> ShardSpec of the split weights (``shard_spec.ShardedCell``)."""
        return dict(self.specs)

    def construct(self, x2d, gate_w, topk_idx, capacity_factor=None, drop_policy="probs",
                  pad_tokens=False):
        return self.apply(x2d, gate_w, topk_idx, self.weight1, self.weight2, capacity_factor,
                          drop_policy, pad_tokens)

    def apply(self, x2d, gate_w, topk_idx, weight1, weight2, capacity_factor=None,
              drop_policy="probs", pad_tokens=False):
        """``construct`` with the two expert weights as arguments; ``pad_tokens``: the padded
        dispatch (``model.use_pad_tokens``, models/dispatch.py)."""
        p = self.precision
        if self.ep_comm is not None and self.deredundant:
            return dedup_expert_ffn(p.cast(x2d), gate_w, topk_idx, p.cast(weight1),
                                    p.cast(weight2), self.ffn, self.ep_comm, self.exchange,
                                    capacity_factor, drop_policy, pad_tokens)
        if self.ep_comm is not None:
            return ep_expert_ffn(p.cast(x2d), gate_w, topk_idx, p.cast(weight1),
                                 p.cast(weight2), self.ffn, self.ep_comm, self.exchange,
                                 capacity_factor, drop_policy, pad_tokens)
        return expert_ffn(p.cast(x2d), gate_w, topk_idx, p.cast(weight1),
                          p.cast(weight2), self.ffn, capacity_factor, drop_policy, pad_tokens)


class MoE(nn.Cell):
    """Router -> dispatch -> experts (+ shared experts); ``construct(x) -> (y, aux or None)``."""

    def __init__(self, hidden_size: int, spec: MoESpec, precision: Precision):
        super().__init__()
        self.spec = spec
        self.num_experts = spec.num_experts
        self.top_k = spec.top_k
        self.router = Router(hidden_size, spec.num_experts, precision)
        self.experts = GroupedExperts(hidden_size, spec.num_experts, spec.ffn, precision)
        self.experts.deredundant = spec.deredundant
        self.shared_experts = MLP(hidden_size, spec.shared_ffn, precision) if spec.shared_ffn > 0 else None
        self.last_topk = None
        self.expert_parallel = 1   # ranks the experts are split over (models/expert_parallel.py)
        # context parallel (models/cp_model.py): (sum of [B, E] counts over the cp group, cp)
        self._sequence_counts = None
        self.reset_stats()

    def set_sequence_counts(self, reduce, cp: int) -> None:
        """Context parallel: the aux loss reads the per-sequence counts ``reduce``d over the cp
        ranks (whole sequences) and returns this rank's part (models/cp_model.py)."""
        self._sequence_counts = (reduce, int(cp))

    def reset_stats(self) -> None:
        self.tokens_per_expert = None
        self.dropped = 0
        self.aux_sum = None
        self.num_forwards = 0

    def stats_state(self) -> tuple:
        """(tokens_per_expert, dropped, aux_sum, num_forwards) gathered since the last reset."""
        return self.tokens_per_expert, self.dropped, self.aux_sum, self.num_forwards

    def load_stats_state(self, state: tuple) -> None:
        """Replace the gathered statistics (``stats_state``'s tuple)."""
        self.tokens_per_expert, self.dropped, self.aux_sum, self.num_forwards = state

    def weights(self) -> tuple:
        """The trainable weights in ``apply``'s order (router, experts, shared experts)."""
        shared = self.shared_experts.weights() if self.shared_experts is not None else ()
        return (self.router.weight, self.experts.weight1, self.experts.weight2) + shared

    def construct(self, x):
        return self.apply(x, *self.weights())

    def apply(self, x, w_router, weight1, weight2, *shared_ws):
        """``construct`` with the weights of :meth:`weights` as arguments (the expert bias,
        not trained, is read from the router)."""
        b, n, hdim = x.shape
        x2d = x.reshape(b * n, hdim)
        out, aux = self.routed_apply(x2d, b, w_router, weight1, weight2)
        if self.shared_experts is not None:   # the same x2d: the gradient sums in one order
            out = out + self.shared_experts.apply(x2d, *shared_ws)
        return out.reshape(b, n, hdim).astype(x.dtype), aux

    @property
    def has_aux(self) -> bool:
        return self.spec.load_balancing_type != "none" and self.spec.aux_loss_coeff > 0

    def routed_apply(self, x2d, b: int, w_router, weight1, weight2):
        """(routed experts' output [B*S, H], aux loss or None) of the tokens x2d [B*S, H] of
        ``b`` sequences, without the shared experts (tensor parallelism runs those on their
        own, ``models/tp_model.py``), with the router and
        expert weights as arguments: :meth:`route`, :meth:`dispatch`, :meth:`sequence_aux`,
        :meth:`record` (tensor x expert parallelism composes the same four on its own token
        split, ``models/tp_model.py``; :meth:`static_apply` the first and third with the
        static dispatch)."""
        scores, idx, gate_w = self.route(x2d, w_router)
        out, counts, dropped = self.dispatch(x2d, gate_w, idx, weight1, weight2)
        aux = self.sequence_aux(scores, idx, b)
        self.record(idx, counts, dropped, aux)
        return out, aux

    def route(self, x2d, w_router, expert_bias=None):
        """(scores [T, E] float32, top-k expert ids [T, k], gate weights [T, k]) of the tokens
        x2d [T, H]; every token is routed on its own (no token sees another). ``expert_bias``:
        the router's own unless given (a compiled graph takes it as an input)."""
        s = self.spec
        bias = self.router.expert_bias if expert_bias is None else expert_bias
        scores = rt.router_scores(router_logits(x2d, w_router), s.scoring_func)     # [T, E]
        idx = rt.select_experts(scores, bias, s.top_k, s.n_group, s.topk_group)
        return scores, idx, rt.gate_weights(scores, idx, s.norm_topk_prob,
                                            s.routed_scaling_factor)

    def dispatch(self, x2d, gate_w, idx, weight1, weight2):
        """(expert output [T, H], routed pairs per expert [E], dropped pairs) of routed tokens
        (``GroupedExperts.apply`` with this layer's dispatch options)."""
        s = self.spec
        return self.experts.apply(x2d, gate_w, idx, weight1, weight2, s.capacity_factor,
                                  s.drop_policy, s.pad_tokens)

    def sequence_aux(self, scores, idx, b: int):
        """The auxiliary loss of the routed tokens of ``b`` whole sequences (scores [B*S, E],
        ids [B*S, k]), or None when the layer has none."""
        s = self.spec
        if not self.has_aux:
            return None
        n = scores.shape[0] // b
        onehot = ops.one_hot(idx, s.num_experts, ms.Tensor(1.0, ms.float32),
                             ms.Tensor(0.0, ms.float32))
        per_seq = onehot.reshape(b, n * s.top_k, s.num_experts).sum(1)       # [B, E]
        if self._sequence_counts is not None:   # this rank's part (models/cp_model.py)
            per_seq = self._sequence_counts[0](per_seq)
        aux = rt.aux_loss(scores, per_seq, b, n, s.top_k, s.load_balancing_type,
                          s.aux_loss_coeff)
        if aux is not None and self._sequence_counts is not None:
            aux = aux / float(self._sequence_counts[1] ** 2)
        return aux

    @property
    def static_ok(self) -> bool:
        """Whether :meth:`static_apply` computes this layer: experts not split over ranks,
        and not the Ascend grouped-matmul dispatch."""
        s = self.spec
        return self.experts.ep_comm is None and not uses_grouped_matmul(s.capacity_factor,
                                                                        s.pad_tokens)

    def static_apply(self, x, expert_bias, w_router, weight1, weight2, *shared_ws):
        """:meth:`apply` with the static dispatch and the expert bias as an argument, pure:
        (y [B, S, H], aux (0 when there is none), selected experts [T, k], routed pairs
        per expert [E], dropped pairs) -- hand the last four to :meth:`record`."""
        s = self.spec
        b, n, hdim = x.shape
        x2d = x.reshape(b * n, hdim)
        scores, idx, gate_w = self.route(x2d, w_router, expert_bias)
        p = self.experts.precision
        out, counts, dropped = static_expert_ffn(p.cast(x2d), gate_w, idx, p.cast(weight1),
                                                 p.cast(weight2), s.ffn, s.capacity_factor,
                                                 s.drop_policy, s.pad_tokens)
        if self.shared_experts is not None:
            out = out + self.shared_experts.apply(x2d, *shared_ws)
        aux = self.sequence_aux(scores, idx, b)
        if aux is None:
            aux = ops.zeros((), ms.float32)
        return out.reshape(b, n, hdim).astype(x.dtype), aux, idx, counts, dropped

    def record(self, idx, counts, dropped, aux) -> None:
        """Add one forward's routing to the statistics since :meth:`reset_stats` (``routed_apply``
        does; callers of ``static_apply`` pass its outputs, aux None when ``has_aux`` is
        False)."""
        self.last_topk = ops.stop_gradient(idx)
        self.tokens_per_expert = counts if self.tokens_per_expert is None \
            else self.tokens_per_expert + counts
        self.dropped += int(dropped)
        self.num_forwards += 1
        if aux is not None:
            aux = ops.stop_gradient(aux)
            self.aux_sum = aux if self.aux_sum is None else self.aux_sum + aux
