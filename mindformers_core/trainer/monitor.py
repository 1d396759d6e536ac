"""The `monitor:` section's records (config/monitor.py), added to each ``metrics.jsonl`` row.

Per optimizer step, with upstream's option names:

* ``local_loss``: ``[loss of micro-batch 1, ...]``, each the mean token loss of that
  micro-batch (nats/token);
* ``device_loss``: this rank's loss of the step (its token-loss sum / its loss tokens);
* ``local_norm``: ``[{param: norm, ...} per micro-batch]``, the L2 norm of each matching
  parameter's gradient contribution from that micro-batch (unscaled by a loss scale);
* ``device_norm``: ``{param: norm}``, the norm of this rank's accumulated gradient of each
  matching parameter, before the data-parallel reduction.

The global (all-rank) loss and gradient norm are the row's ``loss`` and ``grad_norm``.
A norm option selects parameters by name: True every parameter, a pattern or a list of them
(``fnmatch``; a pattern without wildcards matches as a substring, as upstream's
``"embedding"``).
"""
from __future__ import annotations

import fnmatch
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..config.monitor import norm_patterns

__all__ = ["TrainStateMonitor", "select_names", "grad_norms"]


def select_names(names: Sequence[str], patterns: Optional[List[str]]) -> List[int]:
    """Indices of ``names`` matching ``patterns`` (None: none; []: all)."""
    if patterns is None:
        return []
    if not patterns:
        return list(range(len(names)))

    def match(name: str, pat: str) -> bool:
        if any(c in pat for c in "*?["):
            return fnmatch.fnmatchcase(name, pat)
        return pat in name

    return [i for i, n in enumerate(names) if any(match(n, p) for p in patterns)]


def grad_norms(grads: Sequence, indices: Sequence[int], scale: float = 1.0) -> List[float]:
    """L2 norms (float64 on the host) of ``grads[i] / scale`` for ``i`` in ``indices``."""
    out = []
    for i in indices:
        g = np.asarray(grads[i].asnumpy(), dtype=np.float64)
        norm = float(np.sqrt(np.sum(g * g))) / scale
        out.append(norm if math.isfinite(norm) else None)   # JSON has no NaN
    return out


class TrainStateMonitor:
    """Collects one step's records; ``pop_records()`` hands them to the metrics row."""

    def __init__(self, train_state, param_names: Sequence[str]):
        self.names = list(param_names)
        self.local_loss = bool(train_state.local_loss)
        self.device_loss = bool(train_state.device_loss)
        self.local_idx = select_names(self.names, norm_patterns(train_state.local_norm))
        self.device_idx = select_names(self.names, norm_patterns(train_state.device_norm))
        self._records: Dict[str, Any] = {}

    @property
    def watches_micro_batches(self) -> bool:
        return self.local_loss or bool(self.local_idx)

    def on_micro_batch(self, loss_sum: float, tokens: float, grads: Sequence,
                       loss_scale: float = 1.0) -> None:
        """After one micro-batch's backward (``grads`` its contribution, times loss_scale)."""
        if self.local_loss:
            value = loss_sum / tokens if tokens > 0 else None
            self._records.setdefault("local_loss", []).append(value)
        if self.local_idx:
            norms = grad_norms(grads, self.local_idx, loss_scale)
            self._records.setdefault("local_norm", []).append(
                {self.names[i]: v for i, v in zip(self.local_idx, norms)})

    def on_device_step(self, loss_sum: float, tokens: float, grads: Sequence,
                       loss_scale: float = 1.0) -> None:
        """After all micro-batches of this rank, before the data-parallel reduction."""
        if self.device_loss:
            self._records["device_loss"] = loss_sum / tokens if tokens > 0 else None
        if self.device_idx:
            norms = grad_norms(grads, self.device_idx, loss_scale)
            self._records["device_norm"] = {self.names[i]: v
                                            for i, v in zip(self.device_idx, norms)}

    def pop_records(self) -> Dict[str, Any]:
        records, self._records = self._records, {}
        return records
