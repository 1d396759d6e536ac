"""Autograd gradients of every parameter (every layer) against float64 finite differences of
the independent numpy reference, under mindspore.value_and_grad in PyNative mode."""
import numpy as np
import pytest

from mindformers_core.models import build_model
from model_test_utils import (assert_grads_match_fd, batch, objective_and_grads,
                              tiny_dsv3, tiny_gpt)
import model_numpy_reference as ref


def _objective(P, cfg, ids, labels, mask):
    loss, aux = ref.loss_sum(P, cfg, ids, labels, mask)
    return loss / mask.sum() + aux


def _check_all_params(cfg, seed, coords_per_param=2, eps=1e-5):
    model = build_model(cfg, seed=seed)
    ids, labels, mask = batch(cfg, b=2, s=5, seed=seed)
    value, params, grads = objective_and_grads(model, ids, labels, mask)
    P = ref.params_of(model)
    assert value == pytest.approx(_objective(P, cfg, ids, labels, mask), rel=1e-4)
    named = []
    for p, g in zip(params, grads):
        g = g.asnumpy().astype(np.float64)
        assert g.shape == tuple(p.shape), p.name
        named.append((p.name, g))
    checked = assert_grads_match_fd(named, P, lambda P: _objective(P, cfg, ids, labels, mask),
                                    np.random.RandomState(seed), coords_per_param, eps)
    return model, checked


def test_gpt_gradients_every_parameter_match_finite_differences():
    cfg = tiny_gpt(num_query_groups=2)
    model, checked = _check_all_params(cfg, seed=0)
    assert checked == 2 * len(model.trainable_params())


def test_deepseek_v3_gradients_every_parameter_match_finite_differences():
    # aux loss on: router gradients come from both the gate weights and the aux term
    cfg = tiny_dsv3(moe_aux_loss_coeff=0.05)
    model, checked = _check_all_params(cfg, seed=1)
    names = [p.name for p in model.trainable_params()]
    assert "decoder.layers.1.mlp.experts.weight1" in names
    assert "decoder.layers.1.mlp.router.expert_bias" not in names   # not trainable


def test_tied_embeddings_and_no_q_lora_gradients():
    _check_all_params(tiny_dsv3(q_lora_rank=None, tie_word_embeddings=True), seed=2)
