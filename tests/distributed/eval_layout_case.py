"""The runs of tests/distributed/test_eval_layouts_msrun.py, as data: the quickstart config as
issue 31's hidden check runs it (``QUICK``: 10 steps, held-out evaluations at steps 5 and 10,
a 16-token greedy sample, local batch 4 in a global batch of 8) under each layout of
``LAYOUTS``, against the same config on one process. The composed layouts run the shorter
``SHORT`` schedule (6 steps, evaluations of 4 batches at steps 3 and 6, the same sample):
the same checks at about half the suite time.

``LAYOUTS``: name -> :class:`EvalLayout`: the msrun workers, the model (``gpt``: the
quickstart's; ``dsv3``: its ``model:`` replaced by configs/model_presets/tiny_deepseek_v3.yaml's,
AdamW as the quickstart), the layout's overrides; ``save``: the run also writes its final
checkpoint (the checkpoint kind of the layout, which ``tools.generate`` reads on one process);
``no_eval``: the worker also runs the layout for the step after the first evaluation without
an evaluation or sample (``no_eval_overrides``), whose rows are those of the run with the
evaluation, bit for bit; ``generate``: every worker then runs ``tools.generate``
(``generate_argv``) on the saved checkpoint.
"""
import os
from dataclasses import dataclass
from typing import Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

BATCH = ["logging.sample_max_new_tokens=16", "training.local_batch_size=4",
         "training.global_batch_size=8", "training.log_interval=1", "checkpoint.enable_save=false"]


@dataclass(frozen=True)
class Schedule:
    """A run's steps, evaluation interval and overrides (the quickstart's own eval_steps: 8
    unless ``eval_steps``; ``extra``: more overrides both sides share, a deeper model)."""
    steps: int
    eval_interval: int
    eval_steps: Optional[int] = None
    extra: Tuple[str, ...] = ()

    def overrides(self):
        return [f"training.steps={self.steps}", f"training.eval_interval={self.eval_interval}"] \
            + ([f"training.eval_steps={self.eval_steps}"] if self.eval_steps else []) + BATCH \
            + list(self.extra)

    @property
    def eval_at(self):
        return list(range(self.eval_interval, self.steps + 1, self.eval_interval))

    @property
    def no_eval_steps(self) -> int:
        """The step after the first evaluation."""
        return self.eval_interval + 1


#: issue 31's hidden check, and the composed layouts' shorter run
QUICK_SCHEDULE = Schedule(10, 5)
SHORT = Schedule(6, 3, eval_steps=4)
#: 2 steps (an evaluation of 2 batches at step 2), 4 layers (one per virtual stage of pp2 x
#: interleave 2), lr 1e-3, the layers in PyNative. At the quickstart's lr 1e-2 the 4-layer
#: model's step 3 (its grad_norm spikes to 8.3) turns tp's other summation order (rel 6e-8 in
#: step 1's grad_norm) into rel 4e-4, with or without ep and interleaving (pp2 x ep2 x dp4
#: without tp: 4e-5; one process at local batch 2 against 4: 2e-5); at 1e-3 the rows agree to
#: 7e-7 over 6 steps. An 8-worker step takes about 7 s on the suite's 2 cores, and 8 workers
#: compiling their layer graphs at once would be most of the case's time (the compiled layers
#: under a layout are the other cases').
DEEP = Schedule(2, 2, eval_steps=2, extra=("model.num_layers=4", "training.jit=none",
                                       "lr_scheduler.learning_rate=1e-3"))
QUICK = QUICK_SCHEDULE.overrides()
TP = ("parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true")
EP = ("parallelism.expert_parallel=2",)
PP = ("parallelism.pipeline_parallel=2",)
CP = ("parallelism.context_parallel=2", "parallelism.context_parallel_method=colossal")
FSDP = ("parallelism.data_parallel_shard_strategy=optim_grads_params",)
#: the final checkpoint of the layout's run (``save``), under its run directory
SAVE = ("checkpoint.enable_save=true",)


