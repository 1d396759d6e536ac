"""Sharded checkpoints: every rank writes its pieces, rank 0 writes a layout index last.

Files of one save, next to the single-process ones (``checkpoint.py``) and written by the same
atomic writer and digest (``checkpoint_io.py``), with ``NAME = {prefix}_step{NNNNNNNN}`` and
``W`` ranks:

* ``NAME.rank{r:05d}-of-{W:05d}.safetensors`` (format :data:`SHARD_FORMAT`), one per rank:
  the tensors this rank writes, named by their checkpoint key (``model.{param}``,
  ``optim.{slot}.{param}`` with ``slot`` one of ``main_param``, ``adam_m``, ``adam_v``,
  ``muon_m``, ...), and in its metadata ``step``, ``run_id``, ``rank``, ``world`` and
  ``pieces``: per key a :class:`Piece`, the layout entry (the full shape; the box
  ``offset``/``shape`` the tensor covers in it; how the box came about: the ``ShardSpec``'s
  ``split_dim``, ``group``, ``shard_index`` and ``num_shards``, and ZeRO-1's own dim-0 rows of
  the optimizer state ``zero_rows``/``zero_shards``/``zero_index``; the original dtype).
* ``NAME.safetensors`` (format :data:`INDEX_FORMAT`), written by rank 0 after every rank file
  is complete (the trainer's save waits for all ranks), so the set exists under its final name
  only when whole: the train state, config, RNG tensors and ``run_id`` as a single-process
  checkpoint holds them, plus ``world`` and ``files`` (each rank file's name and sha256, read
  back from its header: the index binds exactly those files, so a stale file of another save
  under the same name is refused; the directory must be shared by all ranks). Listing, resolving and
  pruning see only this file (``checkpoint.list_checkpoints``).

Every file carries its own digest over data and header. Loading (:func:`load_sharded`) checks
that each listed rank file exists, verifies it, and that it is the one the index lists;
then per key the boxes must tile the full shape exactly (identical boxes are replicas, see
below; a gap or a partial overlap is refused), and the full tensor is the pieces copied to
their offsets, so merging is bit-identical. Pipeline stages hold disjoint parameters, so the
rank files of all stages together are such a tiling.

Re-splitting (:func:`reshard`) takes full tensors (from either format) to the target layout of
one rank: its ``ShardSpec`` per sharded parameter (``model.shard_specs()``), the rank's index
along each group (``coords``, e.g. ``Mesh.coords(rank)``), and the parameter names it holds
(a pipeline stage's). Optimizer slots follow their parameter's spec. ZeRO-1 targets take the
per-parameter full tensors and keep their own rows (``distributed/zero.py``).

Which rank writes which piece is ``checkpoint_plan.py``'s (``checkpoint.remove_redundancy``):
by default every rank writes all the pieces it holds, so replicas are stored on each of their
ranks; with redundancy removed each piece is written once, by one of its replicas, balanced.
Loading accepts both: identical boxes of one key are replicas, which must be equal byte for
byte (a difference is refused, naming both files) and are taken once. ``read_workers``
threads read and verify the rank files and ``merge_workers`` threads merge the keys
(``checkpoint.load_worker_number`` / ``reshard_worker_num``); with a :class:`FileSharing`
(``checkpoint.load_balanced``, ``balanced_load.py``) a rank reads only its share of the rank
files and receives the others' from the ranks that read them. The result depends on none of
these.

A blocked spec (``ShardSpec.blocks``, the q | k | v rows of a fused weight) does not give each
shard one box of the full tensor; its pieces are boxes of the tensor in *shard-major* order
along the split dim (shard 0's rows of every block, then shard 1's, ...; the piece records
``blocks``), and merging puts the rows back in their natural order, so the merged tensor and
``reshard`` (``shard_spec.local_indices``) agree with the model's layout.
"""
from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import (Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple,
                    runtime_checkable)

import numpy as np

from ..distributed.shard_spec import (ShardSpec, local_shape, local_slice, param_of, shard,
                                      unshard)
from .plan import ZERO_REPLICA, axis_sizes, pieces_to_write
from .file_io import (CheckpointData, CheckpointError, checkpoint_data, encode, parse_json,
                            read_header, read_verified, run_metadata, write_atomic)

