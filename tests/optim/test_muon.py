"""Muon: numpy parity over 20 steps, routing, pieces, momentum, state, accumulation, bf16."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.models.build import build_model
from mindformers_core.optim.muon import LocalExchange, Muon
from mindformers_core.optim.newton_schulz import normalize_ns_schedule

from _muon_numpy_reference import NumpyMuon

TINY = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
        "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 8, "ffn_hidden_size": 64, "n_routed_experts": 2,
        "num_experts_per_tok": 1, "moe_intermediate_size": 16, "seq_length": 8}
SCHEDULE = normalize_ns_schedule([3.4445, -4.7750, 2.0315], 5)


def tiny_model(**overrides):
    return build_model(dict(TINY, **overrides), seed=0)


def _grads(params, rng, scale=1.0):
    return [Tensor((scale * rng.standard_normal(p.shape)).astype(np.float32)) for p in params]


def _numpy_of(params):
    return {p.name: p.asnumpy().astype(np.float64) for p in params}


def _assert_rel_close(got, want, rel=1e-5):
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < rel, err


def test_matches_numpy_reference_over_20_steps():
    model = tiny_model()
    # the MoE layer (every piece kind: MLA q/kv, fc1 of the shared expert, grouped experts),
    # plus the AdamW-routed embedding, output layer and norms; layer 0 adds nothing new
    params = [p for p in model.trainable_params() if not p.name.startswith("decoder.layers.0.")]
    opt = Muon(params, model=model, lr=0.02, weight_decay=0.1, qk_clip_enabled=False,
               adamw_lr_mult=0.5)
    ref = NumpyMuon(_numpy_of(params), opt.muon_param_names, model.get_gpt_transformer_config(),
                    SCHEDULE, lr_mult_adamw=0.5)
    rng = np.random.default_rng(0)
    for step in range(20):
        lr = 0.02 * (1.0 - step / 40)                 # a schedule: every group gets it
        opt.set_lr(lr)
        grads = _grads(params, rng)
        opt.step(grads)
        ref.step({p.name: g.asnumpy() for p, g in zip(params, grads)}, lr)
    sd = opt.state_dict()
    for p in params:
        _assert_rel_close(p.asnumpy().astype(np.float64), ref.p[p.name])
        key = f"muon_m.{p.name}" if p.name in ref.muon else f"adam_v.{p.name}"
        _assert_rel_close(sd[key], ref.m[p.name] if p.name in ref.muon else ref.v[p.name])


def test_plain_momentum_and_unsplit_matrices_match_reference():
    model = tiny_model(num_layers=1)
    params = model.trainable_params()
    opt = Muon(params, model=model, lr=0.05, nesterov=False, muon_split_qkv=False,
               qk_clip_enabled=False, weight_decay=0.0)
    ref = NumpyMuon(_numpy_of(params), opt.muon_param_names, model.get_gpt_transformer_config(),
                    SCHEDULE, nesterov=False, wd=0.0, split=False)
    assert opt.piece_shapes_of("decoder.layers.0.mlp.linear_fc1.weight") == [(128, 32)]
    rng = np.random.default_rng(1)
    for _ in range(3):
        grads = _grads(params, rng)
        opt.step(grads)
        ref.step({p.name: g.asnumpy() for p, g in zip(params, grads)}, 0.05)
    for p in params:
        _assert_rel_close(p.asnumpy().astype(np.float64), ref.p[p.name])


def test_update_rms_is_matched_adamw_rms_times_lr():
    # spectral scale: an orthogonal (A, B) piece has RMS 1/sqrt(max(A, B)), so the update
    # RMS is about lr * 0.2 whatever the shape (why Muon's lr transfers across
    # widths, docs/muon.md).
    model = tiny_model(num_layers=1)
    name = "decoder.layers.0.self_attention.linear_proj.weight"
    p = next(q for q in model.trainable_params() if q.name == name)
    opt = Muon([p], model=model, lr=0.01, weight_decay=0.0, qk_clip_enabled=False)
    before = p.asnumpy().copy()
    opt.step([Tensor(np.random.default_rng(2).standard_normal(p.shape).astype(np.float32))])
    rms = np.sqrt(np.mean((p.asnumpy() - before) ** 2))
    assert 0.6 * 0.002 < rms < 1.2 * 0.002


def test_routing_defaults_embeddings_and_output_to_adamw():
    model = tiny_model()
    opt = Muon(model.trainable_params(), model=model)
    assert "embedding.word_embeddings.weight" in opt.adamw_param_names
    assert "output_layer.weight" in opt.adamw_param_names
    assert "decoder.layers.1.mlp.experts.weight1" in opt.muon_param_names
    assert all(len(p.shape) >= 2 for p in opt.parameters if p.name in opt.muon_param_names)
    assert all(p.name in opt.adamw_param_names for p in opt.parameters if len(p.shape) == 1)
    sd = opt.state_dict()
    assert "adam_m.output_layer.weight" in sd and "adam_v.embedding.word_embeddings.weight" in sd
    assert "muon_m.decoder.layers.0.mlp.linear_fc1.weight" in sd
    assert "adam_m.decoder.layers.0.mlp.linear_fc1.weight" not in sd
    assert "muon_m.output_layer.weight" not in sd


def test_adamw_include_replaces_the_defaults():
    model = tiny_model()
    opt = Muon(model.trainable_params(), model=model, adamw_include=["*linear_proj*"])
    assert "embedding.word_embeddings.weight" in opt.muon_param_names
    assert "output_layer.weight" in opt.muon_param_names
    assert "decoder.layers.0.self_attention.linear_proj.weight" in opt.adamw_param_names
    bare = Muon(model.trainable_params(), model=model, adamw_include="*output_layer*")
    assert "output_layer.weight" in bare.adamw_param_names
    assert "embedding.word_embeddings.weight" in bare.muon_param_names


def test_group_optimizer_key_wins_over_patterns():
    model = tiny_model(num_layers=1)
    params = model.trainable_params()
    fc1 = [p for p in params if p.name.endswith("linear_fc1.weight")]
    rest = [p for p in params if not p.name.endswith("linear_fc1.weight")]
    opt = Muon([{"params": fc1, "optimizer": "adamw"}, {"params": rest}], model=model)
    assert fc1[0].name in opt.adamw_param_names
    norm = [p for p in params if len(p.shape) == 1][:1]
    with pytest.raises(ValueError, match="needs a 2-D or grouped-expert 3-D weight"):
        Muon([{"params": norm, "optimizer": "muon"}], model=model)
    with pytest.raises(ValueError, match="Muon groups take optimizer 'muon' or 'adamw'"):
        Muon([{"params": norm, "optimizer": "sgd"}], model=model)


def test_pieces_follow_the_model_layouts():
    model = tiny_model()
    opt = Muon(model.trainable_params(), model=model)
    pre = "decoder.layers.0.self_attention."
    assert opt.piece_shapes_of(pre + "linear_q_up_proj.weight") == [(16, 8), (8, 8)]
    assert opt.piece_shapes_of(pre + "linear_kv_up_proj.weight") == [(16, 16), (16, 16)]
    assert opt.piece_shapes_of(pre + "linear_kv_down_proj.weight") == [(16, 32), (4, 32)]
    assert opt.piece_shapes_of(pre + "linear_proj.weight") == [(32, 16)]
    assert opt.piece_shapes_of("decoder.layers.0.mlp.linear_fc1.weight") == [(64, 32), (64, 32)]
    assert opt.piece_shapes_of("decoder.layers.1.mlp.experts.weight1") == [(2, 32, 16), (2, 32, 16)]
    assert opt.piece_shapes_of("decoder.layers.1.mlp.experts.weight2") == [(2, 16, 32)]
    with pytest.raises(ValueError, match="is not updated by Muon"):
        opt.piece_shapes_of("output_layer.weight")


def test_newton_schulz_does_not_overwrite_the_momentum_buffer():
    model = tiny_model(num_layers=1)
    name = "decoder.layers.0.mlp.linear_fc2.weight"
    p = next(q for q in model.trainable_params() if q.name == name)
    opt = Muon([p], model=model, nesterov=False, qk_clip_enabled=False)
    g = np.random.default_rng(3).standard_normal(p.shape).astype(np.float32)
    opt.step([Tensor(g)])
    np.testing.assert_array_equal(opt.state_dict()[f"muon_m.{name}"], g)   # m = 0.95*0 + g
    opt.step([Tensor(g)])
    np.testing.assert_allclose(opt.state_dict()[f"muon_m.{name}"], 1.95 * g, rtol=1e-6)


def test_none_gradient_leaves_parameter_and_state_alone():
    model = tiny_model(num_layers=1)
    params = model.trainable_params()
    opt = Muon(params, model=model, qk_clip_enabled=False)
    before = [p.asnumpy().copy() for p in params]
    grads = _grads(params, np.random.default_rng(4))
    grads[1] = None
    grads[-1] = None
    opt.step(grads)
    np.testing.assert_array_equal(params[1].asnumpy(), before[1])
    np.testing.assert_array_equal(params[-1].asnumpy(), before[-1])
    assert not np.array_equal(params[0].asnumpy(), before[0])
    with pytest.raises(ValueError, match="Muon.step got 2 gradients"):
        opt.step(grads[:2])


def test_state_dict_round_trip_resumes_bit_for_bit():
    rng = np.random.default_rng(5)
    grads = [_grads(tiny_model(num_layers=1).trainable_params(), rng) for _ in range(4)]
    model_a = tiny_model(num_layers=1)
    opt_a = Muon(model_a.trainable_params(), model=model_a, qk_clip_enabled=False)
    for g in grads[:2]:
        opt_a.step(g)
    sd = opt_a.state_dict()
    weights = {p.name: p.asnumpy().copy() for p in model_a.trainable_params()}
    assert sd["global_step"] == 2
    model_b = tiny_model(num_layers=1)
    for p in model_b.trainable_params():
        p.set_data(Tensor(weights[p.name]))
    opt_b = Muon(model_b.trainable_params(), model=model_b, qk_clip_enabled=False)
    opt_b.load_state_dict(sd)
    for g in grads[2:]:
        opt_a.step(g)
        opt_b.step(g)
    for pa, pb in zip(model_a.trainable_params(), model_b.trainable_params()):
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy())
    sd_a, sd_b = opt_a.state_dict(), opt_b.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        np.testing.assert_array_equal(sd_a[k], sd_b[k])


def test_bf16_params_get_fp32_masters_and_tiny_updates_land():
    model = tiny_model(num_layers=1, params_dtype="bfloat16")
    params = model.trainable_params()
    opt = Muon(params, model=model, lr=1e-5, qk_clip_enabled=False)
    sd = opt.state_dict()
    assert all(f"main_param.{p.name}" in sd for p in params)
    name = "decoder.layers.0.mlp.linear_fc2.weight"
    i = [p.name for p in params].index(name)
    master0 = sd[f"main_param.{name}"].copy()
    for _ in range(3):
        opt.step(_grads(params, np.random.default_rng(6)))
    master = opt.state_dict()[f"main_param.{name}"]
    assert np.abs(master - master0).max() > 0           # moved in fp32 even if bf16 rounds it away
    np.testing.assert_array_equal(params[i].astype(ms.float32).asnumpy(),
                                  Tensor(master).astype(ms.bfloat16).astype(ms.float32).asnumpy())


def test_lion_scalar_branch():
    model = tiny_model(num_layers=1)
    params = model.trainable_params()
    opt = Muon(params, model=model, lr=0.01, weight_decay=0.0, muon_scalar_optimizer="lion",
               qk_clip_enabled=False, adamw_lr_mult=0.5)
    name = "output_layer.weight"
    p = params[[q.name for q in params].index(name)]
    before = p.asnumpy().copy()
    grads = _grads(params, np.random.default_rng(7))
    opt.step(grads)
    g = grads[[q.name for q in params].index(name)].asnumpy()
    # first step: m = 0 -> c = (1 - b1) g, update = -lr * sign(g)
    np.testing.assert_allclose(p.asnumpy(), before - 0.005 * np.sign(g), atol=1e-7)
    sd = opt.state_dict()
    assert f"lion_m.{name}" in sd and f"adam_m.{name}" not in sd
    np.testing.assert_allclose(sd[f"lion_m.{name}"], (1 - 0.98) * g, rtol=1e-6)


def test_one_step_on_4_accumulated_micro_batches_equals_one_big_batch():
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 64, (4, 8)).astype(np.int32)
    labels = rng.integers(0, 64, (4, 8)).astype(np.int32)
    mask = np.ones((4, 8), np.float32)
    mask[1, 5:] = 0                                  # unequal token counts per micro-batch

    def run(micro):
        model = tiny_model(num_layers=1)
        params = model.trainable_params()
        opt = Muon(params, model=model, lr=0.02, qk_clip_enabled=False)

        def loss_sum(i, l, m):
            s, _, _ = model(i, l, m)
            return s
        grad_fn = ms.grad(loss_sum, grad_position=None, weights=params)
        total = float(mask.sum())
        acc = None
        for k in range(0, 4, 4 // micro):
            sl = slice(k, k + 4 // micro)
            gs = grad_fn(Tensor(ids[sl]), Tensor(labels[sl]), Tensor(mask[sl]))
            gs = [g / total for g in gs]             # token-weighted: sum of token losses / tokens
            acc = gs if acc is None else [a + g for a, g in zip(acc, gs)]
        opt.step(acc)
        assert opt.global_step == 1
        return {p.name: p.asnumpy() for p in params}, opt.state_dict()

    one, sd1 = run(1)
    four, sd4 = run(4)
    for k in one:
        np.testing.assert_allclose(four[k], one[k], rtol=1e-5, atol=1e-6)
    for k in sd1:
        if k.startswith("muon_m."):
            np.testing.assert_allclose(sd4[k], sd1[k], rtol=1e-4, atol=1e-6)


def test_3d_experts_weight_is_orthogonalised_per_expert():
    """A 3-D ``experts.weight`` [E, A, B] goes to Muon (upstream's routing) and each expert's
    matrix gets its own Newton-Schulz and sqrt(max(A, B)) scale: equal to the numpy reference
    run on each expert's 2-D matrix alone."""
    from mindspore import Parameter
    model = tiny_model()
    rng = np.random.default_rng(3)
    w = Parameter(Tensor(rng.standard_normal((3, 8, 5)).astype(np.float32)),
                  name="decoder.layers.1.mlp.experts.weight")
    opt = Muon([w], model=model, lr=0.02, weight_decay=0.1, qk_clip_enabled=False)
    assert list(opt.muon_param_names) == ["decoder.layers.1.mlp.experts.weight"]
    cfg = model.get_gpt_transformer_config()
    w0 = w.asnumpy().astype(np.float64)
    per_expert = [NumpyMuon({"e": w0[e]}, ["e"], cfg, SCHEDULE) for e in range(3)]
    grads = [rng.standard_normal((3, 8, 5)).astype(np.float32) for _ in range(3)]
    for g in grads:
        opt.set_lr(0.02)
        opt.step([Tensor(g)])
        for e, ref in enumerate(per_expert):
            ref.step({"e": g[e]}, 0.02)
    got = w.asnumpy().astype(np.float64)
    for e, ref in enumerate(per_expert):
        _assert_rel_close(got[e], ref.p["e"])
    # the reference's own 3-D path (a batch over the first dim) agrees
    batched = NumpyMuon({"w": w0}, ["w"], cfg, SCHEDULE)
    for g in grads:
        batched.step({"w": g}, 0.02)
    _assert_rel_close(got, batched.p["w"])


class _CountingExchange(LocalExchange):
    """The one-process exchange, recording the shape of every batched NS call."""

    def __init__(self):
        self.calls = []

    def on_newton_schulz(self, shapes) -> None:
        self.calls.append([tuple(s) for s in shapes])


def test_batched_ns_across_layers_equals_one_matrix_per_call():
    """Equal-shape pieces of every layer (and each layer's experts) run as one batched NS;
    with an NS memory budget too small for two pieces every piece runs on its own. The
    updates agree within rel 1e-6 (fp32), over 3 steps of a 3-layer MoE model."""
    model = tiny_model(num_layers=3)
    params = model.trainable_params()
    init = [p.asnumpy() for p in params]
    rng = np.random.default_rng(5)
    grads = [_grads(params, rng) for _ in range(3)]

    def run(budget_gb):
        for p, v in zip(params, init):
            p.set_data(Tensor(v))
        opt = Muon(params, model=model, lr=0.02, weight_decay=0.1, qk_clip_enabled=False,
                   ns_batch_memory_gb=budget_gb)
        exchange = _CountingExchange()
        opt.use_exchange(exchange)
        for g in grads:
            opt.step(g)
        return [p.asnumpy() for p in params], exchange.calls

    batched, calls = run(1.0)
    single, single_calls = run(1e-9)
    # per step: one call per distinct piece shape, stacking pieces from different layers
    per_step = len(calls) // 3
    assert max(len(c) for c in calls) >= 2
    assert all(len(c) == 1 for c in single_calls) and len(single_calls) > len(calls)
    expert_pieces = [s for c in calls for s in c if len(s) == 3]
    assert expert_pieces and all(s[0] == TINY["n_routed_experts"] for s in expert_pieces)
    assert per_step == len({s[-2:] for c in calls[:per_step] for s in c})
    for got, want in zip(batched, single):
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
        assert err <= 1e-6, err
