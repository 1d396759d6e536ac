"""The file layer every checkpoint file shares: the digest, the atomic write, the verified read.

Single-process checkpoints (``checkpoint.py``) and the rank files and index of a sharded
checkpoint (``sharded_checkpoint.py``) are all safetensors files whose ``__metadata__`` holds a
``format`` and a ``sha256``: one digest over every other metadata entry (canonical JSON) and
every tensor's name, dtype, shape and bytes in sorted name order, so a changed byte anywhere
in a file is refused.

The write is: temp file in the same directory -> write -> flush -> fsync -> rename -> fsync of
the directory (``os.replace`` of a single file is atomic on POSIX). A process killed mid-write
leaves only a ``.tmp`` file, which is never read.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

__all__ = ["CheckpointError", "CheckpointData", "TMP_MARK", "digest", "encode", "write_atomic",
           "read_header", "parse_json", "read_verified", "checkpoint_data",
           "run_metadata"]

TMP_MARK = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing, truncated, corrupt or of another format."""


@dataclass
class CheckpointData:
    """What one checkpoint holds (tensors as numpy arrays in their original dtype names)."""
    path: str
    step: int
    tensors: Dict[str, np.ndarray]
    state: dict
    config: dict
    dtypes: Dict[str, str]
    run_id: Optional[str] = None
    #: model weights only (another format, ``foreign.py``): a fine-tune start, no train state
    weights_only: bool = False
    #: where it stands in its run's history (``lineage.py``); None in older files
    lineage: Optional[dict] = None
    #: why a directory resume passed over newer checkpoints of its line (damaged ones)
    skipped: Tuple[str, ...] = ()


def digest(metadata: Dict[str, str], tensors: Dict[str, np.ndarray]) -> str:
    """sha256 over the metadata (but ``sha256``) and every tensor (module docstring)."""
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


def encode(tensors: Dict[str, np.ndarray], metadata: Dict[str, str]) -> bytes:
    """The safetensors bytes of ``tensors`` with ``metadata`` plus its ``sha256``."""
    import safetensors.numpy as stn
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    metadata = dict(metadata)
    metadata["sha256"] = digest(metadata, arrays)
    return stn.save(arrays, metadata=metadata)


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


def write_atomic(directory: str, name: str, payload: bytes, write_hook=None) -> str:
    """Write ``payload`` to ``directory/name`` atomically and return the path.

    A failed write (disk full, permissions) removes its temp file; the ``OSError`` becomes a
    :class:`CheckpointError` naming the file. ``write_hook(fileobj, data)`` (tests only)
    replaces the plain ``fileobj.write`` so a test can kill the process mid-write.
    """
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}{TMP_MARK}{os.getpid()}")
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


def read_header(path: str, size: int) -> dict:
    """The JSON header of a safetensors file, ``__metadata__`` checked to map str -> str."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CheckpointError(f"checkpoint {path} is truncated: {size} bytes, no header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(
                f"checkpoint {path} is truncated: header claims {n} bytes, file has {size}")
        raw = fh.read(n)
    header = parse_json(raw, path, "header")
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


def parse_json(raw, path: str, what: str):
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


def read_verified(path: str, formats: Sequence[str],
                  header: Optional[dict] = None) -> Tuple[Dict[str, str], Dict[str, np.ndarray]]:
    """``(metadata, tensors)`` of a file whose format is one of ``formats`` and whose digest
    matches; :class:`CheckpointError` otherwise."""
    import safetensors.numpy as stn

    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file not found: {path}")
    if header is None:
        header = read_header(path, os.path.getsize(path))
    meta = header["__metadata__"]
    if meta.get("format") not in formats:
        raise CheckpointError(
            f"checkpoint {path} is not a {' or '.join(formats)} file "
            f"(format={meta.get('format')!r:.80})")
    try:
        with open(path, "rb") as fh:
            tensors = stn.load(fh.read())
    except Exception as exc:  # safetensors raises its own error type for bad buffers
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {exc}") from exc
    if digest(meta, tensors) != meta.get("sha256"):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its header or tensor data does not match its sha256 "
            "digest")
    return meta, tensors


def checkpoint_data(path: str, meta: Dict[str, str],
                    tensors: Dict[str, np.ndarray]) -> CheckpointData:
    """The :class:`CheckpointData` of a verified file's metadata (step, state, config, dtypes,
    run id), each part checked to be of its type."""
    missing = [k for k in ("state", "config", "step") if k not in meta]
    if missing:
        raise CheckpointError(f"checkpoint {path} is corrupt: metadata lacks {missing}")
    state = parse_json(meta["state"], path, "state")
    config = parse_json(meta["config"], path, "config")
    dtypes = parse_json(meta.get("dtypes", "{}"), path, "dtypes")
    if not re.fullmatch(r"\d{1,12}", meta["step"]):
        raise CheckpointError(f"checkpoint {path} is corrupt: step {meta['step']!r:.40} is not a "
                              "non-negative integer")
    for name, value in (("state", state), ("config", config), ("dtypes", dtypes)):
        if not isinstance(value, dict):
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is a "
                                  f"{type(value).__name__}, not an object")
    lineage = parse_json(meta["lineage"], path, "lineage") if "lineage" in meta else None
    if lineage is not None and not isinstance(lineage, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: lineage is a "
                              f"{type(lineage).__name__}, not an object")
    return CheckpointData(path=path, step=int(meta["step"]), tensors=tensors, state=state,
                          config=config, dtypes=dtypes, run_id=meta.get("run_id") or None,
                          lineage=lineage)


def run_metadata(fmt: str, step: int, state: dict, config: dict,
                 dtypes: Optional[Dict[str, str]], run_id: Optional[str],
                 lineage: Optional[dict] = None) -> Dict[str, str]:
    """The metadata of a file a resume reads its run from (``format`` ... ``run_id``, and
    ``lineage`` when given: ``lineage.py``)."""
    meta = {
        "format": fmt,
        "step": str(int(step)),
        "state": json.dumps(state, sort_keys=True),
        "config": json.dumps(config, sort_keys=True),
        "dtypes": json.dumps(dtypes or {}, sort_keys=True),
        "run_id": str(run_id or ""),
    }
    if lineage is not None:
        meta["lineage"] = json.dumps(lineage, sort_keys=True)
    return meta
