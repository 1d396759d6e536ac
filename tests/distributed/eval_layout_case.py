"""The runs of tests/distributed/test_eval_layouts_msrun.py, as data: the quickstart config as
issue 31's hidden check runs it (``QUICK``: 10 steps, held-out evaluations at steps 5 and 10,
a 16-token greedy sample, local batch 4 in a global batch of 8) under each layout of
``LAYOUTS``, against the same config on one process.

``LAYOUTS``: name -> :class:`EvalLayout`: the msrun workers, the model (``gpt``: the
quickstart's; ``dsv3``: its ``model:`` replaced by configs/model_presets/tiny_deepseek_v3.yaml's,
AdamW as the quickstart), the layout's overrides; ``save``: the run also writes its final
checkpoint (the checkpoint kind of the layout, which ``tools.generate`` reads on one process);
``no_eval``: the worker also runs the layout for ``NO_EVAL_STEPS`` steps without an
evaluation or sample (``no_eval_overrides``), whose rows are those of the run with the
evaluation at step 5, bit for bit; ``generate``: every worker then runs ``tools.generate``
(``generate_argv``) on the saved checkpoint.
"""
import os
from dataclasses import dataclass
from typing import Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

QUICK = ["training.steps=10", "training.eval_interval=5", "logging.sample_max_new_tokens=16",
         "training.local_batch_size=4", "training.global_batch_size=8",
         "training.log_interval=1", "checkpoint.enable_save=false"]
TP = ("parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true")
EP = ("parallelism.expert_parallel=2",)
PP = ("parallelism.pipeline_parallel=2",)
CP = ("parallelism.context_parallel=2", "parallelism.context_parallel_method=colossal")
FSDP = ("parallelism.data_parallel_shard_strategy=optim_grads_params",)
#: the final checkpoint of the layout's run (``save``), under its run directory
SAVE = ("checkpoint.enable_save=true",)
#: the step after the first evaluation (at 5)
NO_EVAL_STEPS = 6


@dataclass(frozen=True)
class EvalLayout:
    workers: int
    model: str
    layout: Tuple[str, ...]
    save: bool = False
    no_eval: bool = False
    generate: bool = False

    def overrides(self):
        return list(self.layout) + (list(SAVE) if self.save else [])


LAYOUTS = {
    "fsdp": EvalLayout(2, "gpt", FSDP, save=True),
    "pp2": EvalLayout(2, "gpt", PP, save=True),
    "tp2dp2": EvalLayout(4, "gpt", TP, save=True, generate=True),
    "ep2": EvalLayout(2, "dsv3", EP, save=True),
    # the composed layouts: pp2 x dp2 (ZeRO-1 in each stage), cp2 x dp2 (ZeRO-1)
    "pp2dp2": EvalLayout(4, "gpt", PP, save=True, no_eval=True),
    # pp2 x FSDP: each stage's weights split over its 2 dp ranks (gathered per layer)
    "pp2fsdp2": EvalLayout(4, "gpt", PP + FSDP, save=True),
    "cp2dp2": EvalLayout(4, "gpt", CP, no_eval=True),
    # tp2 x FSDP: each rank stores its dp rows of its tp slice; the eval and the sample
    # gather them per layer (every rank decodes), and tools.generate reads the saved
    # checkpoint (model rows on top of the tp pieces) on one process
    "tp2fsdp2": EvalLayout(4, "gpt", TP + FSDP, save=True, generate=True),
    # cp2 x tp2 (sequence parallel): each cp rank's tp group decodes the whole prompt (its
    # vocabulary-parallel logits, the last position's top token over tp)
    "cp2tp2": EvalLayout(4, "gpt", CP + TP),
    # tp2 x ep2 (sequence parallel): ep folds over the tp group at world 4; in its step 3
    # one rank's experts get no token (the case that distributed/shard_params.py is about)
    "tp2ep2": EvalLayout(4, "dsv3", TP + EP, save=True),
    # pp2 x ep2 (DeepSeek-V3's composition): each stage's 2 dp ranks split its experts; the
    # eval and the sample run through the stages, the dispatch over each stage's ep group
    "pp2ep2": EvalLayout(4, "dsv3", PP + EP, save=True),
    # pp2 x tp2 x ep2: each stage's tp group splits its weights (sequence parallel) and its
    # experts; the hidden states between stages are each rank's T/tp rows, the last stage's
    # logits the tp ranks' vocabulary shards
    "pp2tp2ep2": EvalLayout(4, "dsv3", PP + TP + EP, save=True),
}
MODELS = sorted({case.model for case in LAYOUTS.values()})


def no_eval_overrides():
    """The run without an evaluation before its last step or a sample (one held-out batch
    after it), stopped after step NO_EVAL_STEPS of the same 10 (the same lr schedule)."""
    return [f"training.stop_at_step={NO_EVAL_STEPS}", "training.eval_interval=null",
            "training.eval_steps=1", "logging.sample_prompt=null"]


PROMPT = "The with statement"


def generate_argv(config_path: str, checkpoint: str, layout=()):
    """``tools.generate``'s arguments: 16 greedy tokens after PROMPT, the model of
    ``config_path`` under ``QUICK`` and ``layout`` (a layout that fits the launch's world)."""
    sets = [a for o in QUICK + list(layout) for a in ("--set", o)]
    return ["--config", config_path, *sets, "--checkpoint", checkpoint, "--prompt", PROMPT,
            "--max_new_tokens", "16"]


def config(model: str, run_dir: str, overrides=()):
    """The quickstart config (``model``'s) under ``QUICK`` and ``overrides``; ``run_dir``: the
    run's directory (the checkpoints under it; a dsv3 config file beside it)."""
    from mindformers_core.config import load_config
    path = os.path.join(ROOT, "configs", "quickstart.yaml")
    if model == "dsv3":
        from eval_tp_case import write_ep_config
        os.makedirs(os.path.dirname(run_dir) or ".", exist_ok=True)
        # one file per rank: the msrun workers write theirs at the same time
        path = write_ep_config(f"{run_dir}.rank{os.environ.get('RANK_ID', '0')}.yaml")
    return load_config(path, overrides=QUICK + list(overrides) + [
        f"checkpoint.save_path={os.path.join(run_dir, 'checkpoint')}"])


def run(model: str, run_dir: str, overrides=()):
    """Train into ``run_dir``: (the Trainer, the run log's text: rank 0's, '' elsewhere)."""
    from eval_tp_case import train_logged
    return train_logged(config(model, run_dir, overrides), run_dir)
