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

The reduction itself is :func:`reduce_gradients`, the one of every layout: each parameter's
``grad_route.GradRoute`` (declared by the layout's builders, ``GradReduction.grad_routes``)
says which groups its gradient is summed or reduce-scattered over. Few, large collectives:
the gradients of one route are flattened (fp32) into buckets of at most ``bucket_bytes``,
with the loss sum and token count appended to the last bucket of the data-parallel route, one
collective per bucket and group (one in total for a small data-parallel model), and the
result is split back into Tensors of the original shapes. :func:`gradient_norm` is the one
global norm, from the same routes.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from .comm import Communicator
from .grad_route import GradRoute, combine_sq_norms, norm_batches, route_batches

__all__ = ["DataParallelGradReducer", "plan_buckets", "RouteComm", "WORLD",
           "reduce_gradients", "gradient_norm"]

#: the group name of a route over the world :class:`~.comm.Communicator` (data parallel
#: without a mesh axis of its own to name)
WORLD = "world"

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

    def __init__(self, comm: Communicator, data_parallel: Optional[int] = None,
                 group: str = WORLD):
        self.comm = comm
        self.world_size = comm.world_size
        self.rank = comm.rank
        #: the group ``comm`` is (``WORLD``, or the ``GroupView``'s group under tp / pp): the
        #: gradient routes and the loss sum and token count are summed over it
        self.token_group = group
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

    # -- the gradient routes (distributed/grad_route.py) ------------------------------------
    def grad_routes(self, params: Sequence) -> List[GradRoute]:
        """Every gradient SUMmed over this reducer's ranks (:attr:`token_group`), whole and
        replicated, counted once in the norm."""
        route = GradRoute((self.token_group,)) if self.world_size > 1 else GradRoute()
        return [route] * len(params)

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

    def combine_qk_stats(self, stats):
        """Every replica clipped the same heads: this rank's report is the step's."""
        return stats



class RouteComm:
    """The collectives a route names: :data:`WORLD` on the world ``Communicator``, a mesh
    axis (or an added group) on the run's ``GroupCommunicator``."""

    def __init__(self, world: Communicator, groups=None):
        self.world, self.groups = world, groups
        self.world_size = world.world_size

    def _mesh(self, group: str):
        if self.groups is None:
            raise ValueError(f"a gradient route over the {group!r} group needs the run's "
                             f"GroupCommunicator")
        return self.groups

    def all_reduce(self, x, group: str):
        if group == WORLD:
            return self.world.all_reduce_sum(x)
        return self._mesh(group).all_reduce(x, group)

    def reduce_scatter(self, x, group: str):
        return self._mesh(group).reduce_scatter(x, group, 0)

    def size(self, group: str) -> int:
        return self.world_size if group == WORLD else len(self._mesh(group).ranks(group))

    def group_sum(self, group: str, value: float) -> float:
        if group == WORLD:
            return float(self.world.all_reduce_sum(np.array([value], np.float32))[0])
        return float(self._mesh(group).group_sum(group, value))


def _check_routes(grads, routes, who: str) -> None:
    if routes is None or len(routes) != len(grads):
        raise RuntimeError(f"{who}: {len(grads)} gradients for "
                           f"{'no' if routes is None else len(routes)} gradient routes: bind "
                           f"the optimizer's parameters first (ParallelRun.bind_optimizer)")


def reduce_gradients(grads: Sequence, routes: Sequence[GradRoute], comm: RouteComm,
                     token_group: Optional[str], loss_sum: float, n_tokens: float,
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Tuple[List, float, float]:
    """``(reduced gradients, loss sum, token count)``: every gradient through its route
    (module docstring), the two scalars SUMmed over ``token_group`` (None: this rank's).
    ``None`` gradients stay ``None`` (the same parameters have none on every rank)."""
    grads = list(grads)
    _check_routes(grads, routes, "reduce_gradients")
    if comm.world_size == 1:
        return grads, float(loss_sum), float(n_tokens)
    import mindspore as ms
    from mindspore import ops
    out = list(grads)
    scalars = np.array([loss_sum, n_tokens], np.float32)
    carried = token_group is None
    for (sum_over, scatter), idx in route_batches(routes, [g is not None for g in grads]):
        if scatter is not None:
            _scatter(grads, out, idx, sum_over, scatter, comm)
            continue
        sizes = [int(np.prod(grads[i].shape)) for i in idx]
        buckets = plan_buckets(sizes, bucket_bytes)
        for b, bucket in enumerate(buckets):
            ids = [idx[k] for k in bucket]
            parts = [grads[i].astype(ms.float32).reshape(-1) for i in ids]
            split_sizes = [sizes[k] for k in bucket]
            carry = not carried and sum_over == (token_group,) and b == len(buckets) - 1
            if carry:
                parts.append(ms.Tensor(scalars))
                split_sizes.append(2)
            flat = ops.cat(parts) if len(parts) > 1 else parts[0]
            for group in sum_over:
                flat = comm.all_reduce(flat, group)
            pieces = ops.split(flat, split_sizes) if len(split_sizes) > 1 else [flat]
            for i, piece in zip(ids, pieces):
                out[i] = piece.reshape(grads[i].shape)
            if carry:
                scalars, carried = pieces[-1].asnumpy(), True
    if not carried:
        scalars = np.asarray(comm.all_reduce(scalars, token_group))
    for i, route in enumerate(routes):
        if route.scale != 1.0 and out[i] is not None:
            out[i] = out[i] * ms.Tensor(np.float32(route.scale))
    return out, float(scalars[0]), float(scalars[1])


def _scatter(grads, out, idx, sum_over, group: str, comm: RouteComm) -> None:
    """FSDP's ``optim_grads``: the gradients of ``idx`` reduce-scattered over ``group`` to
    this rank's dim-0 rows, in one collective (after any ``sum_over`` sums)."""
    import mindspore as ms
    from mindspore import ops
    s = comm.size(group)
    flat = ops.cat([grads[i].astype(ms.float32).reshape(s, -1) for i in idx], 1)
    for g in sum_over:
        flat = comm.all_reduce(flat, g)
    mine = comm.reduce_scatter(flat, group).reshape(-1)
    sizes = [int(np.prod(grads[i].shape)) // s for i in idx]
    pieces = ops.split(mine, sizes) if len(sizes) > 1 else [mine]
    for i, piece in zip(idx, pieces):
        out[i] = piece.reshape((grads[i].shape[0] // s,) + tuple(grads[i].shape[1:]))


def gradient_norm(grads: Sequence, routes: Sequence[GradRoute],
                  group_sum: Callable[[str, float], float], outer: Sequence[str] = (),
                  bucket_norm: Optional[Callable[[Sequence], float]] = None) -> float:
    """The global L2 norm of reduced gradients, the same on every rank: one bucketed norm
    (``bucket_norm``, default the trainer's fp32 ``optim.clip_grad.global_grad_norm``) per
    norm group of the routes, combined by ``grad_route.combine_sq_norms`` (``outer``: the
    pipeline's stages)."""
    import math
    if bucket_norm is None:
        from ..optim.clip_grad import global_grad_norm as bucket_norm
    grads = list(grads)
    _check_routes(grads, routes, "gradient_norm")
    batches = norm_batches(routes, [g is not None for g in grads])
    norms = [(group, float(bucket_norm([grads[i] for i in idx]))) for group, idx in batches]
    if not outer and len(norms) <= 1 and all(g is None for g, _ in norms):
        return norms[0][1] if norms else 0.0   # one replicated bucket: its norm as it is
    return math.sqrt(combine_sq_norms([(g, n * n) for g, n in norms], group_sum, outer))
