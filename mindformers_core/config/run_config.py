"""`RunConfig`: every section of a run, loading from YAML/dict with overrides, and the plan.

``load_config(path_or_dict, overrides=[...])``:

1. reads the YAML (``1e-5`` is a float) or copies the dict,
2. applies each override ``"a.b.c=value"`` (value parsed as YAML) to the raw tree,
3. builds every section strictly (unknown sections/keys, types, ranges),
4. checks cross-section rules: the LR schedule against ``training.steps`` (``core.lr``), data
   parallel size and gradient accumulation divisibility, Muon's MLA requirement.

``RunConfig.to_dict()`` is the config as a user would write it (defaults filled in; reloading
gives an equal config). Derived values are in ``RunConfig.plan()`` only:

    data_parallel          = world_size // (tensor_parallel * pipeline_parallel * context_parallel)
    num_accumulation_steps = global_batch_size // (local_batch_size * data_parallel)  (exact)
    tokens_per_step        = global_batch_size * model.seq_length
"""
from __future__ import annotations

import copy
import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Union

import yaml

from .compat.callbacks import CallbacksConfig
from .checkpoint import CheckpointConfig
from .context import ContextConfig, check_context_vs_training
from .pipeline import check_pipeline_vs_model, check_pipeline_vs_plan
from .dataset import DatasetConfig
from ..core.parallel_dims import ParallelDims, fsdp_ranks, make_mesh
from ..errors import ConfigError
from .logging import LoggingConfig
from .lr_scheduler import ABSENT_LR_SCHEDULER, LrSchedulerConfig
from .model import ModelConfig
from .moe import dispatcher_into_model
from .monitor import MonitorConfig, TensorBoardTarget, tensorboard_target
from .compat.disabled_sections import LoraConfig, RecomputeCommConfig, SwapConfig
from .optimizer import OptimizerConfig
from .compat.megatron_loader import check_loader_vs_model
from .corpus_rules import check_eval_documents
from .expert_layout import ExpertPlan, check_expert_parallel, expert_plan
from .layout import check_layout, parallel_steps
from .parallelism import ParallelismConfig
from .profiler import ProfilerConfig
from .recompute import RecomputeConfig
from .shard_strategy import gradient_division_problem, sharded_parameter_problem
from .context_parallel_rules import check_context_parallel
from .tensor_parallel_rules import check_tensor_parallel
from .schema import Section, type_hints, type_name, unknown_key_error
from .tokenizer import TokenizerConfig, check_text_sections
from .training import TrainingConfig
from .compat.upstream_names import spelling_in_use
from .strict_yaml import load_strict_yaml

__all__ = ["RunConfig", "RunPlan", "load_config", "apply_overrides", "DEFAULTED_SECTIONS"]

WORLD_OF_LAYOUT = (" (parallelism.tensor_parallel, parallelism.pipeline_parallel and "
                   "parallelism.context_parallel against the launcher's worker count)")
#: where data_parallel comes from, for a batch rule a layout breaks (config/layout.py: every
#: refusal of a layout names a parallelism field)
DP_OF_LAYOUT = (" (data_parallel = world_size / (parallelism.tensor_parallel * "
                "parallelism.pipeline_parallel * parallelism.context_parallel))")
#: sections upstream's ``TrainConfig`` defaults: an absent one is built from this mapping (each
#: field then takes its section's default; ``lr_scheduler``'s type: config/lr_scheduler.py)
DEFAULTED_SECTIONS = {"training": {}, "optimizer": {}, "lr_scheduler": ABSENT_LR_SCHEDULER}
#: upstream MindFormers' PyNative sections, written back by to_dict() only when given
UPSTREAM_SECTIONS = ("monitor", "profiler", "context", "callbacks", "recompute", "recompute_comm",
                     "swap", "lora_config")


