"""Pipeline-parallel rules of the `parallelism:` section (``pipeline_parallel`` > 1).

Each rule is the pure function of distributed/pipeline_schedule.py or core/pipeline_split.py
that raises ValueError with upstream's message; here it becomes a ConfigError naming the field:

* ``pipeline_parallel_schedule``: ``1f1b`` or ``interleaved_1f1b`` (``gpipe`` is not
  implemented); with ``pipeline_parallel_interleave_num`` > 1 both run interleaved 1F1B;
* ``pipeline_parallel_interleave_num`` >= 1, above 1 only with ``pipeline_parallel`` > 1;
* ``pipeline_parallel_layers_per_stage``: ``auto`` (layers divisible by pp * interleave) or one
  layer-range string per stage, tiling ``model.num_layers`` (also as upstream's one string,
  the stages separated by ``|``: :func:`stage_ranges`);
* the micro-batches of a step are the accumulation count (``pipeline_parallel_microbatch_size``
  is overwritten with it, as upstream); interleaved needs a multiple of ``pipeline_parallel``;
* which layouts pipeline parallel composes with is config/layout.py's (evaluation and the
  sample run through the stages: distributed/pipeline_eval.py).
"""
from __future__ import annotations

from typing import Optional

from ..core.pipeline_split import split_layers
from ..errors import ConfigError
from .compat.noop import require_noop

__all__ = ["stage_ranges", "check_pipeline_fields", "check_pipeline_vs_model",
           "check_pipeline_vs_plan"]


def stage_ranges(value):
    """``pipeline_parallel_layers_per_stage`` as written, with upstream's one-string form
    (``"0-3,8-11|4-7,12-15"``: the stages' layer ranges separated by ``|``) as the list of one
    string per stage; any other value unchanged."""
    if isinstance(value, str) and value != "auto":
        return [part.strip() for part in value.split("|")]
    return value


def check_pipeline_fields(par, path: str) -> None:
    """Section-local rules (``par`` a ParallelismConfig)."""
    vpp, pp = par.pipeline_parallel_interleave_num, par.pipeline_parallel
    if vpp < 1:
        raise ConfigError(f"{path}.pipeline_parallel_interleave_num", f"must be >= 1, got {vpp}")
    if vpp > 1 and pp == 1:
        raise ConfigError(f"{path}.pipeline_parallel_interleave_num",
                          f"must be 1 when pipeline_parallel is 1, got {vpp}")
    if par.pipeline_parallel_microbatch_size < 1:
        raise ConfigError(f"{path}.pipeline_parallel_microbatch_size",
                          f"must be >= 1, got {par.pipeline_parallel_microbatch_size}")
    lps = par.pipeline_parallel_layers_per_stage
    if lps not in (None, "auto") and (not isinstance(lps, (list, tuple))
                                      or not all(isinstance(x, str) for x in lps)):
        raise ConfigError(f"{path}.pipeline_parallel_layers_per_stage",
                          f"must be 'auto' or a list of one layer-range string per stage "
                          f"(e.g. ['0-1', '2-3'], or ['0-1,4-5', '2-3,6-7'] with "
                          f"interleave 2, or the string '0-1,4-5|2-3,6-7'), got {lps!r}")
    if pp > 1:
        require_noop(f"{path}.pipeline_parallel_schedule", par.pipeline_parallel_schedule,
                     ("1f1b", "interleaved_1f1b"), "the GPipe schedule")


def check_pipeline_vs_model(par, model, path: str = "parallelism") -> None:
    """``pipeline_parallel_layers_per_stage`` against ``model.num_layers``."""
    if par.pipeline_parallel == 1 and par.pipeline_parallel_layers_per_stage in (None, "auto"):
        return
    try:
        split_layers(model.num_layers, par.pipeline_parallel,
                     par.pipeline_parallel_interleave_num, par.pipeline_parallel_layers_per_stage)
    except ValueError as err:
        raise ConfigError(f"{path}.pipeline_parallel_layers_per_stage", str(err)) from None


def check_pipeline_vs_plan(par, world_size: int, num_micro: Optional[int],
                           path: str = "parallelism") -> None:
    """The launcher's world and the step's micro-batch count against the pipeline."""
    pp = par.pipeline_parallel
    if pp == 1:
        return
    if num_micro is not None and par.pipeline_parallel_interleave_num > 1 and num_micro % pp:
        raise ConfigError("training.global_batch_size",
                          f"number of microbatches ({num_micro}) is not divisible by "
                          f"pipeline-model-parallel-size ({pp}) when using interleaved schedule "
                          f"(the micro-batches are global_batch_size // local_batch_size; "
                          f"parallelism.pipeline_parallel_interleave_num "
                          f"{par.pipeline_parallel_interleave_num})")
