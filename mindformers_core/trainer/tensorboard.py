"""TensorBoard event files (``logging.tensorboard: True``, or upstream's
``monitor.tensorboard.output_dir``: config/monitor.py ``tensorboard_target``) through the
optional ``tensorboardX`` package (``pip install -e .[tensorboard]``).

Every numeric scalar of a ``metrics.jsonl`` row is written under the same name (``loss``,
``lr``, ``grad_norm``, ``eval_loss``, ...; per-group lrs as ``lrs/<i>``) at the row's
``step``, so the dashboard and the JSON lines hold the same numbers; with ``log_interval`` N
only the rows of steps that are multiples of N.
"""
from __future__ import annotations

import math
from typing import Optional

__all__ = ["TensorBoardWriter", "scalars_of_row"]


def scalars_of_row(row: dict) -> dict:
    """``name -> float`` of a metrics row: numbers (not bools, not the step), list entries as
    ``name/i``; nulls (non-finite values) are left out."""
    out = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out[key] = float(value)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
                    out[f"{key}/{i}"] = float(v)
    return {k: v for k, v in out.items() if math.isfinite(v)}


class TensorBoardWriter:
    """Scalars of metrics rows to an event file in ``logdir``."""

    def __init__(self, logdir: str, log_interval: int = 1, queue_size: int = 10,
                 field: str = "logging.tensorboard"):
        try:
            from tensorboardX import SummaryWriter
        except ModuleNotFoundError:
            from ..errors import ConfigError
            raise ConfigError(field, "needs the 'tensorboardX' package: "
                                     "pip install -e .[tensorboard]") from None
        self.logdir = logdir
        self.log_interval = int(log_interval)
        self._writer: Optional[object] = SummaryWriter(logdir=logdir, max_queue=int(queue_size))

    def write_row(self, row: dict) -> None:
        step = int(row["step"])
        if step % self.log_interval:
            return
        for name, value in scalars_of_row(row).items():
            self._writer.add_scalar(name, value, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
