"""The smallest full run config of the trainer tests (a 1-layer GPT, 2 samples per step)."""
from mindformers_core.config import load_config

LR = {"type": "ConstantWarmUpLR", "learning_rate": 1.e-3, "warmup_steps": 0}


def tiny_run_cfg(steps, training=None, optimizer=None, model=None, lr=None, checkpoint=None):
    """``load_config`` of the tiny run; each argument updates its section."""
    sections = {
        "training": {"steps": steps, "local_batch_size": 2, "global_batch_size": 2, "seed": 3},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": dict(LR),
        "model": {"model_type": "gpt", "vocab_size": 16, "hidden_size": 8, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 4},
    }
    for name, extra in (("training", training), ("optimizer", optimizer), ("model", model)):
        sections[name].update(extra or {})
    if lr is not None:
        sections["lr_scheduler"] = lr
    if checkpoint is not None:
        sections["checkpoint"] = checkpoint
    return load_config(sections)
