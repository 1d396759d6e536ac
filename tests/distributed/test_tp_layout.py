"""Tensor-parallel layout without msrun: which parameter is split how (models/tp_plan.py),
blocked ShardSpecs (the fused qkv), vocabulary and token ranges, and the sharded norm rule
(distributed/grad_reduce.gradient_norm over routes from the ShardSpecs), against numpy on the full tensors."""
import os

import numpy as np
import pytest
import yaml

from mindformers_core.distributed.shard_spec import (ShardSpec, local_indices, local_shape,
                                                      local_slice, shard, unshard)
from mindformers_core.models.tp_plan import (AttentionShape, is_partial_replicated,
                                                     token_range, tp_shard_spec, tp_shard_specs,
                                                     vocab_range)
from mindformers_core.distributed.grad_reduce import gradient_norm
from mindformers_core.distributed.grad_route import GradRoute
from mindformers_core.distributed.shard_spec import spec_norm_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def named_shapes(model_dict):
    from mindformers_core.models import build_model
    model = build_model(model_dict, seed=0, jit="none")
    return [(p.name, tuple(p.shape)) for p in model.get_parameters()], model


def test_gpt_layout_splits_heads_ffn_and_vocab():
    shapes, _ = named_shapes({"model_type": "gpt", "vocab_size": 32, "hidden_size": 32,
                              "num_layers": 1, "num_attention_heads": 4, "num_query_groups": 2,
                              "seq_length": 8, "ffn_hidden_size": 48})
    specs = tp_shard_specs(shapes, 2, AttentionShape(4, 2, 8))
    want = {"embedding.word_embeddings.weight": (0, (16, 32)),
            "output_layer.weight": (0, (16, 32)),
            "decoder.layers.0.self_attention.linear_qkv.weight": (0, (32, 32)),
            "decoder.layers.0.self_attention.linear_proj.weight": (1, (32, 16)),
            "decoder.layers.0.mlp.linear_fc1.weight": (0, (48, 32)),
            "decoder.layers.0.mlp.linear_fc2.weight": (1, (32, 24))}
    assert {k: (s.split_dim, local_shape(s)) for k, s in specs.items()} == want
    assert specs["decoder.layers.0.self_attention.linear_qkv.weight"].blocks == (32, 16, 16)
    # the norms are replicated and partial (their gradient is summed over tp)
    replicated = [n for n, _ in shapes if n not in specs]
    assert replicated == ["decoder.layers.0.input_layernorm.weight",
                          "decoder.layers.0.pre_mlp_layernorm.weight",
                          "decoder.final_layernorm.weight"]
    assert all(is_partial_replicated(n) for n in replicated)
    assert tp_shard_specs(shapes, 1, AttentionShape(4, 2, 8)) == {}


def test_fused_qkv_shard_holds_whole_local_heads_and_groups():
    n, g, d, h = 4, 2, 3, 5
    w = np.arange((n + 2 * g) * d * h, dtype=np.float32).reshape((n + 2 * g) * d, h)
    spec = tp_shard_spec("decoder.layers.0.self_attention.linear_qkv.weight", w.shape, 2,
                         AttentionShape(n, g, d))
    q, k, v = w[:n * d], w[n * d:(n + g) * d], w[(n + g) * d:]
    for r in range(2):
        want = np.concatenate([q[r * 2 * d:(r + 1) * 2 * d], k[r * d:(r + 1) * d],
                               v[r * d:(r + 1) * d]])
        np.testing.assert_array_equal(shard(spec, w, r), want)
    np.testing.assert_array_equal(unshard(spec, [shard(spec, w, r) for r in range(2)]), w)
    with pytest.raises(ValueError, match=r"a blocked spec \(blocks \(12, 6, 6\)\) is not one "
                                         r"slice"):
        local_slice(spec, 0)
    with pytest.raises(ValueError, match=r"needs the attention shape"):
        tp_shard_spec("decoder.layers.0.self_attention.linear_qkv.weight", w.shape, 2)


def test_blocked_spec_errors_and_single_block_is_the_plain_split():
    with pytest.raises(ValueError, match=r"blocks \(4, 3\) must be positive and sum to dim 0"):
        ShardSpec((8, 2), 0, "tp", 2, blocks=(4, 3))
    with pytest.raises(ValueError, match=r"block sizes \[7, 3\] of \(7, 3\) are not divisible by "
                                         r"the tp group size 2"):
        ShardSpec((10, 2), 0, "tp", 2, blocks=(7, 3))
    with pytest.raises(ValueError, match=r"a replicated parameter has no blocks"):
        ShardSpec((8, 2), None, blocks=(8,))
    one = ShardSpec((8, 2), 0, "tp", 2, blocks=(8,))
    np.testing.assert_array_equal(local_indices(one, 1), np.arange(4, 8))
    assert local_slice(one, 1) == local_slice(ShardSpec((8, 2), 0, "tp", 2), 1)


