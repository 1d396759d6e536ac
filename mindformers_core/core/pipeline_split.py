"""Which decoder layers each pipeline (virtual) stage runs, and which stage owns a parameter.

Pure. ``pp`` stages with ``vpp`` chunks each (``pipeline_parallel_interleave_num``): ``V = pp *
vpp`` virtual stages, chunk ``c`` of stage ``s`` being virtual stage ``c * pp + s``
(distributed/pipeline_schedule.py). ``pipeline_parallel_layers_per_stage`` (upstream's form):

* ``"auto"`` / None: ``num_layers / V`` consecutive layers per virtual stage (it must divide);
* a list of ``pp`` strings, one per stage, each ``vpp`` comma-separated inclusive ranges
  ``"start-end"`` (or one layer ``"k"``), e.g. pp 2, vpp 2: ``["0-1,4-5", "2-3,6-7"]``.
  Read in virtual-stage order the ranges must tile ``0 .. num_layers - 1`` (uneven splits are
  fine; every virtual stage needs at least one layer).

The embedding is on virtual stage 0, the final norm, the output layer, the loss and the MTP
depths (``mtp.*``) on the last one. The embedding table is also read by the last stage when
the output layer is tied to it or MTP embeds its shifted inputs: those two copies are one
parameter whose gradients are summed over the first and last stage (the "embedding group").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["StageSplit", "split_layers", "pipeline_stages", "AUTO_MESSAGE", "warmup_forwards",
           "peak_in_flight_bound"]

AUTO_MESSAGE = ("Number of layers ({n}) is not divisible by total stages ({t}).Please configure "
                "the model distribution via 'pipeline_parallel_layers_per_stage'.")
EMBEDDING = "embedding.word_embeddings.weight"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def warmup_forwards(pp: int, stage: int, num_micro: int, vpp: int = 1) -> int:
    """Forwards ``stage`` runs before its first backward: 1F1B ``min(pp - stage - 1, M)``;
    interleaved (``vpp`` > 1) ``min((pp - stage - 1) * 2 + (vpp - 1) * pp, M * vpp)``, all of
    them when ``M == pp`` (Megatron's counts; distributed/pipeline_schedule.py)."""
    if vpp == 1:
        return min(pp - stage - 1, num_micro)
    total = num_micro * vpp
    if num_micro == pp:
        return total
    return min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)


def peak_in_flight_bound(pp: int, stage: int, num_micro: int, vpp: int = 1) -> int:
    """Micro-batch chunks whose activations ``stage`` holds at most: the warm-up plus the one
    forward before the first backward, never more than all of them (1F1B: ``pp - stage``)."""
    return min(warmup_forwards(pp, stage, num_micro, vpp) + 1, num_micro * vpp)


def _parse_range(text: str) -> Tuple[int, int]:
    parts = text.strip().split("-")
    if len(parts) > 2:
        raise ValueError(f"Invalid layer range format: {text}. "
                         "Expected format is 'start-end' or 'single_layer'.")
    try:
        start, end = int(parts[0]), int(parts[-1])
    except ValueError:
        raise ValueError(f"Invalid layer range format: {text}. Layer IDs must be integers, got "
                         f"'{parts[0]}' and '{parts[-1]}'") from None
    if start > end:
        raise ValueError(f"Invalid layer range format: {text}. "
                         "layer_start must be less than or equal to layer_end.")
    return start, end


