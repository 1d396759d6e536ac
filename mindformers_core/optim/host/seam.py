"""The one choice of CPU host kernels, made when the optimizer is built.

The host C kernels (``optim/host/adam.py``, ``norm.py``, ``accumulate.py``: Adam, the
gradient norm, gradient accumulation and clipping's scale) each run where their library
loads (``native.py``) and tensors live in host memory (``views.py``), else MindSpore's ops
do the same work. :func:`select_host_kernels` asks once, at ``optim.build.build_optimizer``,
which of them run, and :func:`host_kernels` hands that one :class:`HostKernels` to every
consumer (``update_rules.AdamRule``, ``clip_grad``, ``trainer/accumulate.py``,
``distributed/pipeline_stage.py``), so no consumer probes on its own and the run's log says
in one line (:meth:`HostKernels.describe`) which path runs and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from . import native
from .accumulate import HostAddKernel, host_add_kernel, host_add_unavailable_reason
from .adam import HostAdamKernel, host_adam_kernel, host_adam_unavailable_reason
from .kernels import slot_generation
from .norm import host_norm_unavailable_reason, host_sq_norm
from .views import numpy_view_aliases_storage

__all__ = ["HostKernelChoice", "HostKernels", "select_host_kernels", "host_kernels",
           "KERNEL_NAMES"]

#: the kernels of the choice, in the order the log line names them
KERNEL_NAMES = ("Adam", "norm", "accumulate", "scale")


class HostKernelChoice(Protocol):
    """What the consumers of the host kernels read: a kernel, or None for MindSpore's path."""

    #: many tensors' fused Adam step in one call (``AdamRule.fused_many``)
    adam: Optional[HostAdamKernel]
    #: the micro-batch adder of ``GradientSum`` (None: MindSpore's adds)
    accumulate: Optional[HostAddKernel]

    def sq_norm(self, tensors: Sequence) -> Optional[float]:
        """Sum of squares of ``tensors`` in one host call, or None (MindSpore's norm)."""

    def scaled(self, tensors: Sequence, factor: float) -> Optional[List]:
        """``[t * factor ...]`` in one host call, or None (MindSpore's multiply)."""

    def describe(self) -> Optional[str]:
        """The run's one log line on which path runs and why (None off CPU)."""


@dataclass(frozen=True)
class HostKernels:
    """The chosen kernels (:class:`HostKernelChoice`) and, per kernel MindSpore runs, why."""

    adam: Optional[HostAdamKernel]
    norm: bool
    accumulate: Optional[HostAddKernel]
    #: kernel name (:data:`KERNEL_NAMES`) -> why MindSpore's ops run it
    fallbacks: Dict[str, str] = field(default_factory=dict)
    #: what the kernel cache noted (``native.cache_notes``)
    notes: Tuple[str, ...] = ()
    host_memory: bool = True

    def sq_norm(self, tensors: Sequence) -> Optional[float]:
        return host_sq_norm(tensors) if self.norm else None

    def scaled(self, tensors: Sequence, factor: float) -> Optional[List]:
        return self.accumulate.scaled(tensors, factor) if self.accumulate is not None \
            else None

    def describe(self) -> Optional[str]:
        if not self.host_memory:
            return None   # device memory: MindSpore's kernels, as always there
        host = [k for k in KERNEL_NAMES if k not in self.fallbacks]
        parts = []
        if host:
            parts.append(f"{', '.join(host)} in host C (optim/host)")
        by_reason: Dict[str, List[str]] = {}
        for name, why in self.fallbacks.items():
            by_reason.setdefault(why, []).append(name)
        if by_reason:
            parts.append("MindSpore fallback for " + "; ".join(
                f"{', '.join(names)} ({why})" for why, names in by_reason.items()))
        return "host kernels     : " + "; ".join(parts + list(self.notes))


_CHOICE: List[Tuple[int, HostKernels]] = []


def select_host_kernels() -> HostKernels:
    """Load (or decline) every host kernel once and make that the process's choice."""
    adam, accumulate = host_adam_kernel(), host_add_kernel()
    norm = not host_norm_unavailable_reason()
    fallbacks = {}
    for name, ok, reason in (("Adam", adam is not None, host_adam_unavailable_reason),
                             ("norm", norm, host_norm_unavailable_reason),
                             ("accumulate", accumulate is not None, host_add_unavailable_reason),
                             ("scale", accumulate is not None, host_add_unavailable_reason)):
        if not ok:
            fallbacks[name] = reason()
    choice = HostKernels(adam, norm, accumulate, fallbacks, tuple(native.cache_notes()),
                         numpy_view_aliases_storage())
    _CHOICE[:] = [(slot_generation(), choice)]
    return choice


def host_kernels() -> HostKernels:
    """The process's choice (made at optimizer build; made now if no optimizer was built, or
    again after a test reset a kernel)."""
    if not _CHOICE or _CHOICE[0][0] != slot_generation():
        return select_host_kernels()
    return _CHOICE[0][1]
