"""Model weights from a checkpoint into a built model (training resume and generation)."""
from __future__ import annotations

import numpy as np

from .store import CheckpointData, CheckpointError
from .resume_checks import check_weight

__all__ = ["load_model_weights"]


def load_model_weights(model, data: CheckpointData) -> None:
    """Set every parameter of ``model`` from the ``model.*`` tensors of ``data``; the names,
    shapes and stored dtypes (bf16 as float32) must match exactly (:class:`CheckpointError`
    naming the first differences)."""
    import mindspore as ms
    params = {p.name: p for p in model.get_parameters()}
    saved = {k[len("model."):]: v for k, v in data.tensors.items() if k.startswith("model.")}
    missing = sorted(set(params) - set(saved))
    unexpected = sorted(set(saved) - set(params))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {data.path} does not match the model: missing "
                              f"{missing[:10]}, unexpected {unexpected[:10]}")
    for name, param in params.items():
        arr = saved[name]
        check_weight(data, name, arr, param.shape, "float32" if param.dtype == ms.bfloat16
                     else str(np.dtype(ms.dtype_to_nptype(param.dtype))))
        param.set_data(ms.Tensor(arr).astype(param.dtype))
