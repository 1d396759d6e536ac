"""The expert-parallel Trainer runs shared by the msrun worker and the single-process reference:
configs/muon_deepseek_v3_tiny.yaml's model (4 routed experts, top-2, one MoE layer, shared
expert, aux loss, expert bias) for 10 steps, global batch 4 = 2 ranks x local batch 2 (one
process: 2 micro-batches of 2; on 4 ranks global batch 8), a MoE log line every step, no
checkpoints.

name -> (optimizer, Muon comm_strategy, moe_expert_capacity_factor); ``reference(name)`` is
the single-process run it is compared with (the comm strategy is irrelevant on one rank). A
name ending in ``_pad`` runs with ``model.use_pad_tokens: True`` (the padded exchange and
expert compute), one ending in ``_dedup`` with ``parallelism.moe_token_dispatcher_type:
alltoall_deredundancy`` (models/ep_dedup.py); both are compared with the plain single-process
run."""
import copy
import os

import yaml

from trainer_case import PYNATIVE

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 10

CASES = {
    "adamw": ("adamw", None, None),
    "adamw_capacity": ("adamw", None, 1.0),     # pairs dropped on each rank before dispatch
    "muon": ("muon", "allgather", None),
    "muon_deredundency": ("muon", "allgather_deredundency", None),
    "adamw_pad": ("adamw", None, None),          # use_pad_tokens: True
    "adamw_dedup": ("adamw", None, None),        # alltoall_deredundancy
}


def reference(name: str) -> str:
    opt, _, capacity = CASES[name]
    return opt if capacity is None else f"{opt}_capacity"

ADAMW = {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}


def case_config(name: str, expert_parallel: int, global_batch: int = 4, overrides=()):
    from mindformers_core.config import load_config
    with open(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")) as fh:
        data = yaml.safe_load(fh)
    data = copy.deepcopy(data)
    opt, strategy, capacity = CASES[name]
    if opt == "adamw":
        data["optimizer"] = dict(ADAMW)
        data["lr_scheduler"]["learning_rate"] = 3.0e-3
    else:
        data["optimizer"]["comm_strategy"] = strategy
    data["training"].update({"steps": STEPS, "local_batch_size": 2,
                             "global_batch_size": global_batch,
                             "log_interval": 1})
    data["checkpoint"] = {"enable_save": False}
    if capacity is not None:
        data["model"]["moe_expert_capacity_factor"] = capacity
    if name.endswith("_pad"):
        data["model"]["use_pad_tokens"] = True
    data["parallelism"] = {"expert_parallel": expert_parallel}
    if name.endswith("_dedup"):
        data["parallelism"]["moe_token_dispatcher_type"] = "alltoall_deredundancy"
    return load_config(data, overrides=[PYNATIVE] + list(overrides))


