"""Optimizer state kept in host memory between steps (``optimizer.enable_cpu_offload``).

The moments of a parameter group are moved to the device for the group's update and back to
host memory right after it (``Tensor.move_to``, MindSpore 2.10, PyNative only, blocking
copies), so between steps the device holds none of them. It is a wrapper around an update,
not a second copy of the update math: ``AdamW._step_group`` runs its usual update inside
:meth:`HostStateOffload.on_device`.

On CPU the state is in host memory already, so ``enable_cpu_offload`` needs no copies there
(:func:`cpu_offload_for` returns None). The same code path runs on CPU with host == device
(``HostStateOffload(device="CPU")``); the tests use that to check that the moves change no
bit. The fp32 masters of low-precision parameters stay on the device: upstream's offload
covers the optimizer's moments.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import mindspore as ms
from mindspore import Parameter

__all__ = ["HostStateOffload", "cpu_offload_for", "check_offload_context", "DEVICES"]

#: the names ``Tensor.move_to`` accepts
DEVICES = ("Ascend", "GPU", "CPU")


def check_offload_context(device: str, mode: int) -> None:
    """Raise ValueError when state cannot be moved between host and ``device`` in ``mode``."""
    if device not in DEVICES:
        raise ValueError(f"enable_cpu_offload: unknown device '{device}'; expected one of "
                         f"{list(DEVICES)}")
    if mode != ms.PYNATIVE_MODE:
        raise ValueError("enable_cpu_offload needs PyNative mode (mode: 1): MindSpore's "
                         "Tensor.move_to copies between host and device only in PyNative")


class HostStateOffload:
    """Moves optimizer state tensors between host memory (``host``) and ``device``.

    Args:
        device: where the update runs (``"Ascend"``, ``"GPU"``, or ``"CPU"`` to run the
            same path without a device).
        host: where the state waits between steps.
    """

    def __init__(self, device: str, host: str = "CPU"):
        check_offload_context(device, ms.get_context("mode"))
        check_offload_context(host, ms.get_context("mode"))
        self.device = device
        self.host = host

    @staticmethod
    def _move(tensors: Sequence[Parameter], where: str) -> None:
        for t in tensors:
            t.set_data(t.move_to(where, blocking=True))

    def park(self, tensors: Sequence[Parameter]) -> None:
        """Move ``tensors`` to host memory."""
        self._move(tensors, self.host)

    def fetch(self, tensors: Sequence[Parameter]) -> None:
        """Move ``tensors`` to the device."""
        self._move(tensors, self.device)

    @contextmanager
    def on_device(self, tensors: Sequence[Parameter]) -> Iterator[None]:
        """``tensors`` on the device inside the block, in host memory after it (also when
        the block raises)."""
        self.fetch(tensors)
        try:
            yield
        finally:
            self.park(tensors)


def cpu_offload_for(enable: bool, device_target: str) -> Optional[HostStateOffload]:
    """The offload of ``enable_cpu_offload`` on ``device_target``: None when it is off, or on
    CPU, where the state lives in host memory already."""
    if not enable or device_target == "CPU":
        return None
    return HostStateOffload(device_target)
