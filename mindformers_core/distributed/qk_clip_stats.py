"""One QK-Clip step report from the reports of the ranks of a group whose members clip
different heads (pipeline stages hold other layers, tensor-parallel ranks other heads).

``combine_qk_stats(comm, group, stats)``: the clipped heads summed over the members and the
largest tracked logit, from one all-gather of ``[heads, max_logit]`` rows; a member with no
report (``None``: a stage without MLA layers) contributes nothing, and the result is None
when no member reported. A collective: every member calls it.
"""
from __future__ import annotations

import math
import numpy as np

from .collectives import GroupCommunicator

__all__ = ["combine_qk_stats"]

#: stands for -inf in the gathered float32 rows (finite, so the all-gather stays exact)
_NO_LOGIT = -3.0e38


def combine_qk_stats(comm: GroupCommunicator, group: str, stats):
    """The group's QK-Clip report (module docstring); ``stats``: this rank's
    ``optim.qk_clip.QKClipStats`` or None."""
    from ..optim.qk_clip import QKClipStats
    row = [-1.0, _NO_LOGIT] if stats is None else [
        float(stats.num_clipped_heads),
        stats.max_logit if math.isfinite(stats.max_logit) else _NO_LOGIT]
    vals = np.asarray(comm.all_gather(np.array([row], np.float32), group))
    ran = vals[:, 0] >= 0
    if not ran.any():
        return None
    mx = float(vals[ran, 1].max())
    return QKClipStats(int(round(float(vals[ran, 0].sum()))),
                       mx if mx > _NO_LOGIT else float("-inf"))