__all__ = ["SHARD_FORMAT", "INDEX_FORMAT", "Piece", "ZeroRows", "describe_pieces",
           "rank_file_name", "shard_files_of", "save_rank_file", "write_rank",
           "save_index",
           "FileSharing", "load_sharded", "merge_pieces", "reshard", "RankLayout", "RowLayout",
           "zero_rows_of", "with_model_rows",
           "split_checkpoint"]

SHARD_FORMAT = "mindformers_core.checkpoint_shard/1"
INDEX_FORMAT = "mindformers_core.checkpoint_index/1"
_SUFFIX = ".safetensors"
_RANK_RE = re.compile(r"\.rank(\d{5,})-of-(\d{5,})\.safetensors$")


@dataclass(frozen=True)
class Piece:
    """One rank's piece of one checkpoint tensor (module docstring)."""
    full_shape: Tuple[int, ...]
    offset: Tuple[int, ...]
    shape: Tuple[int, ...]
    split_dim: Optional[int] = None
    group: Optional[str] = None
    shard_index: int = 0
    num_shards: int = 1
    zero_rows: Optional[Tuple[int, int]] = None
    zero_shards: int = 1
    zero_index: int = 0
    dtype: Optional[str] = None
    blocks: Optional[Tuple[int, ...]] = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Piece":
        d = dict(d)
        for k in ("full_shape", "offset", "shape"):
            d[k] = tuple(int(x) for x in d[k])
        for k in ("zero_rows", "blocks"):
            if d.get(k) is not None:
                d[k] = tuple(int(x) for x in d[k])
        return cls(**d)

    @property
    def box(self) -> Tuple[slice, ...]:
        return tuple(slice(o, o + n) for o, n in zip(self.offset, self.shape))


@dataclass(frozen=True)
class ZeroRows:
    """ZeRO-1's dim-0 rows of this rank's optimizer state (``distributed/shard_layout.py``):
    ``rows[key] = (start, stop, rows of the whole local tensor)`` of the sharded keys,
    ``num_shards``, this rank's ``shard_index`` and ``replica`` (``rank // num_shards``), and
    ``replicas``: how many ranks of the ZeRO group hold each row block (its size /
    ``num_shards``; under context parallel the group spans dp x cp)."""
    rows: Mapping[str, Tuple[int, int, int]]
    num_shards: int
    shard_index: int
    replica: int
    replicas: int = 1


def describe_pieces(tensors: Mapping[str, np.ndarray], specs: Mapping[str, ShardSpec],
                    coords: Mapping[str, int], zero: Optional[ZeroRows] = None,
                    dtypes: Optional[Mapping[str, str]] = None) -> Dict[str, Piece]:
    """The layout entry of every ``model.*``/``optim.*`` tensor of one rank.

    ``tensors``: this rank's local tensors (a sharded parameter's shard; ZeRO rows of it for
    the keys in ``zero.rows``); ``specs``: the sharded parameters' ``ShardSpec``; ``coords``:
    this rank's index along each group. ``ValueError`` for a tensor whose shape is not what its
    spec and rows say.
    """
    dtypes = dtypes or {}
    out = {}
    for key, arr in tensors.items():
        name = param_of(key)
        if name is None:
            continue
        shape = tuple(int(d) for d in np.shape(arr))
        spec = specs.get(name)
        sharded = spec is not None and spec.is_sharded
        rows = zero.rows.get(key) if zero is not None else None
        if sharded:
            index = _coord(coords, spec.group, name)
            offset = [s.start for s in local_slice(_shard_major(spec), index)]
            full, local = spec.full_shape, local_shape(spec)
        else:
            index, offset = 0, [0] * len(shape)
            local = (rows[2],) + shape[1:] if rows is not None else shape
            full = local
        expect = local if rows is None else (rows[1] - rows[0],) + tuple(local[1:])
        if shape != tuple(expect) or (rows is not None and (
                rows[2] != local[0] or not 0 <= rows[0] <= rows[1] <= rows[2])):
            raise ValueError(f"{key}: shape {shape} does not match its layout (ShardSpec "
                             f"{spec}, ZeRO rows {rows}; expected {tuple(expect)})")
        if rows is not None:
            offset[0] += rows[0]
        out[key] = Piece(tuple(full), tuple(offset), shape,
                         spec.split_dim if sharded else None, spec.group if sharded else None,
                         index, spec.num_shards if sharded else 1,
                         (rows[0], rows[1]) if rows is not None else None,
                         zero.num_shards if rows is not None else 1,
                         zero.shard_index if rows is not None else 0, dtypes.get(key),
                         spec.blocks if sharded and _is_blocked(spec) else None)
    return out


