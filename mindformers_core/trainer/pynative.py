"""PyNative dispatch mode of a run: synchronous on CPU, asynchronous elsewhere.

Used by ``trainer.run`` (before the first op of a job) and by the trainer itself (a Trainer
built directly); the tools re-use it through ``trainer.run``.
"""
from __future__ import annotations

__all__ = ["choose_pynative_synchronize", "apply_pynative_synchronize"]


def choose_pynative_synchronize(cfg) -> bool:  # noqa: ARG001 - kept for per-config policies
    """Whether PyNative should dispatch synchronously: True on CPU, False elsewhere.

    Measured on MindSpore 2.10 CPU (2 cores shared with other jobs, so absolute numbers are
    noisy; the ratio is not):

    * tiny GPT of the trainer tests, forward + backward of 2 micro-batches:
      asynchronous 1.35-1.6 s, synchronous 0.035 s;
    * ``configs/quickstart.yaml``, 25 steps, median step time (steps 6-25):
      asynchronous 4.9 s / 3.2 s, synchronous 0.61 s / 0.32 s (two runs each);
      wall time 116 s / 93 s vs 23 s / 9 s.

    On CPU the asynchronous queue costs milliseconds per dependent op, far more than the
    kernels of small models, so synchronous dispatch is the default there. On Ascend/GPU the
    queue overlaps host and device work, so it stays asynchronous.

    The switch must happen before the first MindSpore op of the process: set later, it only
    partly takes effect (measured: 1.2-2 s instead of 0.13 s per step).
    """
    import mindspore as ms
    return ms.get_context("device_target") == "CPU"


_LAUNCH_BLOCKING = False


def apply_pynative_synchronize(enabled: bool) -> None:
    """Turn on synchronous dispatch (``mindspore.runtime.launch_blocking()``, the
    non-deprecated form of ``set_context(pynative_synchronize=True)``). MindSpore offers no way
    to turn it off again in the same process, so ``False`` leaves the current mode."""
    global _LAUNCH_BLOCKING
    if enabled and not _LAUNCH_BLOCKING:
        import mindspore as ms
        ms.runtime.launch_blocking()
        _LAUNCH_BLOCKING = True
