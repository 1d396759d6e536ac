"""``training.jit``: compiled layers / model keep QK-Clip's max logits, see weight updates and
train like PyNative (the numerics of every mode against the original implementation are in
test_model_golden.py)."""
import io
import os

import numpy as np
import pytest
import mindspore as ms

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.training import TrainingConfig
from mindformers_core.models import build_model
from model_test_utils import T, batch, tiny_dsv3, tiny_gpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = [("gpt", "layer"), ("gpt", "model"), ("dsv3", "layer")]


def _cfg(name):
    return tiny_gpt() if name == "gpt" else tiny_dsv3()


@pytest.mark.parametrize("name,jit", MODES)
def test_compiled_forward_records_the_max_logits_of_pynative(name, jit):
    cfg = _cfg(name)
    eager, compiled = build_model(cfg, seed=2), build_model(cfg, seed=2, jit=jit)
    ids, labels, mask = batch(cfg, b=2, s=8, seed=2)
    for model in (eager, compiled):
        model(T(ids), T(labels), T(mask))
        model(T(ids[::-1].copy()), T(labels), T(mask))         # running max over two passes
    want = eager.get_max_attention_logits()
    got = compiled.get_max_attention_logits()
    assert np.all(np.isfinite(got)) and got.shape == (cfg.num_layers, cfg.num_attention_heads)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    compiled.reset_max_attention_logits()
    assert np.all(np.isneginf(compiled.get_max_attention_logits()))


@pytest.mark.parametrize("name,jit", MODES)
def test_compiled_graphs_read_weights_replaced_by_set_data(name, jit):
    """Optimizers and QK-Clip replace Parameter data with set_data; a graph that captured the
    Parameters would keep computing with the old values (MindSpore 2.10)."""
    cfg = _cfg(name)
    eager, compiled = build_model(cfg, seed=4), build_model(cfg, seed=4, jit=jit)
    ids, labels, mask = batch(cfg, b=2, s=8, seed=4)
    compiled(T(ids), T(labels), T(mask))                         # compile with the old weights
    for model in (eager, compiled):
        for p in model.trainable_params():
            p.set_data(p * 1.5)
        model.reset_max_attention_logits()
    loss_e = eager(T(ids), T(labels), T(mask))[0].asnumpy()
    loss_c = compiled(T(ids), T(labels), T(mask))[0].asnumpy()
    assert float(loss_c) == pytest.approx(float(loss_e), rel=1e-5)
    np.testing.assert_allclose(compiled.get_max_attention_logits(),
                               eager.get_max_attention_logits(), rtol=1e-5)


def test_jit_model_refuses_moe_layers_and_unknown_modes():
    with pytest.raises(ValueError, match="jit: model compiles the whole forward as one static "
                                         "graph, which cannot hold the MoE layers"):
        build_model(tiny_dsv3(), seed=0, jit="model")
    with pytest.raises(ValueError, match=r"jit must be one of \['none', 'layer', 'model'\], "
                                         r"got 'graph'"):
        build_model(tiny_gpt(), seed=0, jit="graph")


def test_training_jit_field_is_checked():
    assert TrainingConfig.from_dict({}, "training").jit == "layer"
    assert TrainingConfig.from_dict({"jit": "layer"}, "training").jit == "layer"
    with pytest.raises(ConfigError, match=r"training\.jit.*must be one of \['none', 'layer', "
                                          r"'model'\], got 'all'"):
        TrainingConfig.from_dict({"jit": "all"}, "training")


@pytest.mark.slow
def test_qk_clip_clips_under_jit_layer_with_muon_on_tiny_deepseek_v3(tmp_path):
    """The recipe configs/muon_deepseek_v3_tiny.yaml with a low threshold under jit: layer:
    heads are clipped, every step sees finite max logits, and the clipped weights are what the
    next forward computes with."""
    from mindformers_core.trainer import Trainer
    cfg = load_config(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml"),
                      overrides=["training.jit=layer", "optimizer.qk_clip_threshold=0.05",
                                 "checkpoint.enable_save=False"])
    trainer = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    assert trainer.model.jit_mode == "layer"
    q_name = "decoder.layers.0.self_attention.linear_q_up_proj.weight"
    q = {p.name: p for p in trainer.model.trainable_params()}[q_name]
    before = q.asnumpy().copy()
    steps = [trainer.train_step() for _ in range(3)]
    assert steps[0].qk_clipped_heads > 0
    assert all(np.isfinite(m.max_attention_logit) for m in steps), [m.max_attention_logit
                                                                     for m in steps]
    # clipping shrinks the q rows of the clipped heads: the update is not Muon's alone
    assert float(np.abs(q.asnumpy()).sum()) < float(np.abs(before).sum())
    # the compiled layers computed with the clipped weights: eager max logits agree
    eager = build_model(cfg.model, seed=0)
    params = {p.name: p for p in trainer.model.trainable_params()}
    for p in eager.trainable_params():
        p.set_data(ms.Tensor(params[p.name].asnumpy()))
    ids, labels, mask = batch(cfg.model, b=2, s=16, seed=1)
    for model in (trainer.model, eager):
        model.reset_max_attention_logits()
        model(T(ids), T(labels), T(mask))
    np.testing.assert_allclose(trainer.model.get_max_attention_logits(),
                               eager.get_max_attention_logits(), rtol=1e-5)


def test_float16_compute_runs_pynative_under_every_mode():
    """MindSpore 2.10 CPU misaligns the gradients of a float16 graph's inputs; the model runs
    such layers in PyNative instead of training wrongly."""
    cfg = tiny_gpt(params_dtype="float16", compute_dtype="float16")
    assert build_model(cfg, seed=0, jit="layer").jit_mode == "none"
    assert build_model(tiny_gpt(), seed=0, jit="layer").jit_mode == "layer"


def _grads(model, ids, labels, mask, weights):
    return ms.grad(lambda i, l, m: model(i, l, m)[0], grad_position=None,
                   weights=weights)(T(ids), T(labels), T(mask))


def test_a_second_compiled_model_of_the_same_shapes_gets_its_own_gradients():
    """MindSpore 2.10 caches a bytecode-built graph on the function's code and reuses it for a
    model of the same shapes even when that one needs other gradients: a model differentiated
    only w.r.t. its embedding made the next model's layer gradients wrong. Each Runner's graphs
    have their own code (models/compiled.py compile_pure)."""
    cfg = tiny_gpt()
    ids, labels, mask = batch(cfg, b=2, s=8, seed=5)
    first = build_model(cfg, seed=5, jit="layer")
    _grads(first, ids, labels, mask,
           [p for p in first.trainable_params() if "embedding" in p.name])
    second, eager = build_model(cfg, seed=5, jit="layer"), build_model(cfg, seed=5)
    got = _grads(second, ids, labels, mask, second.trainable_params())
    want = _grads(eager, ids, labels, mask, eager.trainable_params())
    for g, w, p in zip(got, want, eager.trainable_params()):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=p.name)