@dataclass
class RunPlan:
    """Values derived from a config and the launcher's world size (never part of to_dict)."""
    world_size: int
    data_parallel: int
    local_batch_size: int
    global_batch_size: int
    num_accumulation_steps: int
    total_steps: int
    warmup_steps: int
    seq_length: int
    tokens_per_step: int
    decay_start_steps: Optional[int] = None
    decay_steps: Optional[int] = None
    #: every boundary the schedule reports (``sched.boundaries()``), for plots and the doctor
    lr_boundaries: Dict[str, int] = field(default_factory=dict)
    lr_scheduler_type: str = ""
    peak_lr: float = 0.0
    optimizer_type: str = ""
    #: experts per expert-parallel rank (config/expert_layout.py); None without routed experts
    experts: Optional[ExpertPlan] = None
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    #: the run's ParallelDims (core/parallel_dims.py), checked by config/layout.py
    dims: Optional[ParallelDims] = None

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def format(self) -> str:
        """Human-readable summary for ``run_mindformer.py --check``."""
        lines = [
            f"optimizer        : {self.optimizer_type}",
            f"lr_scheduler     : {self.lr_scheduler_type} (peak lr {self.peak_lr:g})",
            f"steps            : {self.total_steps}",
            f"warmup steps     : {self.warmup_steps}",
        ]
        if self.decay_start_steps is not None:
            lines.append(f"decay start step : {self.decay_start_steps}")
        if self.decay_steps is not None:
            lines.append(f"decay steps      : {self.decay_steps}")
        extra = {k: v for k, v in self.lr_boundaries.items()
                 if k not in ("warmup_steps", "warmup_end", "decay_start", "decay_start_steps",
                              "decay_steps")}
        if extra:
            lines.append(f"lr boundaries    : {extra}")
        lines += [
            f"world size       : {self.world_size}",
            f"data parallel    : {self.data_parallel}",
            f"tensor parallel  : {self.tensor_parallel}"
            + (" (sequence parallel)" if self.sequence_parallel else ""),
            f"local batch      : {self.local_batch_size}",
            f"accumulation     : {self.num_accumulation_steps}",
            f"global batch     : {self.global_batch_size} "
            f"(= {self.local_batch_size} x {self.data_parallel} x {self.num_accumulation_steps})",
            f"tokens per step  : {self.tokens_per_step} (seq_length {self.seq_length})",
        ]
        if self.dims is not None and self.dims.world > 1:
            lines.append(f"parallel layout  : {self.dims.describe()}")
        if self.experts is not None:
            lines.append(self.experts.format())
        return "\n".join(lines)


def _absent(name: str):
    """The field default of a section of DEFAULTED_SECTIONS: the section built from its
    absent-section mapping."""
    def build():
        return RunConfig.section_types()[name].from_dict(copy.deepcopy(DEFAULTED_SECTIONS[name]),
                                                         name)
    return field(default_factory=build)


