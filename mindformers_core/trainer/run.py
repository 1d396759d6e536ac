"""``run_training(cfg, output_dir) -> exit code``: the main job behind ``run_mindformer.py``."""
from __future__ import annotations

import sys

from .pynative import apply_pynative_synchronize, choose_pynative_synchronize

__all__ = ["run_training", "choose_pynative_synchronize", "apply_pynative_synchronize"]


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
    from ..errors import ConfigError
    from ..checkpoint.store import CheckpointError
    from .context import apply_context
    from .signals import StopRequest
    from .trainer import Trainer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    apply_context(cfg)  # context: device, memory limit, deterministic kernels
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
            # the Trainer picks the data-parallel reducer itself under msrun; the run plan
            # (world size from the launch environment) and the LR schedule are computed once
            # here and handed over
            trainer = Trainer(cfg, output_dir, stream=out, overwrite=overwrite,
                              plan=cfg.plan(), lr_scheduler=cfg.build_lr_scheduler())
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
