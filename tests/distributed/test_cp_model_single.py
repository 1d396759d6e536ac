"""The model's side of context parallel on one process (models/cp_model.py): a rank's chunks
of the tokens and of the RoPE tables are the rows of its global positions, and the parts the
MoE aux loss leaves on each cp rank sum to the whole sequences' loss (the msrun runs:
test_cp_train_msrun.py)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import cp_layout
from mindformers_core.models import router as rt
from mindformers_core.models.cp_model import SequenceChunks
from mindformers_core.models.layers import attention_tables
from mindformers_core.models.precision import Precision


@pytest.mark.parametrize("cp", [2, 4])
def test_chunks_hold_the_rows_of_their_global_positions(cp):
    b, s = 2, 16
    ids = np.arange(b * s, dtype=np.int32).reshape(b, s)
    full = attention_tables(b, s, 4, 2, 8, 10000.0, Precision(ms.float32, ms.float32))
    for rank in range(cp):
        chunks = SequenceChunks(cp, rank)
        pos = cp_layout.local_positions(s, cp, rank)
        np.testing.assert_array_equal(chunks.take(Tensor(ids)).asnumpy(), ids[:, pos])
        local = chunks.tables(full)
        for got, want in zip(local[:4], full[:4]):
            np.testing.assert_array_equal(got.asnumpy(), want.asnumpy()[:, :, pos])
        assert local[5].shape == (b, 4, s // cp, s // cp)


@pytest.mark.parametrize("kind", ["seq_aux_loss", "aux_loss"])
@pytest.mark.parametrize("cp", [2, 4])
def test_aux_loss_parts_sum_over_the_cp_ranks_to_the_full_loss(kind, cp):
    b, s, e, k = 2, 16, 4, 2
    rng = np.random.default_rng(0)
    scores = rng.random((b, s, e)).astype(np.float32)
    idx = np.argsort(-scores, -1)[..., :k]
    counts = np.zeros((b, e), np.float32)
    for bi in range(b):
        np.add.at(counts[bi], idx[bi].reshape(-1), 1.0)
    full = rt.aux_loss(Tensor(scores.reshape(b * s, e)), Tensor(counts), b, s, k, kind, 1e-2)
    parts = []
    for rank in range(cp):
        pos = cp_layout.local_positions(s, cp, rank)
        local = Tensor(np.ascontiguousarray(scores[:, pos]).reshape(-1, e))
        # the MoE's part (models/moe.py): counts summed over cp, the loss / cp**2
        parts.append(float(rt.aux_loss(local, Tensor(counts), b, s // cp, k, kind,
                                       1e-2).asnumpy()) / cp ** 2)
    assert abs(sum(parts) - float(full.asnumpy())) < 1e-6 * abs(float(full.asnumpy())) + 1e-9


def test_whole_sequences_decodes_the_uncut_model_and_restores_the_cut():
    """Generation under context parallel (the end-of-run sample): inside
    ``model.whole_sequences()`` a cut model runs whole sequences with its own attention cores
    (the uncut model's ids, with the key/value cache); outside it is cut again."""
    import os
    from mindformers_core.config import load_config
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.models import build_model
    from mindformers_core.models.generation import generate
    ms.set_context(mode=ms.PYNATIVE_MODE)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = load_config(os.path.join(root, "configs", "quickstart.yaml")).model
    prompt = list(b"The with statement")
    want = generate(build_model(cfg, seed=7, jit="none"), prompt, 12)
    model = build_model(cfg, seed=7, jit="none").apply_context_parallel(
        GroupCommunicator(make_mesh(1), 0, "cpu"), "colossal")
    cut = [attn.core_attention for attn in model.attention_blocks()]
    with pytest.raises(NotImplementedError, match="logits of a context-parallel model"):
        model.logits(Tensor(np.array([prompt], np.int32)))
    with model.whole_sequences():
        assert all(a.core_attention is not c for a, c in zip(model.attention_blocks(), cut))
        assert generate(model, prompt, 12) == want
    assert [attn.core_attention for attn in model.attention_blocks()] == cut
    with pytest.raises(NotImplementedError, match="logits of a context-parallel model"):
        model.logits(Tensor(np.array([prompt], np.int32)))


@pytest.mark.parametrize("method", ["colossal", "ulysses"])
def test_recomputed_core_attention_wraps_the_cp_core_and_keeps_the_gradients(method):
    """``recompute: select`` of ``core_attention`` under cp (config/context_parallel_rules.py):
    the cut gives each selected block a recomputed Cell around the one cp core (its ring
    passes or all-to-alls rerun in the backward), ``whole_sequences`` restores the recomputed
    plain core, and the loss and gradients equal the cut model's without recompute (one cp
    rank here; the msrun runs against one process: layout_cases.py's cp recompute cases)."""
    from mindformers_core.config.model import ModelConfig
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.models import build_model
    from mindformers_core.models.transformer_layer import RecomputedCore
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cfg = ModelConfig.from_dict(dict(model_type="gpt", vocab_size=32, hidden_size=16,
                                     num_layers=2, num_attention_heads=4, ffn_hidden_size=24,
                                     seq_length=8, initializer_range=0.2), "model")
    comm = GroupCommunicator(make_mesh(1), 0, "cpu")
    plain = build_model(cfg, seed=1, jit="none").apply_context_parallel(comm, method)
    rec = build_model(cfg, seed=1, jit="none")
    rec.set_recompute([], {0: ("self_attention.core_attention",),
                           1: ("self_attention.core_attention",)})
    own = [attn.core_attention for attn in rec.attention_blocks()]
    rec = rec.apply_context_parallel(comm, method)
    cores = [attn.core_attention for attn in rec.attention_blocks()]
    assert all(isinstance(c, RecomputedCore) for c in cores + own)
    assert cores[0].fn is cores[1].fn and type(cores[0].fn) is type(
        plain.attention_blocks()[0].core_attention)
    with rec.whole_sequences():
        assert [attn.core_attention for attn in rec.attention_blocks()] == own
    assert [attn.core_attention for attn in rec.attention_blocks()] == cores
    rng = np.random.RandomState(3)
    ids = Tensor(rng.randint(0, 32, (2, 8)).astype(np.int32))
    labels = Tensor(rng.randint(0, 32, (2, 8)).astype(np.int32))
    mask = Tensor((rng.rand(2, 8) > 0.3).astype(np.float32))

    def loss_and_grads(model):
        def fn(a, b, c):
            loss, n, aux = model(a, b, c)
            return loss / n + aux
        value, grads = ms.value_and_grad(fn, None, model.trainable_params())(ids, labels, mask)
        return float(value.asnumpy()), [g.asnumpy() for g in grads]

    (v0, g0), (v1, g1) = loss_and_grads(plain), loss_and_grads(rec)
    assert v1 == v0
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-8)
