"""Muon piece splitting: rules per weight name, exact piece contents, merge round trip, errors."""
import numpy as np
import pytest
from mindspore import Tensor

from mindformers_core.models.transformer_config import GPTTransformerConfig
from mindformers_core.optim.muon_split import (SplitRule, merge_pieces, piece_shapes,
                                               split_pieces, split_rule_for)

MLA = GPTTransformerConfig(multi_latent_attention=True, hidden_size=32, num_layers=1,
                           num_attention_heads=3, num_query_groups=3, kv_channels=8,
                           ffn_hidden_size=16, q_lora_rank=8, kv_lora_rank=10, qk_head_dim=4,
                           qk_pos_emb_head_dim=2, v_head_dim=5)
GPT = GPTTransformerConfig(multi_latent_attention=False, hidden_size=32, num_layers=1,
                           num_attention_heads=4, num_query_groups=2, kv_channels=8,
                           ffn_hidden_size=16)
A = "decoder.layers.0.self_attention."


def _round_trip(rule, x):
    pieces = split_pieces(rule, Tensor(x))
    back = merge_pieces(rule, pieces, x.shape).asnumpy()
    np.testing.assert_array_equal(back, x)
    assert [tuple(p.shape) for p in pieces] == piece_shapes(rule, x.shape)
    return [p.asnumpy() for p in pieces]


def test_q_up_proj_periodic_nope_rope_per_head():
    x = np.arange(3 * 6 * 8, dtype=np.float32).reshape(18, 8)
    rule = split_rule_for(A + "linear_q_up_proj.weight", x.shape, MLA)
    assert rule == SplitRule("periodic", (4, 2))
    nope, rope = _round_trip(rule, x)
    np.testing.assert_array_equal(nope, x[[h * 6 + r for h in range(3) for r in range(4)]])
    np.testing.assert_array_equal(rope, x[[h * 6 + 4 + r for h in range(3) for r in range(2)]])
    assert split_rule_for(A + "linear_q_proj.weight", x.shape, MLA) == rule


def test_kv_up_and_kv_down():
    x = np.random.default_rng(0).standard_normal((27, 10)).astype(np.float32)
    rule = split_rule_for(A + "linear_kv_up_proj.weight", x.shape, MLA)
    knope, v = _round_trip(rule, x)
    np.testing.assert_array_equal(v, x[[h * 9 + 4 + r for h in range(3) for r in range(5)]])
    down = np.random.default_rng(1).standard_normal((12, 32)).astype(np.float32)
    c_kv, k_pe = _round_trip(split_rule_for(A + "linear_kv_down_proj.weight", down.shape, MLA), down)
    np.testing.assert_array_equal(k_pe, down[10:])


def test_interleaved_fc1_and_expert_halves():
    fc1 = np.random.default_rng(2).standard_normal((8, 6)).astype(np.float32)
    gate, up = _round_trip(split_rule_for("decoder.layers.0.mlp.linear_fc1.weight", fc1.shape, MLA), fc1)
    np.testing.assert_array_equal(gate, fc1[0::2])
    np.testing.assert_array_equal(up, fc1[1::2])
    w1 = np.random.default_rng(3).standard_normal((2, 6, 8)).astype(np.float32)
    g, u = _round_trip(split_rule_for("decoder.layers.1.mlp.experts.weight1", w1.shape, MLA), w1)
    np.testing.assert_array_equal(u, w1[..., 4:])
    w2 = np.zeros((2, 4, 6), np.float32)
    assert split_rule_for("decoder.layers.1.mlp.experts.weight2", w2.shape, MLA) == SplitRule()


def test_gpt_qkv_blocks_and_unsplit_mode():
    qkv = np.random.default_rng(4).standard_normal((64, 32)).astype(np.float32)
    rule = split_rule_for(A + "linear_qkv.weight", qkv.shape, GPT)
    assert rule == SplitRule("blocks", (32, 16, 16))
    q, k, v = _round_trip(rule, qkv)
    np.testing.assert_array_equal(k, qkv[32:48])
    assert split_rule_for(A + "linear_q_up_proj.weight", (18, 8), MLA, split_qkv=False) == SplitRule()
    fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
    assert split_rule_for(fc1, (8, 6), MLA, split_qkv=False) == SplitRule()
    # the 3-D expert halves are gate and up, two different matrices: kept in either mode
    assert split_rule_for("experts.weight1", (2, 6, 8), MLA, split_qkv=False).kind == "halves"
    assert split_rule_for(A + "linear_proj.weight", (32, 15), MLA) == SplitRule()


def test_shape_mismatches_are_errors():
    with pytest.raises(ValueError, match="has 17 rows, not a multiple of the per-head period 4 \\+ 2"):
        split_rule_for(A + "linear_q_up_proj.weight", (17, 8), MLA)
    with pytest.raises(ValueError, match=r"row blocks \[10, 2\] sum to 12"):
        split_rule_for(A + "linear_kv_down_proj.weight", (13, 32), MLA)
    with pytest.raises(ValueError, match="odd last dim"):
        split_rule_for("experts.weight1", (2, 6, 7), MLA)
