"""`monitor:` section (upstream MindFormers' PyNative names). Behaviour: trainer/monitor.py.

* ``train_state``: what is written to ``metrics.jsonl`` each step, as upstream:
  ``local_loss`` the loss of every micro-batch, ``device_loss`` this rank's loss of the step,
  ``local_norm`` the gradient norm of every micro-batch and ``device_norm`` the accumulated
  gradient norm of the step, per parameter. A norm option is a bool (all parameters), a name
  pattern or a list of patterns (``fnmatch`` on the parameter name; a plain word matches as
  a substring, so ``embedding`` selects the embedding), or ``""``/False (off).
* ``health_checkpoint``: upstream's thresholds, range-checked. Upstream's PyNative trainer
  declares them and never reads them; they have no effect here either (the migration guide
  lists this).
* ``tensorboard``: a non-empty ``output_dir`` (older branches: ``tensorboard_dir``) writes the
  TensorBoard event files that ``logging.tensorboard: True`` writes (trainer/tensorboard.py: the
  scalars of every ``metrics.jsonl`` row) to that directory (a relative one under the run's
  ``--output_dir``), for the steps that are multiples of ``log_interval``, through a writer
  queue of ``queue_size`` events. :func:`tensorboard_target` resolves the two spellings and
  ``logging.tensorboard`` into one target.
* ``moe_monitor``: tokens-per-expert output is not implemented; only its off values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

from ..errors import ConfigError
from .compat.noop import require_noop
from .schema import Section, check_range

__all__ = ["MonitorConfig", "TrainStateConfig", "HealthCheckpointConfig", "TensorboardConfig",
           "MoeMonitorConfig", "norm_patterns", "TensorBoardTarget", "tensorboard_target"]

NormOption = Union[bool, str, List[str]]


def norm_patterns(option) -> Optional[List[str]]:
    """The parameter-name patterns of a norm option; None = off, [] = every parameter."""
    if option is True:
        return []
    if option is False or option == "" or option == []:
        return None
    return [option] if isinstance(option, str) else list(option)


@dataclass
class HealthCheckpointConfig(Section):
    embedding_local_norm_threshold: float = 100.0
    global_norm_skip_threshold: float = 100.0
    global_norm_skip_time: int = 10

    def validate(self, path: str) -> None:
        check_range(self.embedding_local_norm_threshold,
                    f"{path}.embedding_local_norm_threshold", lo=0, lo_open=True)
        check_range(self.global_norm_skip_threshold, f"{path}.global_norm_skip_threshold",
                    lo=0, lo_open=True)
        check_range(self.global_norm_skip_time, f"{path}.global_norm_skip_time", lo=1)


@dataclass
class TrainStateConfig(Section):
    local_norm: NormOption = ""
    local_loss: bool = False
    device_norm: NormOption = False
    device_loss: bool = False

    def validate(self, path: str) -> None:
        for name in ("local_norm", "device_norm"):
            pats = norm_patterns(getattr(self, name)) or []
            if any(not p for p in pats):
                raise ConfigError(f"{path}.{name}", "patterns must be non-empty strings")


@dataclass
class TensorboardConfig(Section):
    output_dir: str = ""
    log_interval: int = 1
    queue_size: int = 1000
    # older branches' spellings (r1.9)
    tensorboard_dir: str = ""
    tensorboard_log_interval: int = 1
    tensorboard_queue_size: int = 1000

    #: upstream spelling -> the older branches' spelling of the same field
    SPELLINGS = {"output_dir": "tensorboard_dir", "log_interval": "tensorboard_log_interval",
                 "queue_size": "tensorboard_queue_size"}

    def validate(self, path: str) -> None:
        for name in ("log_interval", "queue_size", "tensorboard_log_interval",
                     "tensorboard_queue_size"):
            check_range(getattr(self, name), f"{path}.{name}", lo=1)
        self.resolved(path)

    def resolved(self, path: str = "monitor.tensorboard") -> tuple:
        """``(output_dir, log_interval, queue_size)``: of each field, the spelling that is not at
        its default (so ``to_dict()``, which writes both, reloads the same); both spellings set
        to different values is a ConfigError."""
        out = []
        for new, old in self.SPELLINGS.items():
            a, b = getattr(self, new), getattr(self, old)
            default = getattr(type(self), new)
            if a != default and b != default and a != b:
                raise ConfigError(f"{path}.{old}", f"{b!r} disagrees with {new}: {a!r} (the "
                                                   "same field in two spellings: write one)")
            out.append(a if a != default else b)
        return tuple(out)


@dataclass
class MoeMonitorConfig(Section):
    save_tokens_per_expert_interval: Optional[int] = None
    target_layers: Optional[Union[int, List[int]]] = None

    def validate(self, path: str) -> None:
        require_noop(f"{path}.save_tokens_per_expert_interval",
                     self.save_tokens_per_expert_interval, (None,), "the tokens-per-expert monitor")


@dataclass(frozen=True)
class TensorBoardTarget:
    """Where and how often the trainer writes TensorBoard event files."""
    logdir: str          # absolute, or relative to the run's output directory
    log_interval: int    # steps that are multiples of it
    queue_size: int      # events the writer queues before it writes them out
    field: str           # the config field that asked for it (for error messages)


def tensorboard_target(monitor: "MonitorConfig", logging_tensorboard: bool
                       ) -> Optional[TensorBoardTarget]:
    """The TensorBoard output of a run: ``logging.tensorboard: True`` is ``<output_dir>/
    tensorboard`` every step; ``monitor.tensorboard.output_dir`` (or ``tensorboard_dir``) its
    own directory, interval and queue. Both asking for different directories is a ConfigError;
    None when neither is on."""
    logdir, interval, queue = monitor.tensorboard.resolved()
    if logdir:
        spelling = "output_dir" if logdir == monitor.tensorboard.output_dir else "tensorboard_dir"
        if logging_tensorboard and logdir.rstrip("/") != "tensorboard":
            raise ConfigError("logging.tensorboard",
                              f"True writes <output_dir>/tensorboard, but "
                              f"monitor.tensorboard.{spelling} asks for {logdir!r}: write one "
                              "of the two")
        return TensorBoardTarget(logdir, interval, queue, f"monitor.tensorboard.{spelling}")
    if logging_tensorboard:
        return TensorBoardTarget("tensorboard", 1, TensorboardConfig.queue_size,
                                 "logging.tensorboard")
    return None


@dataclass
class MonitorConfig(Section):
    health_checkpoint: HealthCheckpointConfig = field(default_factory=HealthCheckpointConfig)
    train_state: TrainStateConfig = field(default_factory=TrainStateConfig)
    tensorboard: TensorboardConfig = field(default_factory=TensorboardConfig)
    moe_monitor: MoeMonitorConfig = field(default_factory=MoeMonitorConfig)
