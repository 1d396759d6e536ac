"""The pipeline x data-parallel cases (ZeRO-1 and FSDP inside each stage), and pipeline x
expert parallel (issue [2/8]), shared by the msrun worker and the 1-process
reference; plain data, so the layout-matrix harness can take them over.

Each case is a real Trainer run of ``STEPS`` steps on the global batch of the acceptance
check: 8 sequences, local batch 2, ``lr_scheduler.learning_rate=1e-3``. On 4 workers as
pp2 x dp2 each pipeline (dp index) reads 2 micro-batches of 2 sequences; the reference runs
the same config on one process (4 micro-batches). The default
``data_parallel_shard_strategy`` (optim) with ``data_parallel_shard: -1`` shards each stage's
optimizer state over its 2 dp ranks (ZeRO-1).
"""
import os

from trainer_case import PYNATIVE

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 10
SAVE_AT = 5
WORKERS = 4

COMMON = [f"training.steps={STEPS}", "training.local_batch_size=2",
          "training.global_batch_size=8", "lr_scheduler.learning_rate=1e-3",
          "model.seq_length=16", f"checkpoint.save_interleaved_steps={SAVE_AT}",
          "checkpoint.save_max=4", "training.deterministic=True", PYNATIVE]

#: name -> {config, overrides (both runs), layout (the 4-worker run only), resume}; the
#: interleaved DeepSeek-V3 case does not resume here: layout_cases.py's upstream8_dsv3 resumes
#: that composition's checkpoint on one process and on pp2 x tp2. pp x tp x ep (interleaved,
#: with MTP) is upstream8_dsv3's 8-worker case, which runs it with dp 2 on top
CASES = {
    # the acceptance's GPT with AdamW under 1f1b: one layer per stage
    "gpt_pp2_dp2": {
        "config": "markov_check.yaml", "overrides": [],
        "layout": ["parallelism.pipeline_parallel=2",
                   "parallelism.pipeline_parallel_schedule=1f1b"],
        "resume": True},
    # FSDP inside each stage (optim_grads_params, interleave 2: four layers, two per rank):
    # each stage's weights split over its 2 dp ranks, gathered per layer in every
    # forward and backward, gradients reduce-scattered there
    "gpt_pp2_fsdp2_vpp2": {
        "config": "markov_check.yaml",
        "overrides": ["model.num_layers=4"],
        "layout": ["parallelism.pipeline_parallel=2",
                   "parallelism.pipeline_parallel_interleave_num=2",
                   "parallelism.data_parallel_shard_strategy=optim_grads_params"],
        "resume": True},
    # gradient sharding only (optim_grads) under 1f1b: the weights whole, each stage's
    # gradients reduce-scattered over its dp group after the micro-batches
    "gpt_pp2_fsdp_grads": {
        "config": "markov_check.yaml", "overrides": [],
        "layout": ["parallelism.pipeline_parallel=2",
                   "parallelism.pipeline_parallel_schedule=1f1b",
                   "parallelism.data_parallel_shard_strategy=optim_grads"],
        "resume": False},
    # the acceptance's tiny DeepSeek-V3 (MLA, MoE with expert bias and aux loss) with Muon,
    # interleave 2, plus one MTP depth (on the last stage; the embedding table shared with
    # the first); QK-Clip at threshold 0.05, not the acceptance's 1.0: at seq_length 16 the
    # max logit stays near 0.07, so 1.0 would clip nothing and test nothing
    "dsv3_pp2_dp2_vpp2": {
        "config": "muon_deepseek_v3_tiny.yaml",
        "overrides": ["model.num_layers=4", "optimizer.qk_clip_threshold=0.05",
                      "model.num_nextn_predict_layers=1"],
        "layout": ["parallelism.pipeline_parallel=2",
                   "parallelism.pipeline_parallel_interleave_num=2"],
        "resume": False},
    # DeepSeek-V3's composition (pp x ep x ZeRO-1 dp, issue [2/8]): each stage's 2 dp ranks
    # split its routed experts (ep2, carved out of the stage's dp) under 1f1b, with Muon,
    # QK-Clip, expert bias, aux loss and one MTP depth (its MoE on the last stage)
    "dsv3_pp2_ep2": {
        "config": "muon_deepseek_v3_tiny.yaml",
        "overrides": ["model.num_layers=4", "optimizer.qk_clip_threshold=0.05",
                      "model.num_nextn_predict_layers=1"],
        "layout": ["parallelism.pipeline_parallel=2", "parallelism.expert_parallel=2",
                   "parallelism.pipeline_parallel_schedule=1f1b"],
        "resume": True},
}


def resume_extra(run_dir: str):
    """The override that resumes ``run_dir``'s checkpoint of step SAVE_AT."""
    name = f"mindformers_core_step{SAVE_AT:08d}.safetensors"
    return [f"checkpoint.load_path={os.path.join(run_dir, 'checkpoint', name)}"]


def case_config(name: str, out_dir: str, parallel: bool, extra=()):
    from mindformers_core.config import load_config
    case = CASES[name]
    return load_config(os.path.join(ROOT, "configs", case["config"]), overrides=COMMON
                       + case["overrides"]
                       + [f"checkpoint.save_path={os.path.join(out_dir, 'checkpoint')}"]
                       + (case["layout"] if parallel else []) + list(extra))


def run_case(name: str, out_dir: str, parallel: bool, extra=()):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(case_config(name, out_dir, parallel, extra), out_dir)
    trainer.train()
    return trainer