@dataclass
class RunConfig(Section):
    training: TrainingConfig = _absent("training")
    optimizer: OptimizerConfig = _absent("optimizer")
    lr_scheduler: LrSchedulerConfig = _absent("lr_scheduler")
    model: ModelConfig = field(default_factory=ModelConfig)
    train_dataset: DatasetConfig = field(default_factory=DatasetConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # upstream MindFormers' PyNative sections
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    recompute_comm: RecomputeCommConfig = field(default_factory=RecomputeCommConfig)
    swap: SwapConfig = field(default_factory=SwapConfig)
    lora_config: LoraConfig = field(default_factory=LoraConfig)
    # optional sections: None when absent (held-out corpus, text tokenizer)
    eval_dataset: Optional[DatasetConfig] = None
    tokenizer: Optional[TokenizerConfig] = None
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @classmethod
    def section_types(cls) -> Dict[str, type]:
        """Section name -> its Section class, read from the field declarations above (an
        optional section's ``Optional[X]`` is X)."""
        hints = type_hints(cls)
        out = {}
        for name in cls.field_names():
            args = [a for a in typing.get_args(hints[name]) if a is not type(None)]
            out[name] = args[0] if args else hints[name]
        return out

    @classmethod
    def from_dict(cls, data: Any, path: str = ""):
        if isinstance(data, cls):
            data = data.to_dict()
        if not isinstance(data, dict):
            raise ConfigError("config", f"expected a mapping of sections, got "
                                        f"{type_name(data)}")
        names = cls.field_names()
        for key in data:
            if key not in names:
                raise unknown_key_error("", key, names, what="section")
        data = dispatcher_into_model(data)   # parallelism's spelling of it (config/moe.py)
        kwargs = {}
        # sections are built in field order, so the first error is deterministic; an absent
        # section of DEFAULTED_SECTIONS comes from the field default
        section_types = cls.section_types()
        for name in names:
            if data.get(name) is not None:
                kwargs[name] = section_types[name].from_dict(data[name], name)
        obj = cls(**kwargs)
        object.__setattr__(obj, "_explicit", frozenset(data.keys()))
        object.__setattr__(obj, "_defaulted", tuple(n for n in DEFAULTED_SECTIONS
                                                    if data.get(n) is None))
        obj.validate(path)
        return obj

    def validate(self, path: str = "") -> None:
        self._check_optimizer_vs_model()
        check_expert_parallel(self)   # experts vs expert_parallel, whatever the world size
        check_context_vs_training(self.context, self.training)
        check_text_sections(self)
        for name in ("train_dataset", "eval_dataset"):   # config/compat/megatron_loader.py
            if getattr(self, name) is not None:
                check_loader_vs_model(getattr(self, name), self.model.seq_length, name)
        if self.eval_dataset is not None:   # one document masking (config/corpus_rules.py)
            check_eval_documents(self.train_dataset, self.eval_dataset)
        self._check_recompute_vs_jit()
        self.tensorboard_target()   # logging.tensorboard vs monitor.tensorboard (config/monitor.py)
        check_pipeline_vs_model(self.parallelism, self.model)   # config/pipeline.py
        check_context_parallel(self)   # cp > 1: seq_length, ulysses heads (context_parallel_rules)
        self.plan()  # schedule against training.steps, data parallel, accumulation
        check_tensor_parallel(self)   # tp > 1: sequence parallel, sizes (tensor_parallel_rules)

    def tensorboard_target(self) -> Optional[TensorBoardTarget]:
        """Where the run writes TensorBoard event files (``logging.tensorboard`` or upstream's
        ``monitor.tensorboard``), None when it does not."""
        return tensorboard_target(self.monitor, self.logging.tensorboard)

    def defaulted_sections(self) -> tuple:
        """The sections of DEFAULTED_SECTIONS the user did not write (they hold the defaults)."""
        return getattr(self, "_defaulted", ())

    def format_defaulted_sections(self) -> str:
        """For ``--check``: the note naming the defaulted sections and their resolved values
        ("" when every one was written)."""
        names = self.defaulted_sections()
        if not names:
            return ""
        lines = [f"defaulted        : {', '.join(names)} (absent from the config: upstream "
                 "MindFormers' defaults)"]
        for name in names:
            values = ", ".join(f"{k}: {v}" for k, v in getattr(self, name).to_dict().items())
            lines.append(f"  {name}: {{{values}}}")
        return "\n".join(lines)

    def recompute_layers(self) -> list:
        """The decoder layers ``recompute:`` selects (ConfigError naming the field)."""
        return self.recompute.layers(self.model.num_layers)

    def recompute_modules(self) -> dict:
        """``{layer: parts}`` that ``recompute: {mode: select}`` selects (ConfigError naming
        the field)."""
        return self.recompute.modules(self.model.num_layers)

    def model_jit_mode(self) -> str:
        """How the model's layers run: ``training.jit``, except that recomputed layers run as
        Cells (``Cell.recompute``), so with recompute on and ``training.jit`` not written it
        is ``none``."""
        recomputes = self.recompute_layers() or self.recompute_modules()
        # context parallel: the cp attention's collectives run in PyNative
        # (config/context_parallel_rules.py)
        cp = self.parallelism.context_parallel > 1
        if (recomputes or cp) and "jit" not in self.training.explicit_keys:
            return "none"
        return self.training.jit

    def _check_recompute_vs_jit(self) -> None:
        layers = self.recompute_layers() or self.recompute_modules()
        if layers and self.model_jit_mode() != "none":
            raise ConfigError("training.jit", (
                f"{self.training.jit!r} compiles the layers, but recompute (recompute.mode: "
                f"{self.recompute.mode}, {len(layers)} layers) runs them as Cells: set "
                "training.jit: none or turn recompute off"))

    def _check_optimizer_vs_model(self) -> None:
        if self.optimizer.type != "Muon":
            return
        mla = self.model.multi_latent_attention
        if mla is None:
            mla = self.model.model_type == "deepseek_v3"
        if not mla:
            raise ConfigError("optimizer.type", "Current Muon implementation only supports models "
                                                "with Multi-Latent Attention enabled. (set "
                                                "model.model_type: deepseek_v3 or "
                                                "model.multi_latent_attention: True)")

    # ------------------------------------------------------------------------------------------
    def build_lr_scheduler(self):
        """The LR schedule of this run (``core.lr``), total_steps = training.steps."""
        from ..core.lr import build_lr_scheduler
        return build_lr_scheduler(self.lr_scheduler.as_build_dict(), self.training.steps)

    def data_parallel(self, world_size: Optional[int] = None) -> int:
        """world_size // (tp * pp * cp); world_size defaults to the launcher's (1 outside msrun)."""
        from ..launch_env import env_world_size
        ws = env_world_size() if world_size is None else int(world_size)
        par = self.parallelism
        tp, pp, cp = par.tensor_parallel, par.pipeline_parallel, par.context_parallel
        for name, value in (("tensor_parallel", tp), ("pipeline_parallel", pp),
                            ("context_parallel", cp)):
            if value < 1:
                raise ConfigError(f"parallelism.{name}", f"must be >= 1, got {value}")
        dp = ws // (tp * pp * cp) if tp * pp * cp > 0 else 0
        if dp <= 0:
            raise ConfigError("parallelism", f"tensor_parallel({tp}) * pipeline_parallel({pp}) * "
                                             f"context_parallel({cp}) must be less than or equal "
                                             f"to world_size({ws})." + WORLD_OF_LAYOUT)
        if ws % (tp * pp * cp) != 0:
            raise ConfigError("parallelism", f"world_size({ws}) must be divisible by "
                                             f"tensor_parallel({tp}) * pipeline_parallel({pp}) * "
                                             f"context_parallel({cp})." + WORLD_OF_LAYOUT)
        return dp

    def parallel_dims(self, world_size: Optional[int] = None) -> ParallelDims:
        """The run's :class:`~mindformers_core.core.parallel_dims.ParallelDims` on
        ``world_size`` ranks (the launcher's by default), checked by ``config.layout``'s
        ``check_layout``: the one place the layout of a run is derived."""
        from ..launch_env import env_world_size
        ws = env_world_size() if world_size is None else int(world_size)
        dp = self.data_parallel(ws)   # upstream's world-size messages
        par = self.parallelism
        _, shard = par.dp_shard(dp)   # raises ConfigError for a shard size that does not fit
        check_expert_parallel(self, dp)
        try:
            dims = make_mesh(ws, tp=par.tensor_parallel, cp=par.context_parallel,
                             pp=par.pipeline_parallel, ep=par.expert_parallel,
                             vpp=par.pipeline_parallel_interleave_num, dp_shard=shard,
                             sequence_parallel=bool(par.sequence_parallel),
                             shard_strategy=par.data_parallel_shard_strategy)
        except ValueError as err:
            raise ConfigError("parallelism", str(err)) from None
        check_layout(dims)
        problem = sharded_parameter_problem(   # what optim_grads_params does not run with
            dims.shard_strategy, fsdp_ranks(dims.dp, dims.dp_shard, dims.cp), self.training.jit,
            "jit" in self.training.explicit_keys)
        if problem is None:   # what dividing the reduced gradients does not run with
            problem = gradient_division_problem(
                par.disable_gradient_division, parallel_steps(dims), dims.ep, dims.describe())
        if problem is not None:
            raise ConfigError(*problem)
        return dims

    def plan(self, world_size: Optional[int] = None) -> RunPlan:
        """Derived values; raises ConfigError when they do not work out."""
        dims = self.parallel_dims(world_size)
        ws, dp = dims.world, dims.dp
        experts = expert_plan(self, dp, dims.edp)   # expert_parallel vs n_routed_experts and dp
        tr = self.training
        base_units = dp * tr.local_batch_size
        if tr.global_batch_size % base_units != 0:
            raise ConfigError("training.global_batch_size",
                              f"global_batch_size({tr.global_batch_size}) must be divisible by "
                              f"data_parallel({dp}) * local_batch_size({tr.local_batch_size})."
                              + (DP_OF_LAYOUT if ws > 1 else ""))
        if tr.rampup_batch_size is not None:
            start, inc, _ = tr.rampup_batch_size
            for i, value in ((0, start), (1, inc)):
                if value % base_units != 0:
                    raise ConfigError(f"training.rampup_batch_size[{i}]",
                                      f"{value} must be divisible by data_parallel({dp}) * "
                                      f"local_batch_size({tr.local_batch_size}).")
        check_pipeline_vs_plan(self.parallelism, ws, None if tr.rampup_batch_size is not None
                               else tr.global_batch_size // base_units)   # config/pipeline.py
        sched = self.build_lr_scheduler()
        bounds = dict(sched.boundaries()) if hasattr(sched, "boundaries") else {}
        return RunPlan(
            world_size=ws, data_parallel=dp, local_batch_size=tr.local_batch_size,
            global_batch_size=tr.global_batch_size,
            num_accumulation_steps=tr.global_batch_size // base_units,
            total_steps=tr.steps,
            warmup_steps=int(bounds.get("warmup_steps", 0)),
            decay_start_steps=bounds.get("decay_start_steps"),
            decay_steps=bounds.get("decay_steps"),
            seq_length=self.model.seq_length,
            tokens_per_step=tr.global_batch_size * self.model.seq_length,
            lr_boundaries=bounds, lr_scheduler_type=self.lr_scheduler.type,
            peak_lr=float(getattr(sched, "peak_lr", self.lr_scheduler.learning_rate)),
            optimizer_type=self.optimizer.type, experts=experts,
            tensor_parallel=self.parallelism.tensor_parallel,
            sequence_parallel=bool(self.parallelism.sequence_parallel
                                   and self.parallelism.tensor_parallel > 1),
            dims=dims,
        )

    def to_dict(self) -> Dict[str, Any]:
        """Every section (None for an absent optional one); upstream's optional sections only
        when the user wrote them."""
        return {name: None if getattr(self, name) is None else getattr(self, name).to_dict()
                for name in self.field_names()
                if name not in UPSTREAM_SECTIONS or name in self.explicit_keys}


# ---------------------------------------------------------------------------------------------
def _read_yaml_file(path: str) -> Any:
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read config file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"not a UTF-8 text file ({exc.reason})") from None
    return _parse_yaml(text, str(path))


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return load_strict_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(where, f"invalid YAML{at}: {problem}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # PyYAML constructors raise these for e.g. an impossible date (2001-13-45)
        raise ConfigError(where, f"invalid YAML value: {exc}") from None


def apply_overrides(data: Dict[str, Any], overrides: Iterable[str]) -> Dict[str, Any]:
    """Apply ``"a.b.c=value"`` overrides (value parsed as YAML) to a copy of the raw tree.

    Missing intermediate mappings are created (the strict loader then rejects unknown names);
    descending into a value that is not a mapping is an error naming the path.
    """
    data = copy.deepcopy(data)
    for item in overrides or ():
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(str(item), "override must look like section.key=value")
        dotted, text = item.split("=", 1)
        dotted = dotted.strip()
        keys = dotted.split(".")
        if not dotted or any(not k for k in keys):
            raise ConfigError(dotted or item, "override must look like section.key=value")
        value = _parse_yaml(text, dotted)
        node = data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                here = ".".join(keys[:depth + 1])
                raise ConfigError(dotted, f"cannot set: {here} is a {type_name(child)}, "
                                          "not a section")
            node = child
        last = spelling_in_use(node, keys[-1]) if keys[:-1] == ["model"] else keys[-1]
        node[last] = value
    return data


def load_config(source: Union[str, os.PathLike, Dict[str, Any], RunConfig],
                overrides: Optional[Iterable[str]] = None) -> RunConfig:
    """Load, override and validate a run config; raises ConfigError naming the field."""
    if isinstance(overrides, str):
        overrides = [overrides]
    if isinstance(source, RunConfig):
        data = source.to_dict()
    elif isinstance(source, dict):
        data = source
    elif isinstance(source, (str, os.PathLike)):
        data = _read_yaml_file(os.fspath(source))
        if data is None:
            data = {}
    else:
        raise ConfigError("config", f"expected a YAML path or a mapping, got {type_name(source)}")
    if not isinstance(data, dict):
        raise ConfigError("config", f"expected a mapping of sections, got {type_name(data)}")
    data = apply_overrides(data, overrides or [])
    try:
        return RunConfig.from_dict(data)
    except RecursionError:
        # YAML anchors can build self-referencing trees (`a: &x [*x]`)
        raise ConfigError("config", "too deeply nested or self-referencing") from None
