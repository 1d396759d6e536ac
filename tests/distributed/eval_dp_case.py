"""The held-out evaluation run of ``test_eval_msrun.py``: 4 steps of a tiny GPT on PydocText
with 2% held out, an evaluation every 2 steps over 3 batches, global batch 4 (2 workers x
local batch 2, or 1 process x local batch 4)."""


def config(path, local_batch: int) -> str:
    """Write the run's config yaml to ``path`` (its path back)."""
    import yaml
    cfg = {
        "training": {"steps": 4, "local_batch_size": local_batch, "global_batch_size": 4,
                     "seed": 9, "eval_interval": 2, "eval_steps": 3},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 3e-3, "warmup_steps": 0},
        "model": {"vocab_size": 256, "hidden_size": 16, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 16},
        "train_dataset": {"type": "PydocText", "validation_split": 0.02},
        "checkpoint": {"enable_save": False},
    }
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(cfg, fh)
    return str(path)


def run(run_dir: str, local_batch: int) -> None:
    """The Trainer on that config into ``run_dir`` (the layout matrix's case ``eval_dp`` with
    local batch 2 on each of 2 workers; the 1-process reference with 4)."""
    import os
    import mindspore as ms
    from mindformers_core.config import load_config
    from mindformers_core.trainer import Trainer
    os.makedirs(run_dir, exist_ok=True)
    path = config(os.path.join(run_dir, f"eval_dp_lb{local_batch}.yaml"), local_batch)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(load_config(path), run_dir).train()