def _is_blocked(spec: ShardSpec) -> bool:
    return spec.blocks is not None and len(spec.blocks) > 1


def _shard_major(spec: ShardSpec) -> ShardSpec:
    """The spec in the order a blocked tensor is stored in its pieces (module docstring):
    shard-major along the split dim, so each shard is one box; a plain spec as it is."""
    return replace(spec, blocks=None) if _is_blocked(spec) else spec


def _natural_order(piece: Piece, merged: np.ndarray) -> np.ndarray:
    """A merged tensor back from the shard-major order of a blocked layout."""
    if piece.blocks is None:
        return merged
    spec = ShardSpec(piece.full_shape, piece.split_dim, piece.group, piece.num_shards,
                     piece.blocks)
    return unshard(spec, np.split(merged, piece.num_shards, axis=piece.split_dim))


def _coord(coords: Mapping[str, int], group: str, what: str) -> int:
    if group not in coords:
        raise CheckpointError(f"the layout splits {what} over group {group!r}, but this rank has "
                              f"no index in {group!r} (known groups: {sorted(coords)})")
    return int(coords[group])


# -- files ---------------------------------------------------------------------------------------
def rank_file_name(index_name: str, rank: int, world: int) -> str:
    """``NAME.rank{r:05d}-of-{W:05d}.safetensors`` of the index ``NAME.safetensors``."""
    base = index_name[:-len(_SUFFIX)] if index_name.endswith(_SUFFIX) else index_name
    return f"{base}.rank{int(rank):05d}-of-{int(world):05d}{_SUFFIX}"


def shard_files_of(index_path: str) -> List[str]:
    """The rank files next to an index path, as found on disk (for pruning)."""
    directory, name = os.path.split(index_path)
    base = name[:-len(_SUFFIX)] if name.endswith(_SUFFIX) else name
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names
                  if n.startswith(base + ".rank") and _RANK_RE.search(n))


def save_rank_file(directory: str, index_name: str, step: int, rank: int, world: int,
                   tensors: Mapping[str, np.ndarray], pieces: Mapping[str, Piece],
                   run_id: Optional[str], write_hook=None) -> str:
    """Write one rank's pieces (``tensors[key]`` described by ``pieces[key]``) atomically."""
    missing = sorted(set(tensors) ^ set(pieces))
    if missing:
        raise ValueError(f"tensors and layout entries differ: {missing[:5]}")
    meta = {"format": SHARD_FORMAT, "step": str(int(step)), "run_id": str(run_id or ""),
            "rank": str(int(rank)), "world": str(int(world)),
            "pieces": json.dumps({k: pieces[k].to_json() for k in sorted(pieces)},
                                 sort_keys=True)}
    return write_atomic(directory, rank_file_name(index_name, rank, world),
                        encode(dict(tensors), meta), write_hook)


def write_rank(directory: str, index_name: str, step: int, rank: int, world: int,
               tensors: Mapping[str, np.ndarray], specs: Mapping[str, ShardSpec],
               coords: Mapping[str, int], zero: Optional[ZeroRows] = None,
               dtypes: Optional[Mapping[str, str]] = None, run_id: Optional[str] = None,
               write_hook=None, sizes: Optional[Mapping[str, int]] = None,
               remove_redundancy: bool = False) -> str:
    """One rank's part of a save: its ``model.*``/``optim.*`` tensors described
    (:func:`describe_pieces`), with ``remove_redundancy`` the replicas it does not write left
    out (``checkpoint_plan.pieces_to_write``; ``sizes``: the size of every axis of
    ``coords``), and its rank file written (:func:`save_rank_file`)."""
    pieces = describe_pieces(tensors, specs, coords, zero, dtypes)
    coords, sizes = dict(coords), dict(sizes or {})
    if zero is not None:
        coords[ZERO_REPLICA] = zero.replica
        sizes[ZERO_REPLICA] = int(zero.replicas)
    mine = pieces_to_write(pieces, {k: int(np.asarray(tensors[k]).nbytes) for k in pieces},
                           coords, sizes, remove_redundancy)
    return save_rank_file(directory, index_name, step, rank, world,
                          {k: tensors[k] for k in mine}, {k: pieces[k] for k in mine}, run_id,
                          write_hook)