def split_layers(num_layers: int, pp: int, vpp: int = 1,
                 layers_per_stage=None) -> List[range]:
    """The decoder layers of each virtual stage (index = virtual stage)."""
    total = pp * vpp
    if layers_per_stage in (None, "auto"):
        if num_layers % total:
            raise ValueError(AUTO_MESSAGE.format(n=num_layers, t=total))
        k = num_layers // total
        return [range(v * k, (v + 1) * k) for v in range(total)]
    if isinstance(layers_per_stage, str) or not isinstance(layers_per_stage, Sequence):
        raise ValueError(f"must be 'auto' or a list of {pp} layer-range strings (one per stage, "
                         f"e.g. ['0-1', '2-3']), got {layers_per_stage!r}")
    if len(layers_per_stage) != pp:
        raise ValueError(f"has {len(layers_per_stage)} entries, but pipeline_parallel is {pp}: "
                         f"one layer-range string per stage")
    ranges: Dict[int, Tuple[int, int]] = {}
    for stage, text in enumerate(layers_per_stage):
        chunks = str(text).split(",")
        if len(chunks) != vpp:
            raise ValueError(f"stage {stage} lists {len(chunks)} layer ranges ({text!r}), but "
                             f"pipeline_parallel_interleave_num is {vpp}: one range per chunk")
        for chunk, r in enumerate(chunks):
            ranges[chunk * pp + stage] = _parse_range(r)
    out, expect = [], 0
    for v in range(total):
        start, end = ranges[v]
        if start != expect:
            raise ValueError(f"virtual stage {v} starts at layer {start}, expected {expect}: the "
                             f"ranges in virtual-stage order (chunk c of stage s is c * pp + s) "
                             f"must cover layers 0..{num_layers - 1} once, in order")
        out.append(range(start, end + 1))
        expect = end + 1
    if expect != num_layers:
        raise ValueError(f"the ranges cover layers 0..{expect - 1}, but the model has "
                         f"{num_layers} layers (num_layers)")
    return out


def pipeline_stages(num_layers: int, pp: int) -> List[range]:
    """Contiguous layer ranges per stage; the first ``L mod pp`` stages take one more (the
    memory planner's split of a layout other than the config's, which may not divide)."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for i in range(pp):
        n = base + (1 if i < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


@dataclass(frozen=True)
class StageSplit:
    """The layer ranges of ``pp * vpp`` virtual stages and what lives on each stage."""
    pp: int
    vpp: int
    layers: Tuple[range, ...]        # per virtual stage
    num_layers: int
    shares_embedding: bool = False   # the last stage reads the embedding table too

    @classmethod
    def build(cls, num_layers: int, pp: int, vpp: int = 1, layers_per_stage=None,
              shares_embedding: bool = False) -> "StageSplit":
        return cls(pp, vpp, tuple(split_layers(num_layers, pp, vpp, layers_per_stage)),
                   num_layers, shares_embedding)

    @property
    def num_virtual(self) -> int:
        return self.pp * self.vpp

    def virtual_stages(self, stage: int) -> List[int]:
        return [c * self.pp + stage for c in range(self.vpp)]

    def stage_layers(self, stage: int) -> List[int]:
        """Every decoder layer ``stage`` runs (all its chunks), ascending."""
        return sorted(i for v in self.virtual_stages(stage) for i in self.layers[v])

    def layer_stage(self, layer: int) -> int:
        for v, r in enumerate(self.layers):
            if layer in r:
                return v % self.pp
        raise ValueError(f"layer {layer} is outside the model's {self.num_layers} layers")

    def owner(self, name: str) -> int:
        """The stage whose parameter ``name`` is (the embedding: stage 0, also when shared)."""
        m = _LAYER.match(name)
        if m:
            return self.layer_stage(int(m.group(1)))
        if name.startswith("embedding."):
            return 0
        return self.pp - 1   # final norm, output layer, MTP depths

    def holders(self, name: str) -> Tuple[int, ...]:
        """The stages that read parameter ``name`` (two for a shared embedding table)."""
        if name == EMBEDDING and self.shares_embedding and self.pp > 1:
            return (0, self.pp - 1)
        return (self.owner(name),)

    def stage_params(self, names: Sequence[str], stage: int) -> List[str]:
        return [n for n in names if stage in self.holders(n)]

    def describe(self, stage: Optional[int] = None) -> str:
        stages = range(self.pp) if stage is None else [stage]
        parts = []
        for s in stages:
            chunks = [f"{r.start}-{r.stop - 1}" for r in (self.layers[v]
                                                           for v in self.virtual_stages(s))]
            parts.append(f"stage {s}: layers {','.join(chunks)}")
        return "; ".join(parts)
