"""Gradient accumulation in one host C call per micro-batch (CPU).

Summing the micro-batches' gradients with MindSpore costs one eager ``Add`` per tensor,
~35-50 us of dispatch each on CPU whatever the tensor's size, and a new output per tensor and
micro-batch. ``bench/bench_accumulate.py`` at the mid GPT's 27 tensors (6.3M parameters),
2-core machine shared with other jobs, six runs, medians per step: 2 micro-batches 4.4-24 ms
with MindSpore's adds vs 3.6-20 ms here (0.8-5 ms saved), 4 micro-batches 14-59 ms vs 8-40 ms
(5-20 ms saved; from the third micro-batch the sums are added in place). On CPU a tensor's
``data_ptr()`` is the address of its host storage (``host_views.py`` probes that
``asnumpy()`` aliases it), so the C kernel in ``host_accumulate.c`` (built by
``optim/host/native.py``) adds every tensor of a micro-batch in one call.

The gradients autodiff returns are only read, never written (a gradient may be shared or
cached by autodiff). At the second micro-batch ONE flat fp32 numpy buffer is allocated for
all tensors, ``a + g`` is written into it, and its slices become the running sums as
``mindspore.from_numpy`` Tensors (zero-copy: their ``data_ptr()`` is the buffer's, so later
host kernels, the optimizer's included, see the same memory). From the third micro-batch on
the sums are added to in place. Element-wise fp32 addition rounds once per element, so the
sums are bit-identical to MindSpore's per-tensor adds (tested).

A tensor the kernel cannot take (not fp32, strided, no host storage) is summed by MindSpore,
as are all of them where :func:`host_add_kernel` is None (no C compiler,
``MFC_NATIVE_KERNELS=0``, device memory).
"""
from __future__ import annotations

import ctypes
import os
from typing import List, Optional, Sequence

import numpy as np
import mindspore as ms

from .kernels import HostKernelSlot, pointer_array, wait_before_host_access
from .views import array_address, host_address

__all__ = ["HostAddKernel", "GradientSum", "host_add_kernel", "host_add_unavailable_reason",
           "reset_host_add_kernel", "SOURCE"]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_accumulate.c")

_PTRS = ctypes.POINTER(ctypes.c_void_p)
_I64S = ctypes.POINTER(ctypes.c_int64)


class HostAddKernel:
    """``add(out, a, b, numel)``: ``out[t] = a[t] + b[t]`` over fp32 buffers given by address
    (``out[t]`` may equal ``a[t]``), in one C call; :meth:`scaled`: clipping's multiply."""

    def __init__(self, lib: ctypes.CDLL):
        fn = lib.mfc_add_many
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_int64, _PTRS, _PTRS, _PTRS, _I64S]
        self._fn = fn
        scale = lib.mfc_scale_many
        scale.restype = ctypes.c_int64
        scale.argtypes = [ctypes.c_int64, _PTRS, _PTRS, ctypes.c_float, _I64S]
        self._scale = scale

    def add(self, out: Sequence[int], a: Sequence[int], b: Sequence[int],
            numel: Sequence[int]) -> None:
        n = len(numel)
        if not n:
            return
        done = self._fn(n, *[pointer_array(kind) for kind in (out, a, b)],
                        (ctypes.c_int64 * n)(*numel))
        if done != sum(numel):  # a mismatch is a bug in the kernel or its binding
            raise RuntimeError(f"host add wrote {done} of {sum(numel)} elements")

    def scaled(self, tensors: Sequence, factor: float) -> Optional[List]:
        """``[t * factor ...]`` (None stays None) as slices of one new fp32 buffer, in one
        call; None, nothing computed, when a tensor is not a contiguous fp32 host tensor."""
        wait_before_host_access()
        live = [j for j, t in enumerate(tensors) if t is not None]
        addresses = [host_address(tensors[j]) for j in live]
        if not all(addresses):
            return None
        numel = [int(tensors[j].size) for j in live]
        offsets = np.cumsum([0] + numel).tolist()
        buffer = np.empty(offsets[-1], np.float32)
        out = [array_address(buffer) + 4 * off for off in offsets[:-1]]
        n = len(live)
        if n:
            done = self._scale(n, pointer_array(out), pointer_array(addresses), factor,
                               (ctypes.c_int64 * n)(*numel))
            if done != sum(numel):  # a mismatch is a bug in the kernel or its binding
                raise RuntimeError(f"host scale wrote {done} of {sum(numel)} elements")
        result: List = [None] * len(tensors)
        for k, j in enumerate(live):
            result[j] = ms.from_numpy(buffer[offsets[k]:offsets[k + 1]].reshape(
                tuple(tensors[j].shape)))
        return result


class GradientSum:
    """The running sum of the micro-batches' fp32 gradients: :meth:`add` once per
    micro-batch, then :attr:`sums` (aligned with the gradients). With a kernel, each
    :meth:`add` after the first is one host call (the module doc says how)."""

    def __init__(self, kernel: Optional[HostAddKernel] = None):
        self._kernel = kernel
        self.sums: Optional[List] = None
        self._owned: List[int] = []   # per tensor: the address of its sum in our buffer, or 0

    def add(self, grads: Sequence) -> None:
        if self.sums is None:
            self.sums = list(grads)
            self._owned = [0] * len(self.sums)
            return
        if len(grads) != len(self.sums):
            raise ValueError(f"{len(grads)} gradients for {len(self.sums)} running sums")
        if self._kernel is None:
            self.sums = [a + g for a, g in zip(self.sums, grads)]
            return
        wait_before_host_access()
        sums, owned = self.sums, self._owned
        g_addr = [host_address(g) for g in grads]
        numel = [int(g.size) for g in grads]
        in_place = [j for j, g in enumerate(g_addr) if g and owned[j]]
        fresh, a_fresh = [], []   # sums that move into a new buffer: autodiff's, MindSpore's
        for j, g in enumerate(g_addr):
            a = host_address(sums[j]) if g and not owned[j] else 0
            if a:
                fresh.append(j)
                a_fresh.append(a)
        offsets = np.cumsum([0] + [numel[j] for j in fresh]).tolist()
        buffer = np.empty(offsets[-1], np.float32)
        out_fresh = [array_address(buffer) + 4 * off for off in offsets[:-1]]
        self._kernel.add([owned[j] for j in in_place] + out_fresh,
                         [owned[j] for j in in_place] + a_fresh,
                         [g_addr[j] for j in in_place + fresh],
                         [numel[j] for j in in_place + fresh])
        for k, j in enumerate(fresh):
            view = buffer[offsets[k]:offsets[k + 1]]
            sums[j] = ms.from_numpy(view.reshape(tuple(grads[j].shape)))
            owned[j] = out_fresh[k]
        for j in sorted(set(range(len(grads))) - set(in_place) - set(fresh)):
            sums[j] = sums[j] + grads[j]   # a tensor the kernel cannot take: MindSpore's add
            owned[j] = 0


_SLOT = HostKernelSlot(SOURCE, HostAddKernel, ("mfc_add_many", "mfc_scale_many"))


def host_add_kernel() -> Optional[HostAddKernel]:
    """The process's host add kernel, or None where it cannot run (see the module doc)."""
    return _SLOT.get()


def host_add_unavailable_reason() -> str:
    """Why :func:`host_add_kernel` is None ('' when it is available)."""
    return _SLOT.unavailable_reason()


def reset_host_add_kernel() -> None:
    """Forget the process's kernel (tests switch ``MFC_NATIVE_KERNELS``)."""
    _SLOT.reset()
