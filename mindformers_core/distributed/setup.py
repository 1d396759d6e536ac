"""One call for a run: the communicator, the trainer's gradient reducer, and the optimizer
preparation (ZeRO-1 sharding per ``parallelism.data_parallel_shard``, QK-Clip MAX reduction).

    reducer = setup_data_parallel()          # world 1 outside msrun: no communication init
    trainer = Trainer(cfg, out, grad_reducer=reducer)
    # Trainer, right after building its optimizer:
    #     optimizer = reducer.prepare_optimizer(optimizer, cfg)
"""
from __future__ import annotations

from typing import Optional

from .comm import Communicator, init_distributed
from .grad_reduce import DataParallelGradReducer
from .zero import prepare_optimizer

__all__ = ["setup_data_parallel", "prepare_optimizer"]


def setup_data_parallel(comm: Optional[Communicator] = None) -> DataParallelGradReducer:
    """The reducer of this process (initialises communication only under msrun)."""
    return DataParallelGradReducer(comm or init_distributed())
