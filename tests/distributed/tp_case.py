"""The tiny models of the tensor-parallel tests (``test_tp_msrun.py``): a GPT with GQA, that GPT
as a Qwen3 (per-head q/k norms, head dim 12 != hidden / heads) and the DeepSeek-V3 of
configs/muon_deepseek_v3_tiny.yaml with AdamW, and that DeepSeek-V3 with Muon under each
``comm_strategy`` with QK-Clip at a threshold its heads exceed (PyNative, and one under
``training.jit: layer``), each as a Trainer config."""
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


def qwen3_config(out_dir: str, overrides=()):
    """``gpt_config`` as ``model_type: qwen3``: q/k norms replicated over tp (their gradient
    summed over the ranks' heads), head dim 12, ffn 64 (``training.jit: layer``)."""
    return gpt_config(out_dir, ["model.model_type=qwen3", "model.head_dim=12",
                                "model.ffn_hidden_size=64"] + list(overrides))


def dsv3_config(out_dir: str, overrides=(), muon=None):
    """The tiny DeepSeek-V3 (MLA, one dense layer, one MoE layer), seq 16: with AdamW, or with
    the yaml's Muon and the ``muon`` overrides."""
    from mindformers_core.config import load_config
    with open(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")) as fh:
        d = yaml.safe_load(fh)
    if muon is None:
        d["optimizer"] = {"type": "AdamW", "weight_decay": 0.1, "betas": [0.9, 0.95]}
        d["lr_scheduler"] = {"type": "ConstantWarmUpLR", "learning_rate": 3.0e-3,
                             "warmup_steps": 2}
    else:
        d["lr_scheduler"] = {"type": "ConstantWarmUpLR", "learning_rate": 2.0e-2,
                             "warmup_steps": 2}
    return load_config(d, overrides=[
        f"training.steps={STEPS}", "training.local_batch_size=2", "training.global_batch_size=4",
        "training.jit=none", "model.seq_length=16", "checkpoint.enable_save=false",
        f"checkpoint.save_path={os.path.join(out_dir, 'checkpoint')}",
    ] + list(muon or ()) + list(overrides))


#: QK-Clip threshold below the tiny DeepSeek-V3's max logits (so heads are clipped every step)
QK_CLIP_THRESHOLD = 0.05


def dsv3_muon(strategy: str, jit: str = "none"):
    """``dsv3_config`` with Muon under ``strategy``, QK-Clip at QK_CLIP_THRESHOLD, ``jit``."""
    def make(out_dir: str, overrides=()):
        return dsv3_config(out_dir, overrides, muon=[
            f"optimizer.comm_strategy={strategy}", "optimizer.qk_clip_enabled=true",
            f"optimizer.qk_clip_threshold={QK_CLIP_THRESHOLD}", f"training.jit={jit}"])
    return make


CONFIGS = {"gpt": gpt_config, "qwen3": qwen3_config, "dsv3": dsv3_config,
           "dsv3_muon_allgather": dsv3_muon("allgather"),
           "dsv3_muon_deredundency": dsv3_muon("allgather_deredundency"),
           "dsv3_muon_layer": dsv3_muon("allgather_deredundency", "layer")}
#: the models of the gradient check (the Muon cases train the dsv3 model)
MODELS = ("gpt", "qwen3", "dsv3")
MUON_CASES = ("dsv3_muon_allgather", "dsv3_muon_deredundency", "dsv3_muon_layer")
