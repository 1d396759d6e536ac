"""``model_type: qwen3``: the GPT decoder with per-head q/k RMSNorm before RoPE and an explicit
head dim. Logits, loss and every gradient against the independent float64 numpy reference
(tests/models/model_numpy_reference.py), the compiled modes against PyNative, the norm's
invariance, and a few Trainer steps."""
import io
import os

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.config import load_config
from mindformers_core.config.model import ModelConfig
from mindformers_core.models import build_model
from model_test_utils import T, assert_grads_match_fd, batch, objective_and_grads
import model_numpy_reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_qwen3(**kw) -> ModelConfig:
    """GQA (4 heads, 2 groups) with head dim 6 != hidden / heads (4), untied."""
    base = dict(model_type="qwen3", vocab_size=32, hidden_size=16, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                intermediate_size=24, seq_length=8, initializer_range=0.2)
    base.update(kw)
    return ModelConfig.from_dict(base, "model")


def test_parameters_are_the_gpt_ones_plus_per_head_q_and_k_norms():
    model = build_model(tiny_qwen3(), seed=0)
    shapes = {p.name: tuple(p.shape) for p in model.get_parameters()}
    a = "decoder.layers.1.self_attention."
    assert shapes[a + "q_layernorm.weight"] == (6,) and shapes[a + "k_layernorm.weight"] == (6,)
    assert shapes[a + "linear_qkv.weight"] == ((4 + 2 * 2) * 6, 16)
    assert shapes[a + "linear_proj.weight"] == (16, 4 * 6)
    assert "output_layer.weight" in shapes
    np.testing.assert_array_equal(model.decoder.layers[0].self_attention.q_layernorm.weight
                                  .asnumpy(), 1.0)
    tc = model.get_gpt_transformer_config()
    assert (tc.kv_channels, tc.num_query_groups, tc.multi_latent_attention) == (6, 2, False)
    plain = build_model(tiny_qwen3(qk_layernorm=False), seed=0)
    assert not [p.name for p in plain.get_parameters() if "q_layernorm" in p.name]
    # the memory planner (--check) counts what is built
    from mindformers_core.core.memory_plan import param_counts
    for cfg, built in ((tiny_qwen3(), model), (tiny_qwen3(qk_layernorm=False), plain)):
        assert param_counts(cfg).total == sum(p.size for p in built.trainable_params())


@pytest.mark.parametrize("kw", [{}, {"tie_word_embeddings": True, "num_key_value_heads": 4},
                                {"head_dim": None}, {"qk_layernorm": False}],
                         ids=["gqa", "tied_mha", "derived_head_dim", "no_qk_norm"])
def test_logits_and_loss_match_numpy_reference(kw):
    cfg = tiny_qwen3(**kw)
    model = build_model(cfg, seed=3)
    P = ref.params_of(model)
    # non-trivial norm gains, so that a wrong gain (or q/k swapped) shows
    rng = np.random.RandomState(0)
    for p in model.get_parameters():
        if p.name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
            P[p.name] = 1.0 + 0.5 * rng.standard_normal(p.shape)
            p.set_data(T(P[p.name].astype(np.float32)))
    P = ref.params_of(model)
    ids, labels, mask = batch(cfg)
    np.testing.assert_allclose(model.logits(T(ids)).asnumpy(), ref.forward(P, cfg, ids),
                               rtol=2e-4, atol=2e-5)
    loss, n, aux = model(T(ids), T(labels), T(mask))
    want, _ = ref.loss_sum(P, cfg, ids, labels, mask)
    assert loss.asnumpy() == pytest.approx(want, rel=1e-4)
    assert n.asnumpy() == pytest.approx(mask.sum()) and float(aux.asnumpy()) == 0.0


def test_every_gradient_matches_finite_differences_of_the_reference():
    cfg = tiny_qwen3()
    model = build_model(cfg, seed=1)
    ids, labels, mask = batch(cfg, b=2, s=5, seed=1)
    value, params, grads = objective_and_grads(model, ids, labels, mask)
    P = ref.params_of(model)

    def objective(P):
        return ref.loss_sum(P, cfg, ids, labels, mask)[0] / mask.sum()

    assert value == pytest.approx(objective(P), rel=1e-4)
    named = [(p.name, g.asnumpy().astype(np.float64)) for p, g in zip(params, grads)]
    assert any(name.endswith("k_layernorm.weight") for name, _ in named)
    checked = assert_grads_match_fd(named, P, objective, np.random.RandomState(1))
    assert checked == 2 * len(params)


