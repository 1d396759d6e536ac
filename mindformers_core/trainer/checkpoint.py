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
  ``trainer/run_dir.py``) and ``sha256``: one digest over every other metadata entry (canonical
  JSON) and every tensor's name, dtype, shape and bytes in sorted name order. Everything a
  resume reads (step, lr position, RNG, data position, weights) is covered, so a changed byte
  anywhere in the file is refused.

Why one file: ``os.replace`` of a single file is atomic on POSIX, so a reader sees either the
previous set of checkpoints or the new complete one, never a half-written file under the final
name. The write is: temp file in the same directory -> write -> flush -> fsync -> rename ->
fsync of the directory. A process killed mid-write leaves only a ``.tmp`` file, which is
ignored (and removed by the next save). A truncated or bit-flipped file is detected by
safetensors' own bounds checks or by the digest, and raises :class:`CheckpointError`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

__all__ = [
    "CheckpointError", "CheckpointData", "checkpoint_name", "list_checkpoints",
    "save_checkpoint", "load_checkpoint", "resolve_checkpoint", "prune_checkpoints",
    "FORMAT",
]

FORMAT = "mindformers_core.checkpoint/2"   # /2: the digest covers the metadata too
_NAME_RE = re.compile(r"^(?P<prefix>.+)_step(?P<step>\d{8,})\.safetensors$")
_TMP_MARK = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing, truncated, corrupt or of another format."""


@dataclass
class CheckpointData:
    """What one checkpoint file holds (tensors as numpy arrays in their original dtype names)."""
    path: str
    step: int
    tensors: Dict[str, np.ndarray]
    state: dict
    config: dict
    dtypes: Dict[str, str]
    run_id: Optional[str] = None


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


def _digest(metadata: Dict[str, str], tensors: Dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in metadata.items() if k != "sha256"},
                        sort_keys=True).encode())
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(repr(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening a directory
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(directory: str, prefix: str, step: int, tensors: Dict[str, np.ndarray],
                    state: dict, config: dict, dtypes: Optional[Dict[str, str]] = None,
                    write_hook=None, run_id: Optional[str] = None) -> str:
    """Write one checkpoint atomically and return its path.

    A failed write (disk full, permissions) removes its temp file and leaves every earlier
    checkpoint as it was; the ``OSError`` becomes a :class:`CheckpointError` naming the file.
    ``write_hook(fileobj, data: bytes)`` (tests only) replaces the plain ``fileobj.write`` so a
    test can kill the process in the middle of the write.
    """
    import safetensors.numpy as stn

    os.makedirs(directory, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    metadata = {
        "format": FORMAT,
        "step": str(int(step)),
        "state": json.dumps(state, sort_keys=True),
        "config": json.dumps(config, sort_keys=True),
        "dtypes": json.dumps(dtypes or {}, sort_keys=True),
        "run_id": str(run_id or ""),
    }
    metadata["sha256"] = _digest(metadata, arrays)
    payload = stn.save(arrays, metadata=metadata)
    final = os.path.join(directory, checkpoint_name(prefix, step))
    tmp = os.path.join(directory, f".{checkpoint_name(prefix, step)}{_TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            if write_hook is None:
                fh.write(payload)
            else:
                write_hook(fh, payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise CheckpointError(f"cannot write checkpoint {final}: {exc.strerror or exc}; the "
                              "previous checkpoints are kept") from exc
    _fsync_dir(directory)
    return final


def prune_checkpoints(directory: str, prefix: str, keep: int,
                      run_id: Optional[str] = None, protect=()) -> List[str]:
    """Delete all but the newest ``keep`` checkpoints of ``prefix`` and stale temp files.

    With ``run_id``, only checkpoints written by that run lineage count (and are removed):
    another run's files in the same directory are never touched. Steps in ``protect``
    (``checkpoint.keep_steps``) are neither counted nor removed. Returns the removed paths.
    """
    removed = []
    protect = set(protect or ())
    mine = [(s, p) for s, p in list_checkpoints(directory)
            if _NAME_RE.match(os.path.basename(p)).group("prefix") == prefix and s not in protect
            and (run_id is None or checkpoint_run_id(p) == run_id)]
    for _, path in mine[:-keep] if keep > 0 else mine:
        os.remove(path)
        removed.append(path)
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


def _read_header(path: str, size: int) -> dict:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CheckpointError(f"checkpoint {path} is truncated: {size} bytes, no header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(
                f"checkpoint {path} is truncated: header claims {n} bytes, file has {size}")
        raw = fh.read(n)
    header = _parse_json(raw, path, "header")
    if not isinstance(header, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: its header is a "
                              f"{type(header).__name__}, not a JSON object")
    meta = header.get("__metadata__")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"checkpoint {path} is corrupt: __metadata__ must map names to "
                              "strings")
    header["__metadata__"] = meta
    return header


def _parse_json(raw, path: str, what: str):
    """JSON of a header part; a crafted one (too deep, not UTF-8, not JSON) is a clear error."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"checkpoint {path} is corrupt: unreadable {what} ({exc})") from exc
    try:
        return json.loads(text)
    except RecursionError:
        raise CheckpointError(f"checkpoint {path} is corrupt: its {what} is nested too "
                              "deeply") from None
    except ValueError as exc:   # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"checkpoint {path} is corrupt: unreadable {what} ({exc})") from exc


