"""A pipeline run's checkpoint: every stage's parameters and optimizer state, written once.

Stage parameters are disjoint (core/pipeline_split.py ``StageSplit.owner``; the shared
embedding table's two copies are equal, the first stage's is written); a rank holds only its
stage's data, so each entry comes from its owner's part. Every rank builds its
payload; rank 0 receives the other stages' part and writes one checkpoint holding the whole
model and the whole optimizer state under the single-process names, so it resumes on one
process or on the same pipeline layout (each stage loads the entries of its parameters), and
records the stage map (``state["pipeline_stages"]``: parameter name -> stage) for a
resharding loader.

Under pp x tp and pp x ep a stage's parameters are split over its ``tp`` group (models/
tp_model.py) and its routed experts over its ``ep`` group (models/expert_parallel.py). Each
rank sends what no rank before it in the stage holds (:func:`sender_entries`): the first
replica (dp 0, tp 0) its replicated entries, the ranks of dp 0 their tp slices, the ranks
of the first ``edp`` replica their experts (weights and optimizer slots: a slice's ZeRO-1
state is gathered by the optimizer's ``state_dict``, an expert's is whole on its rank,
``ZeroSharding.keep_whole``), and rank 0 joins every split entry along its spec's split dim,
each part's shard index being its rank's coordinate on the spec's group (:func:`join_shards`),
so the file holds the single-process tensors and a resume on any layout slices them again.

The part of a stage travels as distributed/object_exchange.py sends objects (each rank
broadcasts its pickled part over the world group, exactly at any size). A checkpoint is not on
the step's hot path.
"""
from __future__ import annotations

from typing import Dict, Mapping, Sequence, Tuple

import numpy as np

from ..core.parallel_dims import replicated_over
from .object_exchange import all_gather_objects
from .shard_spec import ShardSpec, param_of, unshard

__all__ = ["gather_to_all", "stage_payload", "merge_stage_payloads", "stage_map",
           "sharded_entries", "sender_entries", "join_shards"]


def gather_to_all(comm, obj) -> list:
    """Every rank's picklable ``obj``, in rank order, on every rank (world group)."""
    return all_gather_objects(comm, obj, comm.rank, comm.mesh.world)


def stage_map(split, names) -> Dict[str, int]:
    return {n: split.owner(n) for n in names}


def stage_payload(split, stage: int, tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """This stage's part: the model entries and the optimizer slots of the parameters it owns,
    and the optimizer entries of no parameter. A shared embedding table's slots come from its
    owner (stage 0) only: the last stage's copy is equal (the same summed gradient, the same
    update), and under pp x tp two stages' slices of it would be the same shards twice."""
    out = {}
    for key, arr in tensors.items():
        if key.startswith("model.") or key.startswith("optim."):
            name = param_of(key)
            if name is None or split.owner(name) == stage:
                out[key] = arr
    return out


def merge_stage_payloads(tensors: Dict[str, np.ndarray], parts: list,
                         full_shapes: Dict[str, tuple]) -> Dict[str, np.ndarray]:
    """Rank 0's payload with every model entry taken from its owner's part (each is in exactly
    one part; rank 0's own copies of other stages' parameters are empty placeholders,
    distributed/pipeline_release.py) and every stage's optimizer entries added.
    ``full_shapes``: parameter name -> the whole model's shape, which each entry must have."""
    merged = {k: v for k, v in tensors.items() if not k.startswith("model.")}
    for part in parts:
        for key, arr in part.items():
            if key.startswith("model.") or key not in merged:
                merged[key] = arr
    for name, shape in full_shapes.items():
        got = merged.get(f"model.{name}")
        if got is None or tuple(got.shape) != tuple(shape):
            raise RuntimeError(f"pipeline checkpoint: parameter {name} came from no stage with "
                               f"its shape {tuple(shape)} (got "
                               f"{None if got is None else tuple(got.shape)})")
    return merged


def _spec_of(key: str, arr: np.ndarray, specs: Mapping[str, ShardSpec]):
    """The layout of entry ``key``: its parameter's spec when the entry is a shard, None when
    it is whole (an FSDP parameter's optimizer slots: ZeRO-1's collective ``state_dict``
    gathered them over the same dp group its weight is split over)."""
    spec = specs.get(param_of(key))
    if spec is None or tuple(np.shape(arr)) == tuple(spec.full_shape):
        return None
    return spec


def sharded_entries(payload: Dict[str, np.ndarray], specs: Mapping[str, ShardSpec]
                    ) -> Dict[str, np.ndarray]:
    """The entries of ``payload`` (model weights and optimizer slots) that are a shard of a
    sharded parameter."""
    return {k: v for k, v in payload.items() if _spec_of(k, v, specs) is not None}


def sender_entries(payload: Dict[str, np.ndarray], specs: Mapping[str, ShardSpec],
                   coords: Mapping[str, int]) -> Dict[str, np.ndarray]:
    """The entries of this stage's ``payload`` that the rank at ``coords`` sends (module
    docstring): a whole entry from the stage's first replica (every coordinate of the ranks
    holding it 0: dp, cp, tp), a shard over group ``g`` from the ranks whose other replicating
    coordinates are 0 (``tp``: dp and cp 0; ``dp``, FSDP: tp (and cp) 0; ``dp_cp``, FSDP
    under cp x pp: tp 0; ``ep``: edp 0), so each piece comes once."""
    def sends(spec: ShardSpec) -> bool:   # the first of its replicas (core/parallel_dims.py)
        return all(coords.get(axis, 0) == 0   # an axis ``coords`` lacks has size 1
                   for axis in replicated_over(None if spec is None else spec.group))
    return {k: v for k, v in payload.items() if sends(_spec_of(k, v, specs))}


def join_shards(parts: Sequence[Dict[str, np.ndarray]], coords: Sequence[Mapping[str, int]],
                specs: Mapping[str, ShardSpec]) -> Tuple[list, Dict[str, np.ndarray]]:
    """``(parts without their sharded entries, {key: whole tensor})``: every sharded entry
    joined from the parts that hold it, part r's shard index being ``coords[r][spec.group]``
    (its rank's coordinate on the spec's group). Each shard must come exactly once."""
    pieces: Dict[str, Dict[int, np.ndarray]] = {}
    rest = []
    for part, where in zip(parts, coords):
        rest.append({k: v for k, v in part.items() if _spec_of(k, v, specs) is None})
        for key, arr in sharded_entries(part, specs).items():
            index = int(where[specs[param_of(key)].group])
            got = pieces.setdefault(key, {})
            if index in got:
                raise RuntimeError(f"pipeline checkpoint: shard {index} of {key} came twice")
            got[index] = arr
    whole = {}
    for key, by_index in pieces.items():
        spec = specs[param_of(key)]
        if sorted(by_index) != list(range(spec.num_shards)):
            raise RuntimeError(f"pipeline checkpoint: {key} has shards {sorted(by_index)} of "
                               f"{spec.num_shards}")
        whole[key] = unshard(spec, [by_index[i] for i in range(spec.num_shards)])
    return rest, whole