def test_query_and_key_scale_is_normalised_away():
    """RMSNorm per head: scaling the q and k rows of linear_qkv leaves the logits as they were
    (up to eps), which without the norm would sharpen every softmax."""
    cfg = tiny_qwen3(norm_epsilon=1e-12)
    ids, _, _ = batch(cfg)
    for qk_norm, same in ((True, True), (False, False)):
        model = build_model(tiny_qwen3(norm_epsilon=1e-12, qk_layernorm=qk_norm), seed=2)
        before = model.logits(T(ids)).asnumpy()
        for layer in model.decoder.layers:
            w = layer.self_attention.linear_qkv.weight
            scaled = w.asnumpy().copy()
            scaled[:(4 + 2) * 6] *= 7.0     # the q block and the k block
            w.set_data(T(scaled))
        after = model.logits(T(ids)).asnumpy()
        assert np.allclose(after, before, rtol=1e-4, atol=1e-5) == same


@pytest.mark.parametrize("jit", ["layer", "model"])
def test_compiled_modes_equal_pynative_loss_and_gradients(jit):
    cfg = tiny_qwen3()
    ids, labels, mask = batch(cfg, seed=4)
    eager = objective_and_grads(build_model(cfg, seed=4), ids, labels, mask)
    compiled_model = build_model(cfg, seed=4, jit=jit)
    assert compiled_model.jit_mode == jit
    compiled = objective_and_grads(compiled_model, ids, labels, mask)
    assert compiled[0] == pytest.approx(eager[0], rel=1e-6)
    for p, ge, gc in zip(eager[1], eager[2], compiled[2]):
        np.testing.assert_allclose(gc.asnumpy(), ge.asnumpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=p.name)


def test_tiny_qwen3_trains_a_few_steps(tmp_path):
    """The Markov check recipe as ``model_type: qwen3`` (upstream spelling, head_dim 8 at
    hidden 32 / 2 heads): the loss falls over 6 steps under ``training.jit: layer``."""
    from mindformers_core.trainer import Trainer
    cfg = load_config(os.path.join(ROOT, "configs", "markov_check.yaml"), overrides=[
        "training.steps=6", "training.local_batch_size=4", "training.global_batch_size=4",
        "checkpoint.enable_save=false", "model.model_type=qwen3", "model.hidden_size=32",
        "model.num_attention_heads=2", "model.head_dim=8", "model.ffn_hidden_size=64",
        "model.seq_length=16", "model.vocab_size=32"])
    assert cfg.model.resolved_qk_layernorm() and cfg.model.kv_channels == 8
    trainer = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    assert trainer.model.jit_mode == "layer"
    steps = [trainer.train_step() for _ in range(6)]
    losses = [s.loss for s in steps]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.1, losses
    assert losses[0] == pytest.approx(np.log(32), rel=0.1)
    assert ms.get_context("mode") == ms.PYNATIVE_MODE


def test_kv_cache_logits_equal_the_full_forward():
    """models/kv_cache.py keeps the normed, rotated keys: cached steps give the full logits."""
    from mindformers_core.models.kv_cache import CachedDecoder
    cfg = tiny_qwen3()
    model = build_model(cfg, seed=5)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.seq_length)).astype(
        np.int32)
    dec = CachedDecoder(model)
    got = [dec.prefill(T(ids[:, :3])).asnumpy()]
    got += [dec.step(T(ids[:, t:t + 1])).asnumpy() for t in range(3, cfg.seq_length)]
    np.testing.assert_allclose(np.concatenate(got, 1), model.logits(T(ids)).asnumpy(),
                               rtol=1e-5, atol=1e-6)


def test_doctor_inspects_upstreams_full_size_qwen3_through_a_tiny_twin():
    """tools/doctor.py builds a shrunk twin of a 12B model to read its parameter groups; the
    twin keeps the user's upstream spelling out of its way (num_hidden_layers, head_dim)."""
    from mindformers_core.tools.doctor import run_doctor
    cfg = load_config(os.path.join(ROOT, "tests", "fixtures", "upstream_yaml",
                                   "master_train_config.yaml"), overrides=[
        "train_dataset.dataloader.type=MindDataset",
        "train_dataset.dataloader.dataset_files=train.mindrecord", "callbacks=[]",
        "model.num_hidden_layers=32", "model.head_dim=128"])
    verdicts = {v.item: v for v in run_doctor(cfg)}
    assert verdicts["weight_decay_scope"].status in ("PASS", "WARN"), verdicts