@dataclass(frozen=True)
class EvalLayout:
    workers: int
    model: str
    layout: Tuple[str, ...]
    save: bool = False
    no_eval: bool = False
    generate: bool = False
    schedule: Schedule = SHORT

    def overrides(self):
        return list(self.layout) + (list(SAVE) if self.save else [])


LAYOUTS = {
    # the hidden check's layouts, on its schedule (tp2 alone: test_eval_tp_msrun.py)
    "fsdp": EvalLayout(2, "gpt", FSDP, save=True, schedule=QUICK_SCHEDULE),
    "pp2": EvalLayout(2, "gpt", PP, save=True, schedule=QUICK_SCHEDULE),
    "tp2dp2": EvalLayout(4, "gpt", TP, save=True, generate=True, schedule=QUICK_SCHEDULE),
    "ep2": EvalLayout(2, "dsv3", EP, save=True, schedule=QUICK_SCHEDULE),
    # the composed layouts: pp2 x dp2 (ZeRO-1 in each stage), cp2 x dp2 (ZeRO-1)
    "pp2dp2": EvalLayout(4, "gpt", PP, save=True, no_eval=True),
    # pp2 x FSDP: each stage's weights split over its 2 dp ranks (gathered per layer)
    "pp2fsdp2": EvalLayout(4, "gpt", PP + FSDP, save=True),
    "cp2dp2": EvalLayout(4, "gpt", CP, save=True, no_eval=True),
    # tp2 x FSDP: each rank stores its dp rows of its tp slice; the eval and the sample
    # gather them per layer (every rank decodes), and tools.generate reads the saved
    # checkpoint (model rows on top of the tp pieces) on one process
    "tp2fsdp2": EvalLayout(4, "gpt", TP + FSDP, save=True, generate=True),
    # cp2 x tp2 (sequence parallel): each cp rank's tp group decodes the whole prompt (its
    # vocabulary-parallel logits, the last position's top token over tp)
    "cp2tp2": EvalLayout(4, "gpt", CP + TP, save=True),
    # cp2 x FSDP dp2: each weight's rows over the 4 dp x cp ranks; every rank decodes the
    # sample with the rows gathered per layer, and tools.generate reads the saved checkpoint
    "cp2fsdp2": EvalLayout(4, "gpt", CP + FSDP, save=True, generate=True),
    # tp2 x ep2 x FSDP dp2 (sequence parallel): ep folds over the tp group at world 4, FSDP
    # stores the dp rows of each dense tp slice (the eval and the sample gather them per
    # layer); tp x ep with ZeRO-1 runs the user's way as cp2tp2ep4 and upstream8
    "tp2ep2fsdp2": EvalLayout(4, "dsv3", TP + EP + FSDP, save=True),
    # cp2 x tp2 x ep4 (dp 1): the experts folded over the tp x cp ranks; the eval runs the
    # cp model on its chunks, the sample decodes the whole prompt on each cp rank's tp group
    # (its tokens dispatched over the ep group it shares with the other cp rank)
    "cp2tp2ep4": EvalLayout(4, "dsv3", CP + TP + ("parallelism.expert_parallel=4",), save=True),
    # cp2 x ep2 x FSDP dp2: the dense weights' rows over the 4 dp x cp ranks, the experts
    # whole on their ep rank; the sample gathers the rows per layer on every rank
    "cp2ep2fsdp2": EvalLayout(4, "dsv3", CP + EP + FSDP, save=True),
    # cp2 with full recompute (world 2): the recomputed layers rerun the ring in the backward
    "cp2recompute": EvalLayout(2, "gpt", CP + ("recompute.mode=full",), save=True),
    # cp2 x pp2 x ep2 (dp 1; issue 32): each stage's two cp ranks hold their chunks and
    # split its experts (ep folded over cp); the eval passes each cp rank's chunk rows from
    # stage to stage, the sample decodes the whole prompt through the stages on each cp rank
    "cp2pp2ep2": EvalLayout(4, "dsv3", CP + PP + EP, save=True),
    # pp2 x ep2 (DeepSeek-V3's composition): each stage's 2 dp ranks split its experts; the
    # eval and the sample run through the stages, the dispatch over each stage's ep group
    "pp2ep2": EvalLayout(4, "dsv3", PP + EP, save=True),
    # upstream MindFormers' 8-card layout (issue 30): dp_shard2 x ep2 x tp2 x pp2 x
    # interleave 2: 4 virtual stages, the eval and the sample through them in order (each
    # stage's tp group splits its weights and, folded, its experts; the hidden states between
    # stages are each rank's T/tp rows, the last stage's logits the tp ranks' vocabulary
    # shards); local batch 2 (the interleaved schedule's micro-batches per replica are a
    # multiple of pp)
    "upstream8": EvalLayout(8, "dsv3", PP + TP + EP + (
        "parallelism.pipeline_parallel_interleave_num=2", "parallelism.data_parallel_shard=2",
        "training.local_batch_size=2"), save=True, schedule=DEEP),
}
MODELS = sorted({case.model for case in LAYOUTS.values()})