def save_index(directory: str, index_name: str, step: int, world: int,
               tensors: Mapping[str, np.ndarray], state: dict, config: dict,
               run_id: Optional[str], write_hook=None, lineage: Optional[dict] = None) -> str:
    """Write the index (rank 0, after every rank file is complete) atomically.

    ``tensors``: the replicated non-parameter tensors (``rng.*``). The index records each rank
    file's sha256 (read from its header), which binds exactly these files to it."""
    files = []
    for rank in range(world):
        name = rank_file_name(index_name, rank, world)
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"cannot write checkpoint {os.path.join(directory, index_name)}"
                                  f": rank file {name} is missing (is {directory} shared by all "
                                  "ranks?); the previous checkpoints are kept")
        files.append({"name": name, "sha256": read_header(path, os.path.getsize(path))[
            "__metadata__"].get("sha256", "")})
    meta = run_metadata(INDEX_FORMAT, step, state, config, {}, run_id, lineage)
    meta["world"] = str(int(world))
    meta["files"] = json.dumps(files, sort_keys=True)
    return write_atomic(directory, index_name, encode(dict(tensors), meta), write_hook)


# -- loading -------------------------------------------------------------------------------------
@runtime_checkable
class FileSharing(Protocol):
    """The rank files this rank reads, and every rank's reads shared (``balanced_load.py``)."""

    def files_to_read(self, nbytes: List[int]) -> List[int]: ...

    def gather(self, part: Dict[int, object]) -> List[Dict[int, object]]: ...


def load_sharded(path: str, header: Optional[dict] = None, read_workers: int = 1,
                 merge_workers: int = 1, sharing: Optional[FileSharing] = None) -> CheckpointData:
    """The index at ``path`` and its rank files, merged into full tensors (module docstring);
    with ``sharing``, this rank reads only its files and gets the others' from the others."""
    meta, tensors = read_verified(path, (INDEX_FORMAT,), header)
    data = checkpoint_data(path, meta, tensors)
    files = parse_json(meta.get("files", "null"), path, "files")
    if not isinstance(files, list) or str(len(files)) != meta.get("world") or not all(
            isinstance(f, dict) and isinstance(f.get("name"), str) for f in files):
        raise CheckpointError(f"checkpoint {path} is corrupt: its list of rank files does not "
                              f"match its world size {meta.get('world')!r:.20}")
    directory = os.path.dirname(path)

    def read(rank: int):
        try:
            return _read_rank_file(path, meta["step"], directory, len(files), rank, files[rank])
        except CheckpointError as exc:
            return str(exc)

    mine = list(range(len(files)))
    if sharing is not None:
        mine = sharing.files_to_read([_size_of(directory, f) for f in files])
    with ThreadPoolExecutor(max_workers=max(1, int(read_workers))) as pool:
        parts = [dict(zip(mine, pool.map(read, mine)))]
    if sharing is not None:
        parts = sharing.gather(parts[0])
    read_back = {rank: got for part in parts for rank, got in part.items()}
    located = []
    for rank in range(len(files)):   # the first failing rank's error, on every rank
        if isinstance(read_back[rank], str):
            raise CheckpointError(read_back[rank])
        located.extend(read_back[rank])
    merged, dtypes = merge_pieces(located, path, merge_workers)
    overlap = sorted(set(merged) & set(data.tensors))
    if overlap:
        raise CheckpointError(f"checkpoint {path} is corrupt: {overlap[:3]} are both in the "
                              "index and in rank files")
    merged.update(data.tensors)
    return replace(data, tensors=merged, dtypes=dtypes)


