"""Model weights from a checkpoint into a built model (training resume and generation)."""
from __future__ import annotations

from .checkpoint import CheckpointData, CheckpointError

__all__ = ["load_model_weights"]


def load_model_weights(model, data: CheckpointData) -> None:
    """Set every parameter of ``model`` from the ``model.*`` tensors of ``data``; the names and
    shapes must match exactly (:class:`CheckpointError` naming the first differences)."""
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
        if tuple(arr.shape) != tuple(param.shape):
            raise CheckpointError(f"checkpoint {data.path}: parameter {name} has shape "
                                  f"{tuple(arr.shape)}, the model has {tuple(param.shape)}")
        param.set_data(ms.Tensor(arr).astype(param.dtype))