def test_interleaved_fc1_keeps_gate_up_pairs_together():
    f, h = 6, 4
    w = np.arange(2 * f * h, dtype=np.float32).reshape(2 * f, h)   # row 2i gate_i, 2i+1 up_i
    spec = tp_shard_spec("decoder.layers.3.mlp.linear_fc1.weight", w.shape, 2)
    for r in range(2):
        local = shard(spec, w, r)
        units = np.arange(r * f // 2, (r + 1) * f // 2)
        np.testing.assert_array_equal(local[0::2], w[2 * units])
        np.testing.assert_array_equal(local[1::2], w[2 * units + 1])


def test_deepseek_v3_layout_mla_column_over_heads_routed_experts_replicated():
    with open(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")) as fh:
        shapes, _ = named_shapes(yaml.safe_load(fh)["model"])
    specs = tp_shard_specs(shapes, 2, AttentionShape(4, 4, 16))
    att = "decoder.layers.0.self_attention."
    assert {k[len(att):]: (s.split_dim, local_shape(s)) for k, s in specs.items()
            if k.startswith(att)} == {"linear_q_up_proj.weight": (0, (48, 32)),
                                      "linear_kv_up_proj.weight": (0, (64, 32)),
                                      "linear_proj.weight": (1, (64, 32))}
    rep = {n for n, _ in shapes if n not in specs}
    assert {att + "linear_q_down_proj.weight", att + "linear_kv_down_proj.weight",
            att + "q_layernorm.weight", att + "kv_layernorm.weight"} <= rep
    moe = [n for n in rep if ".mlp." in n]
    assert sorted(moe) == ["decoder.layers.1.mlp.experts.weight1",
                           "decoder.layers.1.mlp.experts.weight2",
                           "decoder.layers.1.mlp.router.expert_bias",
                           "decoder.layers.1.mlp.router.weight"]
    assert not any(is_partial_replicated(n) for n in moe)          # complete on every rank
    shared = "decoder.layers.1.mlp.shared_experts."
    assert (specs[shared + "linear_fc1.weight"].split_dim,
            local_shape(specs[shared + "linear_fc1.weight"])) == (0, (64, 64))
    assert (specs[shared + "linear_fc2.weight"].split_dim,
            local_shape(specs[shared + "linear_fc2.weight"])) == (1, (64, 32))
    assert is_partial_replicated(att + "linear_kv_down_proj.weight")
    # per-head periodic rows: a contiguous half is heads 0-1 / 2-3 whole
    assert specs[att + "linear_q_up_proj.weight"].blocks is None


def test_mtp_depth_is_cut_as_a_decoder_layer_its_projection_and_norms_partial():
    """A multi-token prediction depth's transformer layer splits as a decoder layer does
    (heads, the shared experts' units); its enorm / hnorm / eh_proj / final norm are
    replicated with a partial gradient (they see this rank's tokens), its routed experts and
    router replicated and complete."""
    with open(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")) as fh:
        model = dict(yaml.safe_load(fh)["model"], num_nextn_predict_layers=1)
    shapes, _ = named_shapes(model)
    specs = tp_shard_specs(shapes, 2, AttentionShape(4, 4, 16))
    depth, layer = "mtp.layers.0.", "decoder.layers.1."
    for suffix in ("self_attention.linear_q_up_proj.weight",
                   "self_attention.linear_kv_up_proj.weight", "self_attention.linear_proj.weight",
                   "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight"):
        got, want = specs[depth + "transformer_layer." + suffix], specs[layer + suffix]
        assert (got.split_dim, local_shape(got)) == (want.split_dim, local_shape(want)), suffix
    own = [n for n, _ in shapes if n.startswith(depth) and ".transformer_layer." not in n]
    assert sorted(own) == [depth + "eh_proj.weight", depth + "enorm.weight",
                           depth + "final_layernorm.weight", depth + "hnorm.weight"]
    assert not set(own) & set(specs) and all(is_partial_replicated(n) for n in own)
    routed = depth + "transformer_layer.mlp.experts.weight1"
    assert routed not in specs and not is_partial_replicated(routed)


def test_vocab_and_token_ranges():
    assert [vocab_range(64, 4, r) for r in range(4)] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert token_range(32, 2, 1) == (16, 32)
    with pytest.raises(ValueError, match=r"tokens \(30\) is not divisible by the tp size \(4\)"):
        token_range(30, 4, 0)
    with pytest.raises(ValueError, match=r"index 2 is out of range for 2 parts"):
        vocab_range(64, 2, 2)


def test_tp_grad_norm_counts_replicated_once_and_sums_shards():
    rng = np.random.default_rng(1)
    specs = [None, ShardSpec((6, 4), 0, "tp", 2), ShardSpec((4, 6), 1, "tp", 2), None]
    full = [rng.standard_normal((4,)), rng.standard_normal((6, 4)),
            rng.standard_normal((4, 6)), rng.standard_normal((3, 2))]
    want = np.sqrt(sum(float(np.sum(g ** 2)) for g in full))

    def local(r):
        return [g if s is None else shard(s, g, r) for g, s in zip(full, specs)]

    def bucket_norm(gs):
        return np.sqrt(sum(float(np.sum(np.asarray(g) ** 2)) for g in gs))

    sharded_sq = [sum(float(np.sum(g ** 2)) for g, s in zip(local(r), specs) if s is not None)
                  for r in range(2)]
    for r in range(2):
        def group_sum(group, x):
            assert group == "tp" and x == pytest.approx(sharded_sq[r], rel=1e-12)
            return sum(sharded_sq)
        routes = [GradRoute(("dp",), norm_group=spec_norm_group(s)) for s in specs]
        assert gradient_norm(local(r), routes, group_sum,
                             bucket_norm=bucket_norm) == pytest.approx(want, rel=1e-12)