def _size_of(directory: str, entry: dict) -> int:
    try:
        return os.path.getsize(os.path.join(directory, os.path.basename(entry["name"])))
    except OSError:
        return 0


def _read_rank_file(path: str, step: str, directory: str, world: int, rank: int,
                    entry: dict) -> List[Tuple[str, Piece, np.ndarray, str]]:
    """One listed rank file, verified and bound to the index, as ``(key, piece, array, file)``."""
    name = os.path.basename(entry["name"])
    fpath = os.path.join(directory, name)
    if not os.path.isfile(fpath):
        raise CheckpointError(f"sharded checkpoint {path} is incomplete: rank file {name} "
                              f"(rank {rank} of {world}) is missing")
    fmeta, ftensors = read_verified(fpath, (SHARD_FORMAT,))
    if fmeta.get("sha256") != entry.get("sha256") or fmeta.get("step") != step \
            or fmeta.get("rank") != str(rank):
        raise CheckpointError(
            f"sharded checkpoint {path}: rank file {name} is not the one the index was "
            f"written with (rank {fmeta.get('rank')!r:.12}, step {fmeta.get('step')!r:.20}, "
            f"sha256 {str(fmeta.get('sha256'))[:12]}..., the index expects rank {rank}, step "
            f"{step}, sha256 {str(entry.get('sha256'))[:12]}...: a file of another save)")
    raw = parse_json(fmeta.get("pieces", "null"), fpath, "pieces")
    try:
        pieces = {k: Piece.from_json(v) for k, v in raw.items()}
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {fpath} is corrupt: unreadable layout entries "
                              f"({type(exc).__name__}: {str(exc)[:120]})") from None
    if set(pieces) != set(ftensors):
        raise CheckpointError(f"checkpoint {fpath} is corrupt: its layout entries and "
                              f"tensors differ: {sorted(set(pieces) ^ set(ftensors))[:5]}")
    return [(key, piece, ftensors[key], name) for key, piece in pieces.items()]


