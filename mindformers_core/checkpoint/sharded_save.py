"""The trainer's use of sharded checkpoints (``sharded_checkpoint.py``).

A run saves sharded when any parameter is sharded (the model's ``shard_specs()``: tensor,
expert or fully sharded data parallel) or its optimizer state is row-sharded (ZeRO-1,
``distributed/zero.py``); otherwise it writes the single-process file as before. Every rank
writes its own pieces without gathering anything; one all-reduce (the reducer's
``broadcast_flag``) then tells every rank that all rank files are complete, or that one
failed, and only then rank 0 writes the index (and prunes). After a failure every rank
removes the rank file it finished (:func:`settle_rank_file`), so a failed save leaves nothing
behind; leftovers of a killed save are never listed (``store.list_checkpoints`` sees only
index names) and are bound to no index. Resuming reads either format as
full tensors and :func:`reshard_for_model` cuts them to this rank's layout; the trainer calls
it once the model is cut (``ParallelRun.parallelize``: TP slices, FSDP, the EP cut),
so ``shard_specs()`` is the final layout and either format gives the same start. Optimizer
slots follow their parameter's spec with local shapes: a tp shard (with ZeRO-1 rows of it
under dp > 1), an expert's whole state on its rank, an FSDP parameter's rows.

A rank's index along each group, and each group's size, come from the run's layout
(``trainer.parallel``: ``coords()`` / ``axis_sizes()`` of its ParallelDims,
core/parallel_dims.py), the same for every layout. With
``checkpoint.remove_redundancy`` each rank writes only its balanced share of the pieces it
holds with other ranks (``checkpoint_plan.py``); by default it writes all of them. Resuming
reads the rank files with ``checkpoint.load_worker_number`` threads and merges the tensors with
``checkpoint.reshard_worker_num`` threads.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from typing import Optional, Protocol, Tuple, runtime_checkable

from ..distributed.shard_spec import ShardedModel, model_rows, model_specs, param_of
from .store import checkpoint_name, prune_checkpoints
from .balanced_load import file_sharing
from .file_io import CheckpointData, CheckpointError
from .sharded import ZeroRows, reshard, save_index, with_model_rows, write_rank

__all__ = ["RowShardedOptimizer", "uses_sharded_checkpoint", "save_sharded",
           "settle_rank_file", "load_options", "reshard_for_model"]


@runtime_checkable
class RowShardedOptimizer(Protocol):
    """ZeRO-1: this rank's rows of the optimizer state, read without communication."""

    @property
    def zero_shards(self) -> Tuple[int, int, int, int]: ...

    def shard_state_dict(self): ...


def uses_sharded_checkpoint(model, optimizer, save_optim: bool = True) -> bool:
    """True when any parameter, or (saved) optimizer slot, is sharded."""
    if any(s.is_sharded and s.num_shards > 1 for s in model_specs(model).values()):
        return True
    return save_optim and isinstance(optimizer, RowShardedOptimizer) and \
        optimizer.zero_shards[0] > 1


def save_sharded(trainer, write_hook=None) -> Optional[str]:
    """Every rank writes its rank file; rank 0 writes the index last and returns its path."""
    ck, opt = trainer.ckpt_cfg, trainer.optimizer
    sd, zero = None, None
    if not ck.no_save_optim:
        if isinstance(opt, RowShardedOptimizer):
            sd, rows = opt.shard_state_dict()
            zero = ZeroRows({f"optim.{k}": r for k, r in rows.items()}, *opt.zero_shards)
        else:
            sd = opt.state_dict()
    tensors, dtypes, state = trainer.checkpoint_payload(optimizer_state=sd)
    zero = with_model_rows(zero, tensors, model_rows(trainer.model))
    layout = trainer.parallel   # trainer.protocols.RunLayout
    step, world, rank = trainer.state.step, layout.world_size, trainer.rank
    name = checkpoint_name(ck.prefix, step)
    error, written = None, None
    try:
        written = write_rank(trainer.save_dir, name, step, rank, world,
                             {k: v for k, v in tensors.items() if param_of(k) is not None},
                             model_specs(trainer.model), layout.coords(), zero, dtypes,
                             trainer.run_id, write_hook, layout.axis_sizes(),
                             ck.remove_redundancy)
    except CheckpointError as exc:
        error = exc
    except ValueError as exc:   # a local shape that contradicts its ShardSpec
        error = CheckpointError(f"cannot save checkpoint {name}: {exc}")
    # the barrier: after it every rank file is complete, or every rank knows one is not
    settle_rank_file(written, error, layout.broadcast_flag(error is not None), name)
    if rank != 0:
        return None
    path = save_index(trainer.save_dir, name, step, world,
                      {k: v for k, v in tensors.items() if param_of(k) is None}, state,
                      trainer.cfg.to_dict(), trainer.run_id, lineage=trainer.lineage)
    prune_checkpoints(trainer.save_dir, ck.prefix, ck.save_max, run_id=trainer.run_id,
                      protect=ck.keep_steps, lineage=trainer.lineage)
    trainer.log(f"saved checkpoint {path}")
    return path


def settle_rank_file(written: Optional[str], error: Optional[CheckpointError], failed: bool,
                     name: str) -> None:
    """After the barrier of a save: when any rank failed (``failed``), remove this rank's
    finished rank file ``written`` (a failed save leaves no part of itself behind; each rank
    removes its own, the directory need not be shared) and raise this rank's ``error``, or
    one saying another rank failed."""
    if not failed:
        return
    if written is not None:
        with contextlib.suppress(OSError):
            os.remove(written)
    raise error or CheckpointError(f"another rank could not write its part of checkpoint "
                                   f"{name}; the previous checkpoints are kept")


def load_options(ck, comm=None) -> dict:
    """``resolve_checkpoint``'s keyword arguments from the ``checkpoint:`` section (``comm``:
    the run's GroupCommunicator, None on one process)."""
    return {"read_workers": ck.load_worker_number, "merge_workers": ck.reshard_worker_num,
            "sharing": file_sharing(ck.load_balanced, comm)}


def reshard_for_model(data: CheckpointData, model, layout) -> CheckpointData:
    """The checkpoint's tensors as this rank's model holds them (a model without
    ``shard_specs`` takes them as they are); ``layout``: the run's (``coords()``)."""
    if not isinstance(model, ShardedModel):
        return data
    data = reshard(data, model.shard_specs(), layout.coords(),
                   [p.name for p in model.get_parameters()])
    rows = model_rows(model)
    if not rows:
        return data
    # tp x FSDP: the model keeps its dp rows of each tp slice (the optimizer cuts its own
    # entries, distributed/zero.py load_state_dict)
    tensors = dict(data.tensors)
    for name, (start, stop, _) in rows.items():
        key = f"model.{name}"
        if key in tensors:
            tensors[key] = tensors[key][start:stop]
    return replace(data, tensors=tensors)
