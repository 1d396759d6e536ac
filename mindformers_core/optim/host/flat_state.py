"""A group's Adam update in few kernel launches: small tensors packed into flat buffers (CPU).

This is the fallback of the host Adam kernel (``host_adam``: the whole group in one C call),
for CPU processes where that kernel cannot be built (no C compiler, ``MFC_NATIVE_KERNELS=0``)
or with ``AdamW(host_kernel=False)``.

MindSpore's fused ``ops.Adam`` CPU kernel streams at ~0.6 ns/param on one thread for a large
tensor, but each eager launch costs ~90 us in synchronous PyNative (the trainer's CPU mode),
and a compiled group graph (``fused_adam``) is no cure: ~75 us per kernel on a quiet machine,
and on a loaded one the graph's runtime slowed ~10x while eager launches slowed ~2x
(measured, MindSpore 2.10, 2 cores shared with other jobs). A GPT has a few dozen tensors per
10M parameters, so per-tensor launches cost about as much as the arithmetic.

So a group is split by size. A tensor of at least :data:`PACK_MAX_NUMEL` elements gets its own
launch (the launch costs less than copying it would). The smaller ones share one
launch over flat buffers: each kind (master, exp_avg, exp_avg_sq) gets one numpy-owned fp32
buffer. The optimizer's own tensors (moments, the fp32 masters of bf16 parameters) are
re-pointed at their slices for good (``set_data(mindspore.from_numpy(slice))`` shares the
memory on CPU, where ``asnumpy()`` aliases storage: ``host_views``). A model's fp32 parameter
is its own master, but it is never re-pointed: a compiled graph that reads it (``training.jit``)
keeps using the buffer it was compiled with (measured: after ``set_data`` a jit function still
read the old values). Its values are copied into the buffer before the launch and back after
it, as the gradients are copied in: cheap for small tensors, which is all that is packed.

The buffers are numpy arrays and each re-pointed Parameter holds a view of one, so the memory
lives as long as any Parameter uses it. When something replaces a member's data (a checkpoint
load ``set_data``s the model's parameters and the moments), its data no longer lies in the
buffer; :meth:`FlatGroupBuffers.ensure_attached` sees that before each step and copies the new
values in. The kernel is element-wise, so packed and per-tensor launches give the same bits
(tested).
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import mindspore as ms
from mindspore import Parameter

from .views import array_address
from ..main_params import wait_for_kernels

__all__ = ["FlatGroupBuffers", "FlatAdamGroup", "PACK_MAX_NUMEL", "worth_packing",
           "synchronous_dispatch"]

#: tensors below this many elements are packed; measured on the 2-core CPU: an eager launch
#: (~90 us) costs about as much as the three copies (gradient in, fp32 parameter in and out)
#: of 2^16 fp32 elements; at 10M GPT parameters 2^16 gave 1.53 ns/param against 1.78-1.94
#: with 2^18 (loaded machine, same run)
PACK_MAX_NUMEL = 1 << 16


def worth_packing(sizes: Sequence[int]) -> bool:
    """True when at least two tensors of a group are small enough to share a launch."""
    return sum(1 for n in sizes if n < PACK_MAX_NUMEL) >= 2


def synchronous_dispatch() -> bool:
    """Whether PyNative runs ops synchronously (``mindspore.runtime.launch_blocking()``, the
    trainer's CPU mode: ``trainer/pynative.py``). Packing pays only there: with asynchronous
    dispatch eager launches overlap the kernels and the compiled group graph was ~2x faster
    than the packed launches (their host syncs serialise). MindSpore 2.10 has no public
    getter; its runtime configuration's ``is_launch_blocking`` is read when present, else the
    deprecated context flag."""
    try:
        from mindspore._c_expression import RuntimeConf
        return bool(RuntimeConf.get_instance().is_launch_blocking())
    except (ImportError, AttributeError):
        return bool(ms.get_context("pynative_synchronize"))


class FlatGroupBuffers:
    """One flat fp32 buffer per member kind (e.g. masters, exp_avg, exp_avg_sq) and one for
    the gradients; every member Parameter is re-pointed at its slice, except the ``copied``
    ones (model parameters), whose values :meth:`copy_in` / :meth:`copy_out` move instead.

    Args:
        members: per kind, Parameters in the same order and of the same shapes.
        name: suffix of the flat Parameters' names (``flat_<k>.<name>``).
        copied: ``(k, j)`` pairs of members that keep their own storage.
    """

    def __init__(self, members: Sequence[Sequence[Parameter]], name: str, copied=()):
        self.shapes = [tuple(p.shape) for p in members[0]]
        self.offsets = np.concatenate(
            [[0], np.cumsum([int(np.prod(s)) for s in self.shapes])]).astype(np.int64).tolist()
        self.host: List[np.ndarray] = [np.zeros(self.offsets[-1], np.float32)
                                       for _ in range(len(members) + 1)]
        self.flat: List[Parameter] = []
        for k, buf in enumerate(self.host[:-1]):
            p = Parameter(ms.Tensor(np.zeros(1, np.float32)), name=f"flat_{k}.{name}",
                          requires_grad=False)
            p.set_data(ms.from_numpy(buf))
            self.flat.append(p)
        self.grad = ms.from_numpy(self.host[-1])  # a plain Tensor sharing the buffer
        self.copied = sorted(set(copied))
        self._addresses = [[0] * len(self.shapes) for _ in members]
        for k, kind in enumerate(members):
            for j, param in enumerate(kind):
                if (k, j) not in self.copied:
                    self._attach(k, j, param)

    def _slice(self, k: int, j: int) -> np.ndarray:
        return self.host[k][self.offsets[j]:self.offsets[j + 1]]

    def _attach(self, k: int, j: int, param: Parameter) -> None:
        """Copy ``param``'s current values into its slice and re-point it there."""
        view = self._slice(k, j)
        np.copyto(view, param.asnumpy().reshape(-1))
        param.set_data(ms.from_numpy(view.reshape(self.shapes[j])))
        self._addresses[k][j] = array_address(view)

    def ensure_attached(self, members: Sequence[Sequence[Parameter]]) -> None:
        """Re-attach every member whose data was replaced since it was attached."""
        for k, kind in enumerate(members):
            for j, param in enumerate(kind):
                if (self._addresses[k][j] and
                        array_address(param.asnumpy()) != self._addresses[k][j]):
                    self._attach(k, j, param)

    def copy_in(self, members: Sequence[Sequence[Parameter]]) -> None:
        """The ``copied`` members' values into their slices."""
        for k, j in self.copied:
            np.copyto(self._slice(k, j), members[k][j].asnumpy().reshape(-1))

    def copy_out(self, members: Sequence[Sequence[Parameter]]) -> None:
        """The slices back into the ``copied`` members' own buffers (aliased views)."""
        for k, j in self.copied:
            np.copyto(members[k][j].asnumpy().reshape(-1), self._slice(k, j))

    def load_grads(self, grads: Sequence) -> None:
        """Copy the members' gradients (fp32 Tensors, in member order) into :attr:`grad`."""
        wait_for_kernels()  # (asynchronous dispatch) the last launch may still read it
        k = len(self.host) - 1
        for j, g in enumerate(grads):
            np.copyto(self._slice(k, j), g.asnumpy().reshape(-1))


class FlatAdamGroup:
    """A group's Adam kernels: one launch per large tensor, one for the packed small ones.

    ``cell(grads, zero, lr_t, b1, b2, eps_t, decay)`` as ``fused_adam.FusedAdamGroup`` (the
    caller applies the decay: ``decay_in_graph`` is False); ``bound`` is the group's
    (masters, exp_avg, exp_avg_sq), which the caller compares by identity every step;
    masters that are ``model_params`` themselves (fp32 parameters) are copied, not re-pointed.
    """

    decay_in_graph = False

    def __init__(self, bound, kernel, name: str, model_params: Sequence[Parameter]):
        self.bound = bound
        self.kernel = kernel
        sizes = [int(m.size) for m in bound[0]]
        self.small = [j for j, n in enumerate(sizes) if n < PACK_MAX_NUMEL]
        self.large = [j for j, n in enumerate(sizes) if n >= PACK_MAX_NUMEL]
        self.packed = tuple([kind[j] for j in self.small] for kind in bound)
        copied = [(0, s) for s, j in enumerate(self.small) if bound[0][j] is model_params[j]]
        self.buffers = FlatGroupBuffers(self.packed, name, copied)

    def __call__(self, grads, zero, lr_t, b1, b2, eps_t, decay=None):  # noqa: ARG002
        masters, exp_avg, exp_avg_sq = self.bound
        for j in self.large:
            self.kernel(masters[j], exp_avg[j], exp_avg_sq[j], zero, zero, lr_t, b1, b2,
                        eps_t, grads[j])
        self.buffers.ensure_attached(self.packed)
        self.buffers.load_grads([grads[j] for j in self.small])
        self.buffers.copy_in(self.packed)
        self.kernel(*self.buffers.flat, zero, zero, lr_t, b1, b2, eps_t, self.buffers.grad)
        wait_for_kernels()
        self.buffers.copy_out(self.packed)
        return zero
