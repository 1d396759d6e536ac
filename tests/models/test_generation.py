"""Sampling rules against closed forms, and generation against the model's own logits."""
import numpy as np
import pytest

from mindformers_core.models import build_model
from mindformers_core.models.generation import filter_probs, generate, next_token

from model_test_utils import T, tiny_dsv3, tiny_gpt


def test_greedy_is_argmax_with_the_lowest_id_on_ties():
    assert next_token(np.array([0.1, 3.0, 3.0, -1.0]), temperature=0.0) == 1


def test_top_k_and_top_p_keep_exactly_the_stated_sets():
    p = np.array([0.1, 0.4, 0.2, 0.3])
    np.testing.assert_allclose(filter_probs(p, top_k=2), [0, 4 / 7, 0, 3 / 7])
    # nucleus 0.65: 0.4 + 0.3 = 0.7 is the smallest prefix reaching it
    np.testing.assert_allclose(filter_probs(p, top_p=0.65), [0, 4 / 7, 0, 3 / 7])
    np.testing.assert_allclose(filter_probs(p, top_p=0.7), [0, 4 / 7, 0, 3 / 7])
    np.testing.assert_allclose(filter_probs(p, top_p=0.01), [0, 1, 0, 0])  # top id always kept
    np.testing.assert_allclose(filter_probs(p, top_k=3, top_p=0.5), [0, 4 / 7, 0, 3 / 7])
    np.testing.assert_allclose(filter_probs(p), p)
    with pytest.raises(ValueError, match="top_p must be in"):
        filter_probs(p, top_p=0.0)
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        filter_probs(p, top_k=-1)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        next_token(p, temperature=-1.0)


def test_temperature_sampling_matches_the_tempered_softmax():
    logits = np.array([1.0, 2.0, 0.0])
    rng = np.random.default_rng(0)
    draws = np.bincount([next_token(logits, 0.5, rng=rng) for _ in range(20000)], minlength=3)
    z = np.exp(logits / 0.5)
    np.testing.assert_allclose(draws / draws.sum(), z / z.sum(), atol=0.015)
    top1 = {next_token(logits, 2.0, top_k=1, rng=rng) for _ in range(50)}
    assert top1 == {1}


@pytest.mark.parametrize("make", [tiny_gpt, lambda: tiny_gpt(num_query_groups=2), tiny_dsv3],
                         ids=["mha", "gqa", "mla"])
def test_greedy_generation_follows_the_models_argmax(make):
    cfg = make()
    model = build_model(cfg, seed=3)
    prompt = [1, 5, 7]
    out = generate(model, prompt, max_new_tokens=10, temperature=0.0)
    assert len(out) == 10
    ids = list(prompt)
    for tok in out:   # reference: argmax of the full-sequence logits at the last position
        window = np.asarray(ids[-cfg.seq_length:], np.int32)[None]
        assert tok == int(np.argmax(model.logits(T(window)).asnumpy()[0, -1]))
        ids.append(tok)
    again = generate(model, prompt, max_new_tokens=10, temperature=0.9, top_k=5, seed=11)
    assert again == generate(model, prompt, max_new_tokens=10, temperature=0.9, top_k=5, seed=11)
    with pytest.raises(ValueError, match="the prompt is empty"):
        generate(model, [], 3)


def test_generation_stops_at_the_stop_id():
    model = build_model(tiny_gpt(), seed=3)
    first = generate(model, [2], 1)[0]
    assert generate(model, [2], 5, stop_id=first) == [first]
