"""Closed forms of the step line's pure parts: parameter counts, FLOPs per token, MFU, ETA,
and the scalars TensorBoard gets from a metrics row."""
import pytest

from mindformers_core.trainer.tensorboard import scalars_of_row
from mindformers_core.trainer.throughput import (eta_seconds, flops_per_token, format_duration,
                                                 mfu, param_counts, rss_bytes)


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
