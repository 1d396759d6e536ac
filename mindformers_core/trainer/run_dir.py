"""Run identity: which run a checkpoint or a metrics row belongs to, and who owns a directory.

Every run has a *run id* (``YYYYmmdd-HHMMSS-xxxxxx``, made when a run starts from scratch and
inherited by every resume of it: the id names a lineage). It is written into every checkpoint
header and every ``metrics.jsonl`` row. With it:

* rotation (``checkpoint.save_max``) prunes only the checkpoints of its own lineage;
* a run starting from scratch refuses a directory that already holds another run's
  checkpoints or metrics (:func:`claim_run_dir`), naming that run and the three ways on:
  resume it (``checkpoint.load_path``), write elsewhere (``--output_dir``), or ``--overwrite``;
* ``--overwrite`` moves the old files into ``superseded/<time>-<old run id>/`` next to them
  (:func:`move_aside`); nothing is deleted;
* a resume refuses a ``metrics.jsonl`` of another lineage, so its rows are appended only to
  its own run's file;
* the claim is atomic: before looking at the files, the run takes an exclusive
  ``fcntl.flock`` on ``run.lock`` in its directory (:func:`lock_run_dir`) and keeps it open
  for the life of its process (``Trainer.train`` gives it up when the run ends). Two runs started at the same moment in one directory cannot
  both pass the check: the second one is refused, naming the directory and the process
  holding it. The kernel drops the lock when that process exits (however it ends), so a dead
  run never blocks a new one.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import time
from typing import Dict, List, Optional

from ..errors import ConfigError
from ..checkpoint.store import checkpoint_run_id, list_checkpoints
from ..checkpoint.sharded import shard_files_of

__all__ = ["new_run_id", "metrics_run_id", "claim_run_dir", "lock_run_dir", "release_run_dir",
           "move_aside",
           "RUN_FILES", "SUPERSEDED_DIR", "LOCK_FILE"]

#: files of a run in its output directory (besides the checkpoints)
RUN_FILES = ("metrics.jsonl", "resolved_config.yaml", "run_plan.yaml")
SUPERSEDED_DIR = "superseded"
LOCK_FILE = "run.lock"
#: run directories this process holds the lock of: {real path: open descriptor}
_HELD: Dict[str, int] = {}


def new_run_id() -> str:
    """A fresh lineage id: start time (UTC) plus 6 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def metrics_run_id(path: str) -> Optional[str]:
    """Run id of a ``metrics.jsonl`` (its first readable row); ``"unknown"`` for rows without
    one (files of older versions); None when the file is missing or holds no row."""
    if not os.path.isfile(path):
        return None
    with open(path, "r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                return str(row.get("run_id") or "unknown")
    return None


def _foreign(output_dir: Optional[str], save_dir: str, run_id: Optional[str]) -> List[str]:
    """Files in the run's directories written by a run other than ``run_id`` (None: any)."""
    found = []
    for _, path in list_checkpoints(save_dir):
        rid = checkpoint_run_id(path) or "unknown"
        if rid != run_id:
            found.append(f"{path} (run {rid})")
    if output_dir is not None:
        rid = metrics_run_id(os.path.join(output_dir, "metrics.jsonl"))
        if rid is not None and rid != run_id:
            found.append(f"{os.path.join(output_dir, 'metrics.jsonl')} (run {rid})")
    return found


def lock_run_dir(directory: str, field: str = "--output_dir") -> None:
    """Hold ``directory/run.lock`` exclusively until this process exits (module docstring);
    :class:`ConfigError` naming the directory (and the holder's pid) if another process holds
    it. Taking it again in the same process is a no-op. A directory that cannot be written is
    left to the preflight check (``trainer/preflight.py``), which names the reason."""
    key = os.path.realpath(directory)
    if key in _HELD:
        return
    path = os.path.join(directory, LOCK_FILE)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            os.close(fd)
            return
        holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(field, (
            f"{directory} is in use by another run (process {holder} holds {path}). Two runs "
            "in one directory would overwrite each other's checkpoints and metrics, so this one "
            "does not start. Wait for that run to end (the lock goes with its process), or "
            "write this run elsewhere (--output_dir DIR)")) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _HELD[key] = fd


def release_run_dir(output_dir: Optional[str], save_dir: str) -> None:
    """Give up the lock :func:`claim_run_dir` took (the run is over); a no-op when this
    process does not hold it."""
    directory = output_dir if output_dir is not None else save_dir
    fd = _HELD.pop(os.path.realpath(directory), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def claim_run_dir(output_dir: Optional[str], save_dir: str, run_id: str, resuming: bool,
                  overwrite: bool = False) -> None:
    """Make sure this run loses no other run's files; raise :class:`ConfigError` if it would.

    ``resuming``: the run continues lineage ``run_id`` (its own checkpoints and metrics are
    expected there). ``overwrite``: move other runs' files aside instead of refusing. The
    directory is locked first (:func:`lock_run_dir`), so no other run can pass this check
    while this one runs.
    """
    if output_dir is not None:
        lock_run_dir(output_dir)
    else:
        lock_run_dir(save_dir, "checkpoint.save_path")
    foreign = _foreign(output_dir, save_dir, run_id)
    if not foreign:
        return
    if overwrite:
        move_aside(output_dir, save_dir, run_id)
        return
    others = sorted({f.rsplit("(run ", 1)[1].rstrip(")") for f in foreign})
    shown = "; ".join(foreign[:3]) + (f"; and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    where = output_dir if output_dir is not None else save_dir
    what = "this resumed run" if resuming else "a new run"
    raise ConfigError("--output_dir", (
        f"{where} already holds files of run {', '.join(others)}: {shown}. "
        f"Refusing to start {what} there, it would mix with or delete them. Choose one: "
        "resume that run (checkpoint.load_path: its checkpoint directory), write this run "
        "elsewhere (--output_dir DIR, or checkpoint.save_path), or pass --overwrite to move "
        f"the old files into {SUPERSEDED_DIR}/ (nothing is deleted)"))


def _stamp_dir(base: str, old_id: str) -> str:
    target = os.path.join(base, SUPERSEDED_DIR,
                          time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{old_id}")
    n, final = 1, target
    while os.path.exists(final):
        n += 1
        final = f"{target}.{n}"
    return final


def move_aside(output_dir: Optional[str], save_dir: str, keep_run_id: Optional[str]) -> List[str]:
    """Move every checkpoint not of ``keep_run_id`` and (unless they belong to it) the run files
    of ``output_dir`` into ``superseded/<time>-<old id>/``. Returns the new paths."""
    moved = []
    plan = []
    for _, path in list_checkpoints(save_dir):
        rid = checkpoint_run_id(path) or "unknown"
        if rid != keep_run_id:   # a sharded checkpoint moves with its rank files
            plan.extend((part, save_dir, rid) for part in shard_files_of(path) + [path])
    if output_dir is not None:
        rid = metrics_run_id(os.path.join(output_dir, "metrics.jsonl"))
        if rid is not None and rid != keep_run_id:
            for name in RUN_FILES:
                path = os.path.join(output_dir, name)
                if os.path.isfile(path):
                    plan.append((path, output_dir, rid))
    targets = {}
    for path, base, rid in plan:
        key = (base, rid)
        if key not in targets:
            targets[key] = _stamp_dir(base, rid)
            os.makedirs(targets[key])
        dest = os.path.join(targets[key], os.path.basename(path))
        os.replace(path, dest)
        moved.append(dest)
    return moved
