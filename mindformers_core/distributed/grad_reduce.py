"""Data-parallel gradient reduction (the data-parallel builder of distributed/setup.py).

Token weighting (the loss is the mean over every loss token of the global batch). Rank r holds micro-batches with loss-token counts
``n_rj``; the global step has ``T = sum_r sum_j n_rj`` tokens. The trainer asks
:meth:`DataParallelGradReducer.global_token_count` for T *before* any backward pass and
back-propagates ``sum_j loss_sum_rj / T`` on every rank, so rank r's accumulated gradient is
``G_r = grad(sum_j loss_sum_rj) / T`` and

    SUM_r G_r = grad(sum over every token of the global batch) / T

which is exactly the single-process gradient of the same global batch (mean over all loss
tokens), whatever the per-rank token counts are. :meth:`reduce` therefore SUMs gradients,
token-loss sums and token counts over ranks: the logged loss ``loss_sum / T`` and the norm of
the reduced gradients are global.

Few, large collectives: every gradient is flattened (fp32) into buckets of at most
``bucket_bytes`` with the loss sum and token count appended to the last one, one all-reduce
per bucket (one in total for small models), and the result is split back into Tensors of the
original shapes.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from .comm import Communicator

__all__ = ["DataParallelGradReducer", "plan_buckets"]

DEFAULT_BUCKET_BYTES = 256 * 2 ** 20


def plan_buckets(sizes: Sequence[int], bucket_bytes: int, itemsize: int = 4) -> List[List[int]]:
    """Consecutive groups of gradient indices, each at most ``bucket_bytes`` (a gradient
    larger than that is a bucket of its own). Every index appears once, in order."""
    buckets: List[List[int]] = []
    current: List[int] = []
    size = 0
    for i, n in enumerate(sizes):
        nbytes = int(n) * itemsize
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current or not buckets:
        buckets.append(current)
    return buckets


class DataParallelGradReducer:
    """SUM of gradients, token-loss sums and token counts over the data-parallel ranks.

    Implements ``distributed.setup.GradReduction`` (what the run's layout calls), plus
    ``optimizer_sharding`` and ``reduce_max`` (MAX over ranks).
    """

    def __init__(self, comm: Communicator, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 data_parallel: Optional[int] = None):
        self.comm = comm
        self.world_size = comm.world_size
        self.rank = comm.rank
        self.bucket_bytes = int(bucket_bytes)
        #: the data-parallel size ZeRO-1 reads ``parallelism.data_parallel_shard`` against:
        #: ``comm``'s size when it is one stage's dp group (distributed/pipeline_parallel.py);
        #: None derives it from the world (``zero.optimizer_shards``)
        self.data_parallel = data_parallel

    def global_token_count(self, local_tokens: float) -> float:
        """Loss tokens of the whole global step.

        The CPU all-reduce sums float32 only (no int32/float64 kernel), exact up to 2**24; an
        integer count is sent as ``(n // 4096, n % 4096)`` so the sum stays exact up to 2**36
        tokens; a fractional count (weighted loss mask) is summed in float32."""
        if self.world_size == 1:
            return float(local_tokens)
        n = float(local_tokens)
        if n.is_integer() and 0 <= n < 2 ** 36:
            hi, lo = divmod(int(n), 4096)
            total = self.comm.all_reduce_sum(np.array([hi, lo], np.float32))
            return float(int(total[0]) * 4096 + int(total[1]))
        return float(self.comm.all_reduce_sum(np.array([n], np.float32))[0])

    def reduce(self, grads: Sequence, loss_sum: float,
               n_tokens: float) -> Tuple[List, float, float]:
        """``(SUM_r grads_r, SUM_r loss_sum_r, SUM_r n_tokens_r)``; ``None`` gradients stay
        ``None`` (the same parameters have no gradient on every rank)."""
        grads = list(grads)
        if self.world_size == 1:
            return grads, float(loss_sum), float(n_tokens)
        import mindspore as ms
        from mindspore import ops
        live = [i for i, g in enumerate(grads) if g is not None]
        sizes = [int(np.prod(grads[i].shape)) for i in live]
        buckets = plan_buckets(sizes, self.bucket_bytes)
        out = list(grads)
        scalars = None
        for b, bucket in enumerate(buckets):
            idx = [live[k] for k in bucket]
            parts = [grads[i].astype(ms.float32).reshape(-1) for i in idx]
            if b == len(buckets) - 1:
                parts.append(ms.Tensor(np.array([loss_sum, n_tokens], np.float32)))
            flat = ops.cat(parts) if len(parts) > 1 else parts[0]
            reduced = self.comm.all_reduce_sum(flat)
            split_sizes = [int(np.prod(grads[i].shape)) for i in idx]
            if b == len(buckets) - 1:
                split_sizes.append(2)
            pieces = ops.split(reduced, split_sizes) if len(split_sizes) > 1 else [reduced]
            for i, piece in zip(idx, pieces):
                out[i] = piece.reshape(grads[i].shape)
            if b == len(buckets) - 1:
                scalars = pieces[-1].asnumpy()
        return out, float(scalars[0]), float(scalars[1])

    def mean_over_ranks(self, value: float) -> float:
        """The mean of a per-rank scalar metric over the ranks, for metrics that each rank
        averages over the same number of micro-batches (the MTP loss): the single-process
        value of the global batch. One float32 all-reduce."""
        if self.world_size == 1:
            return float(value)
        return float(self.comm.all_reduce_sum(np.array([value], np.float32))[0]) / self.world_size

    def broadcast_flag(self, flag: bool) -> bool:
        """True on every rank when any rank raised the flag (a stop request)."""
        if self.world_size == 1:
            return bool(flag)
        return bool(self.comm.all_reduce_sum(np.array([1.0 if flag else 0.0], np.float32))[0] > 0)

    def optimizer_sharding(self, cfg):
        """What ``build_optimizer(..., shard_layout=...)`` takes for this run:
        ``zero.ZeroSharding`` over ``parallelism.dp_shard`` ranks (None on one rank)."""
        if self.world_size == 1:
            return None
        from .zero import ZeroSharding, optimizer_shards  # MindSpore only when a run needs it
        shards = (optimizer_shards(cfg, self.comm) if self.data_parallel is None
                  else cfg.parallelism.optimizer_shards(self.data_parallel))
        return ZeroSharding(self.comm, shards)

    def sync_moe_stats(self, model) -> None:
        """SUM the MoE token-per-expert counts over ranks (one all-reduce) before the
        aux-loss-free expert-bias update, so every rank applies the single-process update of
        the global batch and the replicas stay identical."""
        if self.world_size == 1:
            return
        loads = model.get_tokens_per_expert()
        if not loads:
            return
        import mindspore as ms
        layers = sorted(loads)
        flat = np.concatenate([np.asarray(loads[i], np.float32).reshape(-1) for i in layers])
        total = self.comm.all_reduce_sum(flat)
        off = 0
        for i in layers:
            moe = model.moe_layers()[i]
            n = int(np.asarray(loads[i]).size)
            moe.tokens_per_expert = ms.Tensor(total[off:off + n].copy())
            off += n

    def reduce_max(self, values: np.ndarray) -> np.ndarray:
        """Element-wise MAX over ranks (QK-Clip's tracked max attention logits)."""
        return self.comm.all_reduce_max(np.asarray(values))

    def bind_parameters(self, params: Sequence) -> None:
        """Nothing to learn: every gradient is whole and replicated."""

    def grad_norm(self, grads: Sequence) -> float:
        """The L2 norm of the reduced (replicated) gradients: the same on every rank."""
        from ..optim.clip_grad import global_grad_norm
        return float(global_grad_norm(grads))

    def combine_qk_stats(self, stats):
        """Every replica clipped the same heads: this rank's report is the step's."""
        return stats

