"""Checks at start, before step 1: the run can write its files and has room for a checkpoint.

Without them a read-only or impossible ``checkpoint.save_path``, or a full disk, would only
surface as an ``OSError`` traceback at the first save, possibly hours into the run. Each check
raises :class:`ConfigError` naming the field (``checkpoint.save_path`` or ``--output_dir``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterable, Optional

from ..errors import ConfigError

__all__ = ["estimate_checkpoint_bytes", "check_writable_dir", "check_free_space",
           "preflight_run_dirs", "OPTIMIZER_STATE_FACTOR"]

#: fp32 tensors an optimizer keeps per parameter at most (AdamW: master + 2 moments)
OPTIMIZER_STATE_FACTOR = 3


def estimate_checkpoint_bytes(param_sizes: Iterable[int], with_optimizer: bool) -> int:
    """Bytes of one checkpoint: every weight as fp32 (bf16 is stored as fp32) plus, with the
    optimizer state, :data:`OPTIMIZER_STATE_FACTOR` fp32 tensors per weight; plus 1 MiB of
    header and RNG state."""
    n = sum(int(s) for s in param_sizes)
    return 4 * n * (1 + (OPTIMIZER_STATE_FACTOR if with_optimizer else 0)) + (1 << 20)


def _read_only_reason(path: str) -> Optional[str]:
    """Why ``path`` (or, when missing, its nearest existing ancestor) is read-only, else None.

    Looks at the permission bits and the mount flags, not only at what this process may do:
    root can write into a ``chmod a-w`` directory, but its owner marked it read-only."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        mode = os.stat(probe).st_mode
        readonly_mount = bool(os.statvfs(probe).f_flag & getattr(os, "ST_RDONLY", 0))
    except OSError:
        return None
    if readonly_mount:
        return f"{probe!r} is on a read-only filesystem"
    if os.path.isdir(probe) and not mode & 0o222:
        return f"{probe!r} is read-only (mode {oct(mode & 0o777)})"
    return None


def check_writable_dir(path: str, field: str) -> None:
    """Create ``path`` if needed and write (then remove) a probe file in it; a directory
    marked read-only (no write bit, read-only mount) is refused even when root could write."""
    reason = _read_only_reason(path)
    if reason is not None:
        raise ConfigError(field, f"cannot write to {path!r}: {reason}; choose a writable "
                                 "directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-") as fh:
            fh.write(b"x")
            fh.flush()
    except OSError as exc:
        raise ConfigError(field, f"cannot write to {path!r}: {exc.strerror or exc}; choose a "
                                 "writable directory") from None


def check_free_space(path: str, need_bytes: int, field: str,
                     free_bytes: Optional[int] = None) -> None:
    """Raise when the filesystem of ``path`` has less than ``need_bytes`` free."""
    free = shutil.disk_usage(path).free if free_bytes is None else int(free_bytes)
    if free < need_bytes:
        raise ConfigError(field, (
            f"{path!r} has {free / 2 ** 20:,.1f} MiB free, one checkpoint of this model needs "
            f"about {need_bytes / 2 ** 20:,.1f} MiB (weights + optimizer state); free space, "
            "choose another directory, or set checkpoint.no_save_optim: True"))


def preflight_run_dirs(output_dir: Optional[str], save_dir: str, save_path_set: bool,
                       need_bytes: int, saving: bool) -> None:
    """The output directory is writable; with checkpoints on, so is ``save_dir``, and it has
    room for one checkpoint of ``need_bytes``."""
    if output_dir is not None:
        check_writable_dir(output_dir, "--output_dir")
    if saving:
        field = "checkpoint.save_path" if save_path_set else "--output_dir"
        check_writable_dir(save_dir, field)
        check_free_space(save_dir, need_bytes, field)