def checkpoint_run_id(path: str) -> Optional[str]:
    """The run id stored in a checkpoint's header (None if unreadable or not recorded)."""
    try:
        meta = _read_header(path, os.path.getsize(path))["__metadata__"]
    except (CheckpointError, OSError):
        return None
    return meta.get("run_id") or None


def load_checkpoint(path: str) -> CheckpointData:
    """Read and verify one checkpoint file; :class:`CheckpointError` if it is unusable."""
    import safetensors.numpy as stn

    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file not found: {path}")
    size = os.path.getsize(path)
    header = _read_header(path, size)
    meta = header["__metadata__"]
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} is not a {FORMAT} file (format={meta.get('format')!r:.80})")
    try:
        with open(path, "rb") as fh:
            tensors = stn.load(fh.read())
    except Exception as exc:  # safetensors raises its own error type for bad buffers
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {exc}") from exc
    if _digest(meta, tensors) != meta.get("sha256"):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its header or tensor data does not match its sha256 "
            "digest")
    missing = [k for k in ("state", "config", "step") if k not in meta]
    if missing:
        raise CheckpointError(f"checkpoint {path} is corrupt: metadata lacks {missing}")
    state = _parse_json(meta["state"], path, "state")
    config = _parse_json(meta["config"], path, "config")
    dtypes = _parse_json(meta.get("dtypes", "{}"), path, "dtypes")
    if not re.fullmatch(r"\d{1,12}", meta["step"]):
        raise CheckpointError(f"checkpoint {path} is corrupt: step {meta['step']!r:.40} is not a "
                              "non-negative integer")
    for name, value in (("state", state), ("config", config), ("dtypes", dtypes)):
        if not isinstance(value, dict):
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is a "
                                  f"{type(value).__name__}, not an object")
    return CheckpointData(path=path, step=int(meta["step"]), tensors=tensors, state=state,
                          config=config, dtypes=dtypes, run_id=meta.get("run_id") or None)


def resolve_checkpoint(load_path: str, log=None) -> CheckpointData:
    """Load ``load_path``: a file, or a directory meaning its newest complete checkpoint.

    In a directory, a newer checkpoint that fails verification is reported through ``log``
    (a callable taking a string) and the next older one is tried. A file is used as given:
    if it is damaged the error says so and names the usable ones next to it.
    """
    if os.path.isfile(load_path):
        try:
            return load_checkpoint(load_path)
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
    for _, path in reversed(found):
        try:
            data = load_checkpoint(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            if log is not None:
                log(f"WARNING: skipping unusable checkpoint: {exc}; trying the previous one")
            continue
        return data
    raise CheckpointError("checkpoint.load_path: every checkpoint in "
                          f"{load_path} is unusable: " + "; ".join(problems))