def merge_pieces(located: Iterable[Tuple[str, Piece, np.ndarray, str]], where: str,
                 workers: int = 1) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Full tensors (and original dtypes) from ``(key, piece, array, file)`` entries; the
    pieces of each key must tile its full shape, and replicas be equal (module docstring).
    ``workers`` threads merge the keys; the result and the first error (in key order) do not
    depend on it."""
    by_key: Dict[str, List[Tuple[Piece, np.ndarray, str]]] = {}
    for key, piece, arr, name in located:
        by_key.setdefault(key, []).append((piece, arr, name))
    keys = sorted(by_key)
    with ThreadPoolExecutor(max_workers=max(1, int(workers))) as pool:
        results = list(pool.map(lambda k: _merge_key(k, by_key[k], where), keys))
    out = {key: arr for key, (arr, _) in zip(keys, results)}
    dtypes = {key: dt for key, (_, dt) in zip(keys, results) if dt}
    return out, dtypes


def _merge_key(key: str, entries: List[Tuple[Piece, np.ndarray, str]],
               where: str) -> Tuple[np.ndarray, Optional[str]]:
    first, _, first_file = entries[0]
    full = first.full_shape
    unique: Dict[Tuple, Tuple[Piece, np.ndarray, str]] = {}
    for piece, arr, name in entries:
        if piece.full_shape != full:
            raise CheckpointError(f"sharded checkpoint {where}: {key} has full shape {full} "
                                  f"in {first_file} but {piece.full_shape} in {name}")
        if tuple(np.shape(arr)) != piece.shape:
            raise CheckpointError(f"checkpoint {name} is corrupt: tensor {key} has shape "
                                  f"{tuple(np.shape(arr))}, its layout entry says "
                                  f"{piece.shape}")
        if len(piece.offset) != len(full) or any(
                o < 0 or o + n > d for o, n, d in zip(piece.offset, piece.shape, full)):
            raise CheckpointError(f"checkpoint {name} is corrupt: the piece of {key} at "
                                  f"offset {piece.offset} with shape {piece.shape} lies "
                                  f"outside its full shape {full}")
        seen = unique.setdefault((piece.offset, piece.shape), (piece, arr, name))
        if seen[1] is not arr and not _same_bytes(seen[1], arr):
            raise CheckpointError(
                f"sharded checkpoint {where} is corrupt: {key} is stored in {seen[2]} and "
                f"{name} with the same box (offset {piece.offset}, shape {piece.shape}) but "
                "different values; replicas must be identical")
    boxes = list(unique.values())
    for i, (a, _, fa) in enumerate(boxes):
        for b, _, fb in boxes[i + 1:]:
            if _boxes_overlap(a, b):
                raise CheckpointError(
                    f"sharded checkpoint {where} is corrupt: the pieces of {key} in {fa} "
                    f"(offset {a.offset}, shape {a.shape}) and {fb} (offset {b.offset}, "
                    f"shape {b.shape}) overlap")
    covered = sum(int(math.prod(p.shape)) for p, _, _ in boxes)
    total = int(math.prod(full))
    if covered != total:
        raise CheckpointError(f"sharded checkpoint {where} is incomplete: the pieces of {key} "
                              f"cover {covered} of the {total} elements of its full shape "
                              f"{full}")
    result = np.empty(full, dtype=boxes[0][1].dtype)
    for piece, arr, _ in boxes:
        result[piece.box] = arr
    return _natural_order(first, result), first.dtype or None


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical (so NaN payloads and signed zeros count, unlike ``==``)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _boxes_overlap(a: Piece, b: Piece) -> bool:
    return all(oa < ob + nb and ob < oa + na
               for oa, na, ob, nb in zip(a.offset, a.shape, b.offset, b.shape))


# -- re-splitting for a target layout ------------------------------------------------------------
def reshard(data: CheckpointData, specs: Mapping[str, ShardSpec], coords: Mapping[str, int],
            names: Optional[Sequence[str]] = None) -> CheckpointData:
    """``data`` (full tensors) as this rank of the target layout holds it: each sharded
    parameter's model and optimizer tensors cut to its shard; with ``names``, only the
    tensors of those parameters (a pipeline stage's); other tensors unchanged."""
    keep = None if names is None else set(names)
    out = {}
    for key, arr in data.tensors.items():
        name = param_of(key)
        if name is None:
            out[key] = arr
            continue
        if keep is not None and name not in keep:
            continue
        spec = specs.get(name)
        if spec is None or not spec.is_sharded:
            out[key] = arr
            continue
        if tuple(np.shape(arr)) != spec.full_shape:
            raise CheckpointError(f"checkpoint {data.path}: {key} has full shape "
                                  f"{tuple(np.shape(arr))}, the target layout of {name} expects "
                                  f"{spec.full_shape}")
        out[key] = shard(spec, arr, _coord(coords, spec.group, name))
    dtypes = {k: v for k, v in data.dtypes.items() if k in out}
    return replace(data, tensors=out, dtypes=dtypes)


# -- a whole layout from full tensors (tools/convert_checkpoint.py) ------------------------------
@dataclass(frozen=True)
class RowLayout:
    """tp x FSDP (``optim_grads_params`` with tp inside): the trained parameters stored as
    ``num_shards`` dim-0 row blocks of each rank's tensor (its tp slice), block
    ``coords[group] % num_shards`` on a rank (``distributed/fsdp_layout.py``: a tensor whose
    rows do not divide stays whole), as ``model.set_row_shards`` records them. ``names``: the
    parameters so stored (None: those with optimizer state in the checkpoint, every one when
    it has none)."""
    num_shards: int
    group: str = "dp"
    names: Optional[Sequence[str]] = None

    def rows_of(self, tensors: Mapping[str, np.ndarray], coords: Mapping[str, int]
                ) -> Dict[str, Tuple[int, int, int]]:
        """name -> (start, stop, rows) of the parameters of one rank's ``tensors`` stored as
        rows (``model.row_shards()``'s form)."""
        from ..distributed.fsdp_layout import fsdp_specs, row_block
        held = {param_of(k) for k in tensors if k.startswith("model.")}
        trained = {param_of(k) for k in tensors if k.startswith("optim.")} & held
        names = held & set(self.names) if self.names is not None else (trained or held)
        specs = fsdp_specs([(n, np.shape(tensors[f"model.{n}"])) for n in sorted(names)],
                           self.num_shards, self.group)
        index = int(coords.get(self.group, 0)) % self.num_shards
        return {n: row_block(s, index) for n, s in specs.items()}


@dataclass(frozen=True)
class RankLayout:
    """What one rank of a target layout holds: its index along each group, the parameters it
    holds (None: all; a pipeline stage: its own), the ZeRO-1 shards of its optimizer state
    over ``coords["dp"]`` (1: none) and, under tp x FSDP, the rows its weights keep
    (:class:`RowLayout`)."""
    coords: Mapping[str, int]
    names: Optional[Sequence[str]] = None
    zero_shards: int = 1
    rows: Optional[RowLayout] = None


def with_model_rows(zero: Optional[ZeroRows], tensors, rows) -> Optional[ZeroRows]:
    """``zero`` plus the rows of the parameters the model stores as dp rows of their tp slice
    (tp x FSDP, ``model.row_shards()``): their ``model.*`` tensor and every optimizer entry
    of theirs that the optimizer did not already describe hold those rows. The shard index
    is the optimizer's ZeRO-1 index (the same dp rank) or, without optimizer rows, the
    model's own."""
    if not rows:
        return zero
    out = dict(zero.rows) if zero is not None else {}
    for key in tensors:
        name = param_of(key)
        if name in rows and key not in out:
            out[key] = tuple(rows[name])
    if zero is not None:
        return ZeroRows(out, zero.num_shards, zero.shard_index, zero.replica, zero.replicas)
    start, stop, total = next(iter(rows.values()))
    return ZeroRows(out, total // (stop - start), start // (stop - start), 0)


def zero_rows_of(tensors: Mapping[str, np.ndarray], num_shards: int, dp_index: int,
                 dp_size: int = 1) -> ZeroRows:
    """ZeRO-1's rows (``distributed/shard_layout.py``) of the ``optim.*`` tensors of one rank
    with data-parallel index ``dp_index`` of ``dp_size``."""
    from ..distributed.shard_layout import ShardLayout
    keys = sorted(k for k in tensors if k.startswith("optim."))
    layout = ShardLayout([np.shape(tensors[k]) for k in keys], num_shards,
                         dp_index % num_shards, num_shards)
    rows = {k: layout.rows(i) + (int(np.shape(tensors[k])[0]),)
            for i, k in enumerate(keys) if layout.is_sharded(i)}
    return ZeroRows(rows, num_shards, dp_index % num_shards, dp_index // num_shards,
                    max(1, int(dp_size) // num_shards))


def split_checkpoint(data: CheckpointData, directory: str, index_name: str,
                     specs: Mapping[str, ShardSpec], ranks: Sequence[RankLayout],
                     remove_redundancy: bool = False) -> str:
    """Write ``data`` (full tensors) as a sharded checkpoint of the layout ``specs`` on
    ``ranks`` (one rank file each, then the index); returns the index path."""
    world = len(ranks)
    sizes = axis_sizes([lay.coords for lay in ranks])
    for rank, lay in enumerate(ranks):
        local = reshard(data, specs, lay.coords, lay.names).tensors
        zero = None
        if lay.zero_shards > 1:
            zero = zero_rows_of(local, lay.zero_shards, int(lay.coords.get("dp", 0)),
                                int(sizes.get("dp", 1)))
        if lay.rows is not None:   # tp x FSDP: the weights' rows on top of their tp slices
            zero = with_model_rows(zero, local, lay.rows.rows_of(local, lay.coords))
        if zero is not None:
            local = {k: (v[zero.rows[k][0]:zero.rows[k][1]] if k in zero.rows else v)
                     for k, v in local.items()}
        write_rank(directory, index_name, data.step, rank, world, local, specs, lay.coords,
                   zero, data.dtypes, data.run_id, sizes=sizes,
                   remove_redundancy=remove_redundancy)
    rest = {k: v for k, v in data.tensors.items() if param_of(k) is None}
    return save_index(directory, index_name, data.step, world, rest, data.state, data.config,
                      data.run_id, lineage=data.lineage)
