"""In-place scaling of fp32 masters through numpy views of their buffers (CPU).

On CPU ``Parameter.asnumpy()`` is a writable view of the Parameter's storage, so a numpy
in-place multiply costs one read and one write with no MindSpore kernel or allocation. Where it
is not a view (device memory) the result is written with ``set_data``. Used by the optimizer
base, AdamW and the fp32 masters (``main_params``), which is why it is a module of its own.
"""
from __future__ import annotations

import os
from typing import Dict, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor

__all__ = ["scale_many_in_place", "scale_in_place", "aliased_view",
           "numpy_view_aliases_storage", "host_address", "array_address", "host_threads"]


def scale_many_in_place(masters: Sequence[Parameter], factor: float) -> None:
    """Each master *= factor, in place; on CPU one host sync for the whole list.

    ``asnumpy()`` waits for pending kernels (a thread hand-off that can cost milliseconds on a
    busy machine), so all views are taken first (the first call drains the queue, the rest
    are then immediate) and the numpy multiplies run afterwards, before any new kernel is
    launched on these masters.
    """
    if factor == 1.0:
        return
    views = [aliased_view(m) for m in masters] if numpy_view_aliases_storage() \
        else [None] * len(masters)
    f32 = np.float32(factor)
    for m, view in zip(masters, views):
        if view is not None:
            np.multiply(view, f32, out=view)
        else:
            m.set_data(m * factor)


def aliased_view(param: Parameter) -> Optional[np.ndarray]:
    """``param.asnumpy()`` when it is a writable view of the Parameter's buffer, else None.

    Two calls returning the same data pointer while the first array is alive means no fresh
    host copy was made; together with the process-wide probe (writes visible to kernels) this
    makes in-place numpy writes safe.
    """
    first = param.asnumpy()
    if not first.flags.writeable or first.size == 0:
        return None
    again = param.asnumpy()
    if first.__array_interface__["data"][0] != again.__array_interface__["data"][0]:
        return None
    return first


def scale_in_place(master: Parameter, factor: float) -> None:
    """master *= factor, in place.

    On CPU ``asnumpy()`` of a Parameter is a view of its buffer, so a numpy in-place multiply
    costs one read and one write (~0.3 ns/param) with no MindSpore kernel or allocation.
    Where it is not a view (device memory) the result is written by ``set_data``.
    """
    if factor == 1.0:
        return
    scale_many_in_place([master], factor)


_ALIASES: Dict[str, bool] = {}


def numpy_view_aliases_storage(low_precision: bool = False) -> bool:
    """Probe once per process whether ``Parameter.asnumpy()`` aliases the Parameter's
    storage (true on CPU): a write through the view must be visible to later kernels.
    ``low_precision`` probes bf16 and fp16 Parameters (MindSpore registers a numpy bfloat16)."""
    key = "low" if low_precision else "fp32"
    if key not in _ALIASES:
        dtypes = (ms.bfloat16, ms.float16) if low_precision else (ms.float32,)
        ok = True
        for dtype in dtypes:
            try:
                probe = Parameter(Tensor(np.zeros(4, np.float32)).astype(dtype), name="probe")
                view = probe.asnumpy()
                ok = ok and bool(view.flags.writeable)
                if ok:
                    view[0] = 1.0
                    ok = bool((probe * 1).astype(ms.float32).asnumpy()[0] == 1.0)
            except (TypeError, ValueError, RuntimeError):
                ok = False
        _ALIASES[key] = ok
    return _ALIASES[key]


def host_address(tensor) -> int:
    """The address of ``tensor``'s fp32 host storage, 0 when it is not fp32 or is strided.

    Meaningful where :func:`numpy_view_aliases_storage` holds (CPU): there ``data_ptr()`` is
    the address ``asnumpy()`` views (tested), at ~0.3 us against ~5 us for ``asnumpy()``.
    Kernels still queued on the tensor are the caller's to wait for."""
    if tensor.dtype != ms.float32 or not tensor.is_contiguous():
        return 0
    return int(tensor.data_ptr() or 0)


def array_address(array: np.ndarray) -> int:
    """The address of a numpy array's first element."""
    return array.__array_interface__["data"][0]


def host_threads() -> int:
    """MindSpore's CPU runtime thread count (``runtime_num_threads``), capped by the cores:
    host kernels use as many threads as MindSpore's own CPU kernels."""
    cores = os.cpu_count() or 1
    try:
        configured = int(ms.get_context("runtime_num_threads") or cores)
    except (TypeError, ValueError, RuntimeError):
        configured = cores
    return max(1, min(cores, configured))
