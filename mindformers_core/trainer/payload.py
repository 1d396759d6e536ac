"""Trainer values as plain data: tensors as numpy arrays for a checkpoint, nested state as
YAML/JSON-safe Python (numpy scalars to Python numbers)."""
from __future__ import annotations

import numpy as np

__all__ = ["tensor_to_numpy", "jsonable", "state_arrays"]


def tensor_to_numpy(param) -> tuple:
    """(array, original dtype name or None): bf16 has no numpy dtype, store it as fp32 (exact)."""
    import mindspore as ms
    if param.dtype == ms.bfloat16:
        return param.astype(ms.float32).asnumpy(), "bfloat16"
    return param.asnumpy(), None


def state_arrays(state: dict) -> tuple:
    """``(arrays, scalars)`` of an optimizer ``state_dict``: its numpy arrays and MindSpore
    tensors (as numpy arrays, fp32 for bf16) apart from its plain values."""
    import mindspore as ms
    arrays, scalars = {}, {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[key] = value
        elif isinstance(value, ms.Tensor):   # a Parameter too
            arrays[key] = tensor_to_numpy(value)[0]
        else:
            scalars[key] = value
    return arrays, scalars


def jsonable(value):
    """``value`` with dict keys as strings, tuples as lists and numpy scalars as Python ones."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
