"""Parallel training over msrun: the run's layout, its communicator, and one module per kind.

Importing this package does not import MindSpore; the modules load on first use:

    setup           setup_parallel(cfg) -> ParallelRun: the one object the trainer calls for
                    every layout (parallelize the model, shard the optimizer, reduce, norm)
    comm            init_distributed() (communication init only under msrun with > 1 worker),
                    Communicator (world-group AllReduce / AllGather / Broadcast, byte counters)
    collectives     GroupCommunicator: collectives over the named groups of the run's
                    ParallelDims (core/parallel_dims.py), native or emulated by capability
    grad_reduce     data parallel: token-weighted SUM of gradients (bucketed)
    zero / zero_muon  ZeRO-1 state sharding at optimizer construction; ZeRO rows for Muon
    tp_reduce / tp_sharding   tensor parallel (+sequence parallel): the reduction and
                    the optimizers over TP shards (the layout is the model's: models/tp_plan.py)
    fsdp / fsdp_layout   data_parallel_shard_strategy optim_grads / optim_grads_params
    ep_reduce       expert parallel: expert gradients over the edp group
    pipeline_*      pipeline parallel: stage split, schedules, stage executor, checkpoints
    shard_spec / shard_layout / shard_exchange   the shared layout math: how a parameter is
                    split, dim-0 shard layouts, Muon's comm_strategy exchange

Which combinations run is config/layout.py's ``check_layout``.
"""
from __future__ import annotations

import importlib

from ..launch_env import env_rank, env_world_size, launched_by_msrun

_LAZY = {
    "Communicator": "comm", "CommStats": "comm", "init_distributed": "comm",
    "get_communicator": "comm", "get_rank": "comm", "get_world_size": "comm",
    "is_distributed": "comm", "barrier": "comm",
    "DataParallelGradReducer": "grad_reduce", "plan_buckets": "grad_reduce",
    "optimizer_state_bytes": "zero", "ZeroSharding": "zero",
    "ShardLayout": "shard_layout", "assign_owners": "shard_layout", "ns_cost": "shard_layout",
    "ns_flops": "shard_layout", "setup_parallel": "setup", "ParallelRun": "setup",
    "TensorParallelSharding": "tp_sharding", "ShardedMuonExchange": "shard_exchange",
}

__all__ = ["env_rank", "env_world_size", "launched_by_msrun"] + sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
