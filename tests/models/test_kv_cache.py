"""KV cache: cached logits equal a full forward (rel 1e-5) for MHA, GQA and MLA, at every
prefix; cached generation equals recomputing generation."""
import mindspore as ms
import numpy as np
import pytest

from mindformers_core.models import build_model
from mindformers_core.models.generation import generate
from mindformers_core.models.kv_cache import CachedDecoder
from mindformers_core.models.layers import attention_tables
from mindformers_core.models.precision import Precision
from model_test_utils import T, tiny_dsv3, tiny_gpt

MAKERS = {"mha": lambda: tiny_gpt(), "gqa": lambda: tiny_gpt(num_query_groups=2),
          "mla": lambda: tiny_dsv3(), "mla_no_q_lora": lambda: tiny_dsv3(q_lora_rank=None)}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_cached_logits_equal_the_full_forward_at_every_prefix(name):
    cfg = MAKERS[name]()
    model = build_model(cfg, seed=1)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (2, cfg.seq_length)).astype(np.int32)
    full = model.logits(T(ids)).asnumpy()
    dec = CachedDecoder(model)
    got = [dec.prefill(T(ids[:, :3])).asnumpy()]
    for t in range(3, cfg.seq_length):
        got.append(dec.step(T(ids[:, t:t + 1])).asnumpy())
    np.testing.assert_allclose(np.concatenate(got, 1), full, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="the cache holds 8 positions"):
        dec.step(T(ids[:, :1]))


@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_cached_generation_equals_recomputing_generation(name):
    model = build_model(MAKERS[name](), seed=2)
    for kwargs in ({}, {"temperature": 0.9, "top_k": 8, "seed": 3}):
        # 12 new tokens from 3: past seq_length 8, where both recompute the last window
        cached = generate(model, [1, 2, 3], 12, cache=True, **kwargs)
        assert cached == generate(model, [1, 2, 3], 12, cache=False, **kwargs)


def test_tables_from_a_start_are_the_last_rows_of_the_full_tables():
    p = Precision(ms.float32, ms.float32)
    full = [t.asnumpy() for t in attention_tables(2, 7, 4, 2, 6, 10000.0, p)]
    part = [t.asnumpy() for t in attention_tables(2, 3, 4, 2, 6, 10000.0, p, start=4)]
    for f, g in zip(full[:4], part[:4]):   # cos/sin rows of positions 4, 5, 6
        np.testing.assert_array_equal(g, f[:, :, 4:])
    np.testing.assert_array_equal(part[4], full[4])
    np.testing.assert_array_equal(part[5], full[5][:, :, 4:])   # query rows 4..6, all 7 keys
    assert part[5].shape == (2, 4, 3, 7) and np.isneginf(part[5][0, 0, 0, 5:]).all()
