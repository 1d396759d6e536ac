"""Replace a Parameter's data by this rank's shard of it (the one "keep my slice" step).

Tensor parallel (models/tp_model.py), expert parallel (models/expert_parallel.py) and FSDP
(distributed/fsdp.py) all build the model whole, with the single-process initialisation, and
then keep this rank's piece of each split parameter under the same name and dtype; the layout
of the piece is its :class:`~.shard_spec.ShardSpec` (``shard_spec.shard`` is the numpy math).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .shard_spec import ShardSpec, shard

__all__ = ["keep_shard"]


def keep_shard(param, spec: ShardSpec, index: int) -> None:
    """Set ``param`` (its full tensor) to shard ``index`` of ``spec``, keeping its dtype (a
    bf16/fp16 parameter is cut in float32, which holds its values exactly)."""
    full = (param if param.dtype == ms.float32 else param.astype(ms.float32)).asnumpy()
    piece = Tensor(shard(spec, np.asarray(full, np.float32), index))
    param.set_data(piece if param.dtype == ms.float32 else piece.astype(param.dtype))
