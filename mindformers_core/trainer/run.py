"""``run_training(cfg, output_dir) -> exit code``: the main job behind ``run_mindformer.py``."""
from __future__ import annotations

import sys

__all__ = ["run_training", "choose_pynative_synchronize", "apply_pynative_synchronize"]


def choose_pynative_synchronize(cfg) -> bool:  # noqa: ARG001 - kept for per-config policies
    """Whether PyNative should dispatch synchronously: True on CPU, False elsewhere.

    Measured (MindSpore 2.10 CPU, 2 shared cores, tiny GPT of the trainer tests, forward +
    backward of 2 micro-batches): asynchronous dispatch 1.35-1.6 s per step, synchronous
    0.035 s per step. On CPU the asynchronous queue costs milliseconds per dependent op and
    the kernels of small models are far cheaper than that, so synchronous dispatch is the
    faster default. On Ascend/GPU the asynchronous queue overlaps host and device work.
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


def _grad_reducer():
    """The data-parallel reducer under msrun with more than one worker; else the identity."""
    from ..distributed.env import env_world_size, launched_by_msrun
    if launched_by_msrun() and env_world_size() > 1:
        from ..distributed.setup import setup_data_parallel
        return setup_data_parallel()
    return None


def run_training(cfg, output_dir: str, stream=None) -> int:
    """Train ``cfg`` (a RunConfig), writing metrics and checkpoints under ``output_dir``.

    Exit codes: 0 finished, stopped at ``training.stop_at_step`` or stopped by SIGTERM/SIGINT
    after saving; 1 the run failed (non-finite gradients, too many skipped steps, an unusable
    checkpoint); configuration errors propagate as ``ConfigError`` (the CLI maps them to 2).
    """
    import mindspore as ms
    from ..config.errors import ConfigError
    from .checkpoint import CheckpointError
    from .trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    out = stream or sys.stdout
    try:
        trainer = Trainer(cfg, output_dir, stream=out, grad_reducer=_grad_reducer())
        trainer.train()
    except ConfigError:
        raise
    except (CheckpointError, FloatingPointError) as exc:
        out.write(f"ERROR: {exc}\n")
        out.flush()
        return 1
    except RuntimeError as exc:
        if not str(exc).startswith("[SkipStepOnNaN]"):
            raise
        out.write(f"ERROR: {exc}\n")
        out.flush()
        return 1
    return 0
