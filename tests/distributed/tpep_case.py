"""tensor_parallel: 2 (+sp) x expert_parallel: 2 on 4 msrun CPU workers vs one process on the
same global batch: the runs shared by the worker and the single-process reference.

configs/muon_deepseek_v3_tiny.yaml's tiny DeepSeek-V3 (4 routed experts, top-2, shared
expert, aux loss, expert bias, MLA; its 2 layers: a dense one, then a MoE one; more layers
only repeat the MoE layer's communication and cost suite time), ``optimizer.qk_clip_threshold:
1.0``, global batch 8 = dp 2 x local
batch 2 x 2 micro-batches (one process: 4 micro-batches of 2), learning rate 1e-3, 10 steps,
a metrics row every step, no eval, no sample, no checkpoints, the layers in PyNative
(trainer_case.PYNATIVE; the compiled layers under tp are tp_case's). At world 4 the folding
(core/parallel_dims.py) makes the ep group the tp group and edp the dp group.

The cases are data: name -> overrides (``--set`` form) on top of that base; ``reference`` is
the single-process run a case is compared with (the Muon comm strategy and the dispatcher
are irrelevant on one rank).
"""
import os

from trainer_case import PYNATIVE

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")
STEPS = 10
WORKERS = 4
#: the model's MoE layers (layer 0 is dense: ``first_k_dense_replace: 1``)
MOE_LAYERS = ("1",)

BASE = ["optimizer.qk_clip_threshold=1.0",
        "training.global_batch_size=8", "training.local_batch_size=2",
        "lr_scheduler.learning_rate=1e-3", f"training.steps={STEPS}", "training.log_interval=1",
        "checkpoint.enable_save=false", PYNATIVE]
LAYOUT = ["parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true",
          "parallelism.expert_parallel=2"]
#: the optimizer section of the AdamW cases (the config's is Muon's)
ADAMW = {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}

#: name -> (optimizer section: None = the config's Muon, overrides of both sides, overrides of
#: the parallel run only). The base threshold 1.0 clips no head of this model (its max logits
#: stay near 0.05-0.09), so muon_deredundency lowers it to 0.05, where heads are clipped in
#: most steps.
CASES = {
    "muon": (None, [], ["optimizer.comm_strategy=allgather"]),
    "muon_deredundency": (None, ["optimizer.qk_clip_threshold=0.05"],
                          ["optimizer.comm_strategy=allgather_deredundency",
                           "parallelism.moe_token_dispatcher_type=alltoall_deredundancy"]),
    "adamw": (ADAMW, [], []),
}


def reference(name: str) -> str:
    """The single-process run of case ``name``: the first case with the same optimizer and
    shared overrides."""
    return next(n for n, c in CASES.items() if c[:2] == CASES[name][:2])


#: the case that also checkpoints: its step-SAVE_AT checkpoint is resumed under tp x ep (by the
#: worker) and on one process (by the test)
CKPT_CASE = "muon"
SAVE_AT = 7


def checkpoint_overrides(run_dir: str):
    """Save at step SAVE_AT (and at the end) under ``run_dir``/checkpoint."""
    return ["checkpoint.enable_save=true", f"checkpoint.save_interleaved_steps={SAVE_AT}",
            "checkpoint.save_max=5",
            f"checkpoint.save_path={os.path.join(run_dir, 'checkpoint')}"]


def checkpoint_at(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoint", f"mindformers_core_step{step:08d}.safetensors")


def case_config(name: str, parallel: bool, extra=()):
    """Case ``name``'s RunConfig: on 4 workers (``parallel``) or on one process; ``extra``:
    more overrides (the checkpoint's)."""
    import yaml
    from mindformers_core.config import load_config
    with open(CONFIG) as fh:
        data = yaml.safe_load(fh)
    opt, shared, own = CASES[name]
    if opt is not None:
        data["optimizer"] = dict(opt)
    overrides = [o for o in BASE if opt is None or not o.startswith("optimizer.qk_clip")]
    return load_config(data, overrides=overrides + shared + (LAYOUT + own if parallel else [])
                       + list(extra))
