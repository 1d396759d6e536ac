"""Data parallelism over msrun: environment, communication, gradient reduction, ZeRO-1.

Importing this package does not import MindSpore (``env`` re-exports the leaf
``mindformers_core.launch_env``, which the config layer reads for the world size); the other
modules load on first use:

    comm          init_distributed() (communication init only under msrun with > 1 worker),
                  Communicator (world-group AllReduce / AllGather / Broadcast, byte counters),
                  get_rank(), get_world_size(), barrier()
    grad_reduce   DataParallelGradReducer: the trainer's grad_reducer (token-weighted SUM)
    zero          ZeroSharding(comm, num_shards) for build_optimizer(..., shard_layout=...):
                  ZeRO-1 state sharding at construction (never a class swap afterwards)
    zero_muon     ZeRO rows as a Muon exchange level (ZeroRowsLevel, ZeroMuonMixin)
    shard_exchange  ShardedMuonExchange: Muon's comm_strategy (allgather /
                  allgather_deredundency) over sharding levels (SpecLevel: ShardSpec splits)
    tp_sharding   TensorParallelSharding(model.shard_specs(), comm) for build_optimizer:
                  optimizers on tensor-parallel shards (ZeRO-1 over dp on top)
    fsdp          data_parallel_shard_strategy optim_grads / optim_grads_params: apply_fsdp
                  (the trainer's hook), FSDPGradReducer, per-layer gathered units
    fsdp_layout   which parameters FSDP splits (dim-0 ShardSpecs over "dp"; pure)
    shard_layout  dim-0 shard layout, NS cost and owner assignment (pure)
    setup         setup_data_parallel(cfg): communicator + reducer for a run
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
    "ns_flops": "shard_layout", "setup_data_parallel": "setup",
    "TensorParallelSharding": "tp_sharding", "ShardedMuonExchange": "shard_exchange",
}

__all__ = ["env_rank", "env_world_size", "launched_by_msrun"] + sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
