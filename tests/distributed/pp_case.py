"""The pipeline-parallel training cases, shared by the msrun worker and the 1-process reference.

Each case is a real Trainer run of 10 steps, global batch 4 as 4 micro-batches of 1 sequence
(the pipeline's micro-batches are the accumulation count). ``pp_overrides`` turns a case into
its ``pipeline_parallel: 2`` form; the reference runs the same config on one process.
"""
import os

from trainer_case import PYNATIVE

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 10
SAVE_AT = 5

COMMON = [f"training.steps={STEPS}", "training.local_batch_size=1",
          "training.global_batch_size=4", "model.seq_length=16",
          f"checkpoint.save_interleaved_steps={SAVE_AT}", "checkpoint.save_max=4",
          "training.deterministic=True", PYNATIVE]

#: name -> (config file, overrides, pipeline overrides)
CASES = {
    # the tiny GPT with AdamW under 1f1b: one layer per stage
    "gpt_1f1b": ("markov_check.yaml", ["model.hidden_size=32"],
                 ["parallelism.pipeline_parallel=2",
                  "parallelism.pipeline_parallel_schedule=1f1b"]),
    # uneven stages (1 + 3 layers) with the output layer tied to the embedding: the table's
    # gradient is summed over the first and last stage
    "gpt_tied_uneven": ("markov_check.yaml",
                        ["model.hidden_size=32", "model.num_layers=4",
                         "model.tie_word_embeddings=True"],
                        ["parallelism.pipeline_parallel=2",
                         "parallelism.pipeline_parallel_layers_per_stage=['0-0','1-3']"]),
    # interleave 2 on a 4-layer tiny DeepSeek-V3 with Muon (QK-Clip, expert bias, MoE aux)
    "dsv3_interleaved": ("muon_deepseek_v3_tiny.yaml",
                         ["model.num_layers=4", "optimizer.qk_clip_threshold=0.05"],
                         ["parallelism.pipeline_parallel=2",
                          "parallelism.pipeline_parallel_interleave_num=2"]),
}


#: the case whose step-SAVE_AT checkpoint is resumed (on one process and on pp2)
RESUME_CASE = "gpt_1f1b"


def resume_extra(run_dir: str):
    """The override that resumes ``run_dir``'s checkpoint of step SAVE_AT."""
    name = f"mindformers_core_step{SAVE_AT:08d}.safetensors"
    return [f"checkpoint.load_path={os.path.join(run_dir, 'checkpoint', name)}"]


def case_config(name: str, out_dir: str, pipeline: bool, extra=()):
    from mindformers_core.config import load_config
    path, overrides, pp = CASES[name]
    return load_config(os.path.join(ROOT, "configs", path), overrides=COMMON + overrides + [
        f"checkpoint.save_path={os.path.join(out_dir, 'checkpoint')}"]
        + (pp if pipeline else []) + list(extra))


def run_case(name: str, out_dir: str, pipeline: bool, extra=()):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(case_config(name, out_dir, pipeline, extra), out_dir)
    trainer.train()
    return trainer
