"""Split a model's routed experts over the expert-parallel group (``parallelism.expert_parallel``).

Megatron's layout: EP is carved out of data parallelism (``core.parallel_dims``), so the ``ep``
ranks of a group see different data, hold the same dense weights (replicated, reduced over dp
as without EP) and each hold ``E / ep`` whole experts of every MoE layer: rank ``r`` of the
group keeps experts ``[r * E/ep, (r + 1) * E/ep)`` of ``experts.weight1`` [E, H, 2F] and
``experts.weight2`` [E, F, H], i.e. shard ``r`` of the ShardSpec ``(full shape, split_dim 0,
group "ep", ep)``. The router (and its ``expert_bias``) and the shared experts stay replicated.

The model is built whole with the single-process initialisation (same seed, same values) and
then cut, so an EP run starts from exactly the single-process weights (and a whole-model
checkpoint loaded before the cut resumes under EP). The full expert tensors exist on every rank
once, at start-up; building only the local experts would need the initialiser to draw the
same values for a slice.
"""
from __future__ import annotations

from typing import Dict

from ..distributed.shard_params import cut_parameter
from ..distributed.shard_spec import ShardSpec
from .ep_dispatch import AllToAll
from .moe import GroupedExperts

__all__ = ["expert_spec", "shard_experts"]


def expert_spec(full_shape, ep: int) -> ShardSpec:
    """The layout of a grouped expert weight split over ``ep`` ranks (dim 0 = experts)."""
    return ShardSpec(tuple(full_shape), 0, "ep", int(ep))


def shard_experts(model, comm) -> Dict[str, ShardSpec]:
    """Keep this rank's experts in every MoE layer of ``model`` (``moe_layers()``) and route
    their tokens over the ``ep`` group of ``comm`` (a ``GroupCommunicator``); returns the specs
    recorded (name -> ShardSpec). ``ep == 1``: nothing changes, {}."""
    ep = len(comm.ranks("ep"))
    if ep == 1:
        return {}
    index = comm.mesh.local_rank("ep", comm.rank)
    out: Dict[str, ShardSpec] = {}
    for moe in model.moe_layers().values():
        experts: GroupedExperts = moe.experts
        if experts.ep_comm is not None:
            raise ValueError("the experts of this model are already split over expert parallel "
                             "ranks")
        for attr in ("weight1", "weight2"):
            # a new Parameter: a rank whose experts get no token in a step must still get
            # gradients of the local shape (distributed/shard_params.py)
            spec = expert_spec(getattr(experts, attr).shape, ep)
            param = cut_parameter(experts, attr, spec, index)
            experts.specs[param.name] = spec
            out[param.name] = spec
        experts.ep_comm = comm
        experts.exchange = AllToAll(comm, "ep")
        moe.expert_parallel = ep
    return out
