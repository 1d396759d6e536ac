"""``run_training(cfg, output_dir) -> exit code``: the main job behind ``run_mindformer.py``."""
from __future__ import annotations

import sys

__all__ = ["run_training", "choose_pynative_synchronize", "apply_pynative_synchronize"]


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


def run_training(cfg, output_dir: str, stream=None, overwrite: bool = False,
                 err_stream=None) -> int:
    """Train ``cfg`` (a RunConfig), writing metrics and checkpoints under ``output_dir``.

    Exit codes: 0 finished, stopped at ``training.stop_at_step`` or stopped by SIGTERM/SIGINT
    after saving; 1 the run failed (non-finite gradients, too many skipped steps, an unusable
    checkpoint; ``ERROR: ...`` on ``err_stream``, default stderr); configuration errors
    propagate as ``ConfigError`` (the CLI maps them to 2). ``overwrite``: see
    ``trainer/run_dir.py``.
    """
    import mindspore as ms
    from ..config.errors import ConfigError
    from .checkpoint import CheckpointError
    from .signals import StopRequest
    from .trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    # before any op runs: launch_blocking only takes full effect when set first
    apply_pynative_synchronize(choose_pynative_synchronize(cfg))
    out = stream or sys.stdout
    err = err_stream or (stream if stream is not None else sys.stderr)

    def say(text):
        out.write(text + "\n")
        out.flush()

    try:
        # the handlers go in before the (slow) build, so an early SIGTERM still exits cleanly
        with StopRequest(log=say) as stop:
            # the Trainer picks the data-parallel reducer itself under msrun
            trainer = Trainer(cfg, output_dir, stream=out, overwrite=overwrite)
            trainer.train(stop_request=stop)
    except ConfigError:
        raise
    except (CheckpointError, FloatingPointError) as exc:
        err.write(f"ERROR: {exc}\n")
        err.flush()
        return 1
    except RuntimeError as exc:
        if not str(exc).startswith("[SkipStepOnNaN]"):
            raise
        err.write(f"ERROR: {exc}\n")
        err.flush()
        return 1
    return 0
