"""The tiny models of the tensor-parallel tests (``test_tp_msrun.py``): a GPT with GQA and the
DeepSeek-V3 of configs/muon_deepseek_v3_tiny.yaml with AdamW, each as a Trainer config."""
import os

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 10
TP = ["parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true"]


def gpt_config(out_dir: str, overrides=()):
    """Tiny GPT: hidden 32, 2 layers, 4 heads in 2 query groups, seq 16; global batch 4;
    ``training.jit: layer`` (the default; the DeepSeek-V3 case runs PyNative)."""
    from mindformers_core.config import load_config
    return load_config(os.path.join(ROOT, "configs", "markov_check.yaml"), overrides=[
        f"training.steps={STEPS}", "training.local_batch_size=2", "training.global_batch_size=4",
        "model.hidden_size=32", "model.seq_length=16",
        "model.num_query_groups=2", "checkpoint.enable_save=false",
        f"checkpoint.save_path={os.path.join(out_dir, 'checkpoint')}",
    ] + list(overrides))


def dsv3_config(out_dir: str, overrides=()):
    """The tiny DeepSeek-V3 (MLA, one dense layer, one MoE layer) with AdamW, seq 16."""
    from mindformers_core.config import load_config
    with open(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")) as fh:
        d = yaml.safe_load(fh)
    d["optimizer"] = {"type": "AdamW", "weight_decay": 0.1, "betas": [0.9, 0.95]}
    d["lr_scheduler"] = {"type": "ConstantWarmUpLR", "learning_rate": 3.0e-3, "warmup_steps": 2}
    return load_config(d, overrides=[
        f"training.steps={STEPS}", "training.local_batch_size=2", "training.global_batch_size=4",
        "training.jit=none", "model.seq_length=16", "checkpoint.enable_save=false",
        f"checkpoint.save_path={os.path.join(out_dir, 'checkpoint')}",
    ] + list(overrides))


CONFIGS = {"gpt": gpt_config, "dsv3": dsv3_config}