def no_eval_overrides(schedule: Schedule):
    """The run without an evaluation before its last step or a sample (one held-out batch
    after it), stopped after the step after the first evaluation of ``schedule`` (the same
    lr schedule)."""
    return [f"training.stop_at_step={schedule.no_eval_steps}", "training.eval_interval=null",
            "training.eval_steps=1", "logging.sample_prompt=null"]


PROMPT = "The with statement"
#: the sampled continuation under each layout (``sample``) and by tools.generate
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 3}


def sample(trainer) -> str:
    """PROMPT and 16 tokens sampled (``SAMPLING``) after it by ``trainer``'s model under its
    layout, as the end-of-run sample decodes (trainer/progress.py: every rank, the key/value
    cache through the layout's runner): what tools.generate prints for them."""
    from mindformers_core.models.generation import generate
    tokenizer = trainer.progress.tokenizer
    with trainer.model.whole_sequences():
        new = generate(trainer.parallel.forward_only(trainer.model), tokenizer.encode(PROMPT),
                       16, **SAMPLING)
    return PROMPT + tokenizer.decode(new)


def generate_argv(config_path: str, checkpoint: str, layout=(), schedule: Schedule = SHORT,
                  sampled: bool = False):
    """``tools.generate``'s arguments: 16 greedy tokens after PROMPT (``sampled``: drawn with
    ``SAMPLING``), the model of ``config_path`` under ``schedule`` and ``layout`` (a layout
    that fits the launch's world)."""
    sets = [a for o in schedule.overrides() + list(layout) for a in ("--set", o)]
    draw = [a for k, v in SAMPLING.items() for a in (f"--{k}", str(v))] if sampled else []
    return ["--config", config_path, *sets, "--checkpoint", checkpoint, "--prompt", PROMPT,
            "--max_new_tokens", "16", *draw]


def config(model: str, run_dir: str, overrides=(), schedule: Schedule = QUICK_SCHEDULE):
    """The quickstart config (``model``'s) under ``schedule`` and ``overrides``; ``run_dir``:
    the run's directory (the checkpoints under it; a dsv3 config file beside it)."""
    from mindformers_core.config import load_config
    path = os.path.join(ROOT, "configs", "quickstart.yaml")
    if model == "dsv3":
        from eval_tp_case import write_ep_config
        os.makedirs(os.path.dirname(run_dir) or ".", exist_ok=True)
        # one file per rank: the msrun workers write theirs at the same time
        path = write_ep_config(f"{run_dir}.rank{os.environ.get('RANK_ID', '0')}.yaml")
    return load_config(path, overrides=schedule.overrides() + list(overrides) + [
        f"checkpoint.save_path={os.path.join(run_dir, 'checkpoint')}"])


def run(model: str, run_dir: str, overrides=(), schedule: Schedule = QUICK_SCHEDULE):
    """Train into ``run_dir``: (the Trainer, the run log's text: rank 0's, '' elsewhere)."""
    from eval_tp_case import train_logged
    return train_logged(config(model, run_dir, overrides, schedule), run_dir)
