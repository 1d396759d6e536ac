"""One call for a run: the communicator and the trainer's gradient reducer, which also says
how the optimizer is built sharded (ZeRO-1 per ``parallelism.data_parallel_shard``, QK-Clip
MAX reduction).

    reducer = setup_data_parallel()          # world 1 outside msrun: no communication init
    trainer = Trainer(cfg, out, grad_reducer=reducer)
    # Trainer, when it builds its optimizer:
    #     build_optimizer(cfg.optimizer, model, shard_layout=reducer.optimizer_sharding(cfg))
"""
from __future__ import annotations

from typing import Optional

from .comm import Communicator, init_distributed
from .grad_reduce import DataParallelGradReducer

__all__ = ["setup_data_parallel"]


def setup_data_parallel(comm: Optional[Communicator] = None) -> DataParallelGradReducer:
    """The reducer of this process (initialises communication only under msrun)."""
    return DataParallelGradReducer(comm or init_distributed())
