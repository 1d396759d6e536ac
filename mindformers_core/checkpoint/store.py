"""Checkpoint files: one safetensors file per saved step, written atomically.

Layout of ``{prefix}_step{NNNNNNNN}.safetensors``:

* tensors: ``model.{param}`` (the model parameters; bfloat16 ones are stored as float32, which
  is exact, and cast back on load), ``optim.{key}`` (fp32 masters ``main_param.*`` and moments
  ``adam_m.*``/``adam_v.*``/``muon_m.*`` from ``opt.state_dict()``), ``rng.*`` and ``data.*``
  (array parts of the RNG and data-position states);
* ``__metadata__`` (string to string, as safetensors requires): ``format``, ``step``,
  ``state`` (JSON: the train state, the non-array parts of the optimizer / data / RNG states),
  ``config`` (JSON: the resolved config), ``dtypes`` (JSON: original dtype of every tensor
  whose storage dtype differs), ``run_id`` (the run lineage that wrote it, see
  ``trainer/run_dir.py``), ``lineage`` (which line of the run's history it is on:
``lineage.py``) and ``sha256``: one digest over every other metadata entry (canonical
  JSON) and every tensor's name, dtype, shape and bytes in sorted name order. Everything a
  resume reads (step, lr position, RNG, data position, weights) is covered, so a changed byte
  anywhere in the file is refused.

Why one file: ``os.replace`` of a single file is atomic on POSIX, so a reader sees either the
previous set of checkpoints or the new complete one, never a half-written file under the final
name. The write is: temp file in the same directory -> write -> flush -> fsync -> rename ->
fsync of the directory. A process killed mid-write leaves only a ``.tmp`` file, which is
ignored (and removed by the next save). A truncated or bit-flipped file is detected by
safetensors' own bounds checks or by the digest, and raises :class:`CheckpointError`.

A sharded run writes rank files plus an index under the same name instead
(``sharded_checkpoint.py``); :func:`load_checkpoint` of an index returns the merged full
tensors, so everything that reads checkpoints takes either format. The file layer (digest,
atomic write, verified read) is ``checkpoint_io.py``.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from .file_io import (TMP_MARK, CheckpointData, CheckpointError, checkpoint_data, encode,
                            read_header, read_verified, run_metadata,
                            write_atomic)
from .sharded import INDEX_FORMAT, FileSharing, load_sharded, shard_files_of
from .lineage import on_line, read_lineage, resume_order

__all__ = [
    "CheckpointError", "CheckpointData", "checkpoint_name", "list_checkpoints",
    "save_checkpoint", "load_checkpoint", "resolve_checkpoint", "prune_checkpoints",
    "FORMAT",
]

FORMAT = "mindformers_core.checkpoint/2"   # /2: the digest covers the metadata too
_NAME_RE = re.compile(r"^(?P<prefix>.+)_step(?P<step>\d{8,})\.safetensors$")
_TMP_MARK = TMP_MARK


def checkpoint_name(prefix: str, step: int) -> str:
    """``{prefix}_step{step:08d}.safetensors``: zero padded so names sort by step."""
    return f"{prefix}_step{step:08d}.safetensors"


def list_checkpoints(directory: str) -> List[Tuple[int, str]]:
    """(step, path) of every finished checkpoint file in ``directory``, oldest first.

    Temp files of an interrupted write are not listed.
    """
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = _NAME_RE.match(name)
        if match and _TMP_MARK not in name:
            found.append((int(match.group("step")), os.path.join(directory, name)))
    return sorted(found)


def save_checkpoint(directory: str, prefix: str, step: int, tensors: Dict[str, np.ndarray],
                    state: dict, config: dict, dtypes: Optional[Dict[str, str]] = None,
                    write_hook=None, run_id: Optional[str] = None,
                    lineage: Optional[dict] = None) -> str:
    """Write one checkpoint atomically and return its path.

    A failed write (disk full, permissions) removes its temp file and leaves every earlier
    checkpoint as it was; the ``OSError`` becomes a :class:`CheckpointError` naming the file.
    ``write_hook(fileobj, data: bytes)`` (tests only) replaces the plain ``fileobj.write`` so a
    test can kill the process in the middle of the write.
    """
    metadata = run_metadata(FORMAT, step, state, config, dtypes, run_id, lineage)
    return write_atomic(directory, checkpoint_name(prefix, step), encode(tensors, metadata),
                        write_hook)


def prune_checkpoints(directory: str, prefix: str, keep: int,
                      run_id: Optional[str] = None, protect=(),
                      lineage: Optional[dict] = None) -> List[str]:
    """Delete all but the newest ``keep`` checkpoints of ``prefix`` and stale temp files.

    With ``run_id``, only checkpoints written by that run lineage count (and are removed):
    another run's files in the same directory are never touched. Steps in ``protect``
    (``checkpoint.keep_steps``) are neither counted nor removed. With ``lineage`` (the
    writer's), only checkpoints on its line count: an abandoned branch is left alone
    (``lineage.py``). Returns the removed paths.
    """
    removed = []
    protect = set(protect or ())
    mine = [(s, p) for s, p in list_checkpoints(directory)
            if _NAME_RE.match(os.path.basename(p)).group("prefix") == prefix and s not in protect
            and (run_id is None or checkpoint_run_id(p) == run_id)]
    if lineage is not None:
        lins = {p: read_lineage(p) for _, p in mine}
        mine = [(s, p) for s, p in mine
                if lins[p] is not None and on_line(lins[p], lineage["chain"])]
    for _, path in mine[:-keep] if keep > 0 else mine:
        for part in [path] + shard_files_of(path):   # a sharded checkpoint: its rank files too
            if os.path.exists(part):
                os.remove(part)
                removed.append(part)
    for name in os.listdir(directory):
        if name.startswith(".") and _TMP_MARK in name and name.endswith(tuple("0123456789")):
            pid = name.rsplit(_TMP_MARK, 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                os.remove(os.path.join(directory, name))
                removed.append(os.path.join(directory, name))
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def checkpoint_run_id(path: str) -> Optional[str]:
    """The run id stored in a checkpoint's header (None if unreadable or not recorded)."""
    try:
        meta = read_header(path, os.path.getsize(path))["__metadata__"]
    except (CheckpointError, OSError):
        return None
    return meta.get("run_id") or None


def load_checkpoint(path: str, read_workers: int = 1, merge_workers: int = 1,
                    sharing: Optional[FileSharing] = None) -> CheckpointData:
    """Read and verify one checkpoint; :class:`CheckpointError` if it is unusable.

    ``path`` is a single-process file or the index of a sharded checkpoint, whose rank files
    are verified and merged into full tensors (``sharded_checkpoint.load_sharded``, by
    ``read_workers`` / ``merge_workers`` threads, the files divided over the ranks by
    ``sharing``: ``balanced_load.py``).
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file not found: {path}")
    header = read_header(path, os.path.getsize(path))
    fmt = header["__metadata__"].get("format")
    if fmt == INDEX_FORMAT:
        return load_sharded(path, header, read_workers, merge_workers, sharing)
    if fmt != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file (format={fmt!r:.80})")
    meta, tensors = read_verified(path, (FORMAT,), header)
    return checkpoint_data(path, meta, tensors)


def resolve_checkpoint(load_path: str, log=None, read_workers: int = 1, merge_workers: int = 1,
                       sharing: Optional[FileSharing] = None) -> CheckpointData:
    """Load ``load_path``: a file, or a directory meaning its newest complete checkpoint.

    In a directory, the newest checkpoint of the current line of training is taken
    (``lineage.py``: an abandoned branch is skipped, two branches are refused naming both); a
    newer checkpoint that fails verification is reported through ``log`` (a callable taking a
    string) and the next older one is tried. A file is used as given:
    if it is damaged the error says so and names the usable ones next to it.
    """
    if os.path.isfile(load_path):
        try:
            return load_checkpoint(load_path, read_workers, merge_workers, sharing)
        except CheckpointError as exc:
            others = [p for _, p in list_checkpoints(os.path.dirname(load_path) or ".")
                      if os.path.abspath(p) != os.path.abspath(load_path)]
            hint = (f"; other checkpoints in that directory: {[os.path.basename(p) for p in others]}"
                    if others else "")
            raise CheckpointError(f"{exc}{hint}") from exc
    if not os.path.isdir(load_path):
        raise CheckpointError(f"checkpoint.load_path: no such file or directory: {load_path}")
    found = list_checkpoints(load_path)
    if not found:
        raise CheckpointError(f"checkpoint.load_path: no checkpoint (*_stepNNNNNNNN.safetensors) "
                              f"in directory {load_path}")
    problems = []
    for path in resume_order(found, load_path, log):
        try:
            data = load_checkpoint(path, read_workers, merge_workers, sharing)
        except CheckpointError as exc:
            problems.append(str(exc))
            if log is not None:
                log(f"WARNING: skipping unusable checkpoint: {exc}; trying the previous one")
            continue
        data.skipped = tuple(problems)
        return data
    raise CheckpointError("checkpoint.load_path: every checkpoint in "
                          f"{load_path} is unusable: " + "; ".join(problems))
