"""One call for a run: the communicator and the trainer's gradient reducer, which also says
how the optimizer is built sharded (ZeRO-1 per ``parallelism.data_parallel_shard``, QK-Clip
MAX reduction) and, under tensor parallelism, how the model is sharded.

    reducer = setup_parallel(cfg)            # world 1 outside msrun: no communication init
    trainer = Trainer(cfg, out, grad_reducer=reducer)
    # Trainer, when it builds its model and optimizer:
    #     model = apply_tensor_parallel(model, reducer.model_parallel_comm)   (tensor
    #     reducer.bind_model(model)                                  parallel only)
    #     build_optimizer(cfg.optimizer, model, shard_layout=reducer.optimizer_sharding(cfg))

``parallelism.tensor_parallel`` 1: ``grad_reduce.DataParallelGradReducer`` over the world.
Above 1: the mesh (``groups.make_mesh``: tp fastest, then dp) and its ``GroupCommunicator`` are
built once, and ``tp_reduce.TensorParallelGradReducer`` runs data parallelism over the dp group.
"""
from __future__ import annotations

from typing import Optional

from .comm import Communicator, init_distributed
from .grad_reduce import DataParallelGradReducer

__all__ = ["setup_parallel", "setup_data_parallel"]


def setup_parallel(cfg=None, comm: Optional[Communicator] = None):
    """The reducer of this process for ``cfg`` (initialises communication only under msrun)."""
    comm = comm or init_distributed()
    tp = 1 if cfg is None else int(cfg.parallelism.tensor_parallel)
    if tp == 1 or comm.world_size == 1:
        return DataParallelGradReducer(comm)
    from .collectives import GroupCommunicator
    from .groups import make_mesh
    from .tp_reduce import TensorParallelGradReducer
    mesh = make_mesh(comm.world_size, tp=tp)
    return TensorParallelGradReducer(GroupCommunicator(mesh, comm.rank))


def setup_data_parallel(comm: Optional[Communicator] = None) -> DataParallelGradReducer:
    """The data-parallel reducer over the world (tensor_parallel 1)."""
    return setup_parallel(None, comm)
