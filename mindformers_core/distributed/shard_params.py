"""Replace a Parameter's data by this rank's shard of it (the one "keep my slice" step).

Tensor parallel (models/tp_model.py), expert parallel (models/expert_parallel.py) and FSDP
(distributed/fsdp.py) all build the model whole, with the single-process initialisation, and
then keep this rank's piece of each split parameter under the same name and dtype; the layout
of the piece is its :class:`~.shard_spec.ShardSpec` (``shard_spec.shard`` is the numpy math).

A parameter that a forward may leave unused is cut into a new Parameter (:func:`cut_parameter`,
:func:`cut_parameters` by name) rather than in place: MindSpore 2.10 keeps the shape a Parameter was built with in its
autograd leaf, and differentiating a function that does not read the parameter returns zeros
of that built shape after ``set_data`` changed it (an expert-parallel rank whose experts
received no token in a step got [E, ...] zeros for its [E / ep, ...] experts, and the
expert-gradient all-reduce of the two edp ranks then got different sizes;
tests/distributed/test_shard_params.py has the reproducer). Tensor parallelism cuts every
split weight that way: under an interleaved pipeline (pp x tp, vpp > 1) each virtual stage's
backward differentiates the rank's weights of its other virtual stage too, which it does not
read.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .shard_spec import ShardSpec, shard

__all__ = ["keep_shard", "cut_parameter", "cut_parameters"]


def _piece(param, spec: ShardSpec, index: int) -> Tensor:
    """Shard ``index`` of ``spec`` of ``param`` (its full tensor) in its dtype (a bf16/fp16
    parameter is cut in float32, which holds its values exactly)."""
    full = (param if param.dtype == ms.float32 else param.astype(ms.float32)).asnumpy()
    piece = Tensor(shard(spec, np.asarray(full, np.float32), index))
    return piece if param.dtype == ms.float32 else piece.astype(param.dtype)


def keep_shard(param, spec: ShardSpec, index: int) -> None:
    """Set ``param`` (its full tensor) to shard ``index`` of ``spec``, keeping its dtype; for
    parameters every forward reads (see the module docstring)."""
    param.set_data(_piece(param, spec, index))


def cut_parameter(owner, attr: str, spec: ShardSpec, index: int):
    """Replace ``owner.<attr>`` (a Parameter of the Cell ``owner``, its full tensor) by a new
    Parameter holding shard ``index`` of ``spec``, with the same name, dtype and
    ``requires_grad``; returns the new Parameter. Call it before an optimizer is built over
    the model (the optimizer would hold the old one)."""
    old = getattr(owner, attr)
    new = ms.Parameter(_piece(old, spec, index), name=old.name, requires_grad=old.requires_grad)
    setattr(owner, attr, new)
    return new


def cut_parameters(model, specs, index: int) -> None:
    """:func:`cut_parameter` for every parameter of ``model`` named in ``specs`` (name ->
    ShardSpec), each found on the Cell its name's prefix names (``a.b.weight``: attribute
    ``weight`` of the sub-cell ``a.b``)."""
    cells = dict(model.cells_and_names())
    for name, spec in specs.items():
        path, _, attr = name.rpartition(".")
        owner = cells.get(path)
        if owner is None or not isinstance(getattr(owner, attr, None), ms.Parameter) \
                or getattr(owner, attr).name != name:
            raise ValueError(f"parameter {name!r} is not the attribute {attr!r} of a sub-cell "
                             f"{path!r} of the model")
        cut_parameter(owner, attr, spec, index)
