"""Closed forms of the step line's pure parts: parameter counts, FLOPs per token, MFU, ETA,
and the scalars TensorBoard gets from a metrics row."""
import pytest

from mindformers_core.trainer.tensorboard import scalars_of_row
from mindformers_core.config.model import ModelConfig
from mindformers_core.trainer.throughput import (attention_widths, eta_seconds, flops_per_token,
                                                 format_duration, mfu, param_counts, rss_bytes)


def test_param_counts_split_embedding_and_the_rest():
    sizes = {"embedding.word_embeddings.weight": 256 * 64, "output_layer.weight": 256 * 64,
             "decoder.layers.0.mlp.linear_fc1.weight": 64 * 256, "decoder.final_layernorm.weight": 64}
    c = param_counts(sizes)
    assert c == {"total": 3 * 256 * 64 + 64, "embedding": 2 * 256 * 64,
                 "non_embedding": 256 * 64 + 64, "output_layer": 256 * 64}


def test_flops_per_token_is_the_palm_count():
    c = {"non_embedding": 1000, "output_layer": 500}
    assert flops_per_token(c, num_layers=2, hidden_size=8, seq_length=16, vocab_size=50) == \
        6 * (1000 + 500) + 12 * 2 * 8 * 16
    tied = {"non_embedding": 1000, "output_layer": 0}
    assert flops_per_token(tied, 2, 8, 16, vocab_size=50, tied=True) == \
        6 * (1000 + 50 * 8) + 12 * 2 * 8 * 16


def test_attention_term_uses_the_attention_widths():
    """Scores (q.k over the query/key head dim) and the weighted sum (over the value head dim)
    per layer and token: 2 FLOPs x 3 (forward + backward) x seq x width each."""
    c = {"non_embedding": 1000, "output_layer": 500}
    assert flops_per_token(c, 2, 8, 16, 50, attention_widths=(12, 4)) == \
        6 * 1500 + 6 * 2 * 16 * (12 + 4)
    gpt = ModelConfig(hidden_size=64, num_attention_heads=4)
    assert attention_widths(gpt) == (64, 64)     # PaLM's 12 * L * H * T
    qwen = ModelConfig(model_type="qwen3", hidden_size=64, num_attention_heads=4, kv_channels=32)
    assert attention_widths(qwen) == (128, 128)
    mla = ModelConfig(model_type="deepseek_v3", hidden_size=64, num_attention_heads=2,
                      qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
    assert attention_widths(mla) == (48, 24)


def test_mfu_eta_and_durations():
    assert mfu(1000.0, 1e6, 1e11, devices=2) == pytest.approx(1000 * 1e6 / 2e11)
    assert eta_seconds(10, 30, 5.0) == 15.0 and eta_seconds(0, 30, 5.0) is None
    assert format_duration(125) == "2:05" and format_duration(3725) == "1:02:05"
    assert format_duration(None) == "?"
    assert rss_bytes() > 10 * 2 ** 20       # this Python process holds more than 10 MB


def test_scalars_of_a_metrics_row():
    row = {"step": 3, "loss": 2.5, "lrs": [1e-3, 2e-3], "clipped": True, "eval_ppl": None,
           "grad_norm": float("nan"), "tokens": 64}
    assert scalars_of_row(row) == {"loss": 2.5, "lrs/0": 1e-3, "lrs/1": 2e-3, "tokens": 64.0}


def test_parameter_counts_of_a_sharded_model_are_the_whole_models():
    """MFU's FLOPs per token come from the whole model's counts under every layout: a rank that
    stores shards (tensor / expert parallel, FSDP; here FSDP's rows of 2, kept on one process)
    counts each at its full shape (ParallelRun.parameter_sizes)."""
    import numpy as np
    from mindformers_core.config import load_config
    from mindformers_core.distributed.fsdp import shard_model
    from mindformers_core.distributed.fsdp_layout import fsdp_specs
    from mindformers_core.distributed.setup import setup_parallel
    from mindformers_core.models import build_model
    cfg = load_config({"training": {"steps": 1}, "optimizer": {"type": "AdamW"},
                       "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
                       "model": {"vocab_size": 64, "hidden_size": 16, "num_layers": 2,
                                 "num_attention_heads": 2, "seq_length": 8}})
    model = build_model(cfg.model, seed=1)
    whole = {p.name: int(np.prod(p.shape)) for p in model.get_parameters()}
    run = setup_parallel(cfg)
    assert run.parameter_sizes(model) == whole
    specs = fsdp_specs([(p.name, tuple(p.shape)) for p in model.trainable_params()], 2)
    shard_model(model, specs, 0)
    held = {p.name: int(np.prod(p.shape)) for p in model.get_parameters()}
    assert sum(held.values()) < sum(whole.values())   # the rows of 2 are held
    assert run.parameter_sizes(model) == whole
    counts = param_counts(run.parameter_sizes(model))
    assert counts["total"] == sum(whole.values())
