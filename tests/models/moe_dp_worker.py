"""msrun worker of the MoE data-parallel test: the real Trainer on the tiny all-MoE-after-layer-0
DeepSeek-V3 (``moe_dp_config``) into OUT_DIR.

    python tests/models/moe_dp_worker.py OUT_DIR
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def moe_dp_config(out_dir: str):
    """4 steps of the recipe's model at global batch 4 (2 micro-batches on one process, one per
    rank on two), a strong expert-bias rate so the update shows in 4 steps."""
    from mindformers_core.config import load_config
    root = os.path.dirname(os.path.dirname(HERE))
    return load_config(os.path.join(root, "configs", "muon_deepseek_v3_tiny.yaml"), [
        "training.steps=4", "training.local_batch_size=2", "training.global_batch_size=4",
        "model.moe_router_bias_update_rate=0.01", "model.n_group=2", "model.topk_group=1",
        f"checkpoint.save_path={os.path.join(out_dir, 'ckpt')}"])


if __name__ == "__main__":
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(moe_dp_config(sys.argv[1]), sys.argv[1]).train()
