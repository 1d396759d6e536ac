"""Document masking (``train_dataset.reset_attention_mask`` / ``reset_position_ids``,
``models/documents.py``): the tables against ``data/eod.py``'s Megatron rule, and the model's
logits of a packed window against each document run alone (the independent reference: a
document that sees only itself is the same sequence by itself), through the plain core, the
blockwise core with blocks that cross the boundaries, and the context-parallel cores on a
one-rank group; the cores' gradients against the plain core under the same bias."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.core.parallel_dims import Mesh
from mindformers_core.core.documents import Documents, document_positions_and_mask
from mindformers_core.distributed.collectives import GroupCommunicator
from mindformers_core.distributed.context_parallel import context_parallel_attention
from mindformers_core.models.blockwise_attention import (attention_function,
                                                         blockwise_causal_attention)
from mindformers_core.models.build import build_model
from mindformers_core.models.documents import OTHER_DOCUMENT, document_bias, document_tables
from mindformers_core.models.layers import causal_attention
from mindformers_core.models.precision import resolve_precision

from model_test_utils import tiny_dsv3, tiny_gpt

EOD = 0
#: sample 0: documents [0..4] [5..5] [6..11]; sample 1: one document
IDS = np.array([[3, 4, 5, 6, EOD, EOD, 7, 8, 9, 10, 11, 12],
                [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]], np.int32)
DOCS = ((0, 5), (5, 6), (6, 12))


def test_the_bias_is_megatrons_block_diagonal_causal_mask():
    positions, allowed = document_positions_and_mask(IDS, EOD)
    assert positions[0].tolist() == [0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5]
    assert positions[1].tolist() == list(range(12))
    bias = document_bias(allowed)
    assert bias.shape == (2, 1, 12, 12) and bias.dtype == np.float32
    s = 12
    for q in range(s):
        for k in range(s):
            same = any(a <= q < b and a <= k < b for a, b in DOCS)
            want = -np.inf if k > q else (0.0 if same else np.float32(OTHER_DOCUMENT))
            assert bias[0, 0, q, k] == want, (q, k)
    assert np.array_equal(bias[1, 0], np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, 0))


def test_tables_take_each_tokens_position_in_its_document():
    precision = resolve_precision("float32", "float32")
    cos_q, sin_q, cos_k, sin_k, rot, mask = document_tables(
        IDS, Documents(EOD, True, False), 3, 1, 4, 10000.0, precision)
    assert cos_q.shape == (2, 3, 12, 4) and cos_k.shape == (2, 1, 12, 4)
    c = cos_q.asnumpy()
    np.testing.assert_array_equal(c[0, :, 5], c[0, :, 0])     # position 0 again
    np.testing.assert_array_equal(c[0, :, 11], c[1, :, 5])    # position 5 in both
    # reset_positions alone: the plain causal mask
    causal = np.where(np.triu(np.ones((12, 12), bool), 1), -np.inf, 0.0)
    np.testing.assert_array_equal(mask.asnumpy()[:, 0], np.broadcast_to(causal, (2, 12, 12)))


def test_documents_need_one_of_the_two_resets():
    with pytest.raises(ValueError, match="^document masking needs reset_position_ids or "
                                         "reset_attention_mask"):
        Documents(EOD, False, False)


def _qkv(seed=0, b=2, n=3, s=12, d=8, dv=6):
    rng = np.random.RandomState(seed)
    return [Tensor((rng.standard_normal(shape) * 1.5).astype(np.float32))
            for shape in ((b, n, s, d), (b, n, s, d), (b, n, s, dv), (b, n, s, dv))]


def _run(core, q, k, v, w, bias):
    def loss(qt, kt, vt):
        ctx, max_logits = core(qt, kt, vt, 0.4, bias)
        return (ctx * w).sum(), (ctx, max_logits)
    (_, (ctx, ml)), grads = ms.value_and_grad(loss, grad_position=(0, 1, 2), has_aux=True)(
        q, k, v)
    return [ctx.asnumpy(), ml.asnumpy()] + [g.asnumpy() for g in grads]


def _cores():
    one = GroupCommunicator(Mesh(world=1), 0, backend="cpu")
    out = {f"blockwise{b}": (lambda b: lambda q, k, v, s, m: blockwise_causal_attention(
        q, k, v, s, b, m))(b) for b in (1, 4, 5)}
    for method in ("colossal", "ulysses", "hybrid"):
        out[method] = context_parallel_attention(one, method, inner=causal_attention)
    return out


@pytest.mark.parametrize("name", ["blockwise1", "blockwise4", "blockwise5", "colossal",
                                  "ulysses", "hybrid"])
def test_cores_under_a_document_mask_match_the_plain_core(name):
    """Blocks where a query row sees no key (other documents only) stay finite: context,
    max logits and the gradients equal the plain core's under the same bias."""
    q, k, v, w = _qkv()
    bias = Tensor(document_bias(document_positions_and_mask(IDS, EOD)[1]))
    ref = _run(causal_attention, q, k, v, w, bias)
    got = _run(_cores()[name], q, k, v, w, bias)
    for what, g, r in zip(("ctx", "max_logits", "dq", "dk", "dv"), got, ref):
        assert np.all(np.isfinite(g)), (name, what)
        assert g.shape == r.shape
        assert np.max(np.abs(g - r)) / np.max(np.abs(r)) < 1e-5, (name, what)


def _model(cfg, docs, flash_block=None):
    model = build_model(cfg, seed=3, documents=docs)
    if flash_block is not None:   # blocks of a few positions, so they cross the documents
        for attn in model.attention_blocks():
            attn.core_attention = attention_function(True, "CPU", flash_block,
                                                     documents=docs is not None)
    return model


CASES = {"gpt": lambda: tiny_gpt(seq_length=12),
         "gpt_gqa_flash": lambda: tiny_gpt(seq_length=12, num_query_groups=2),
         "dsv3": lambda: tiny_dsv3(seq_length=12),
         "dsv3_yarn": lambda: tiny_dsv3(seq_length=12, position_embedding_type="yarn",
                                        rotary_scaling_factor=4.0,
                                        max_position_embeddings=4)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_packed_document_gives_the_logits_of_the_document_alone(name):
    cfg = CASES[name]()
    flash = 4 if name.endswith("flash") else None
    packed = _model(cfg, Documents(EOD, True, True), flash).logits(Tensor(IDS)).asnumpy()
    alone = _model(cfg, None, flash)
    for a, b in DOCS:
        ref = alone.logits(Tensor(IDS[:1, a:b])).asnumpy()
        np.testing.assert_allclose(packed[0, a:b], ref[0], rtol=2e-5, atol=2e-5,
                                   err_msg=f"document {a}:{b}")
    # one document: the same as without document masking
    np.testing.assert_allclose(packed[1], alone.logits(Tensor(IDS[1:])).asnumpy()[0],
                               rtol=2e-5, atol=2e-5)


def test_the_mask_alone_keeps_rope_relative():
    """reset_attention_mask without reset_position_ids: RoPE scores depend on relative
    positions only, so a later document still matches itself alone (to rounding)."""
    cfg = tiny_gpt(seq_length=12)
    packed = _model(cfg, Documents(EOD, False, True)).logits(Tensor(IDS)).asnumpy()
    alone = _model(cfg, None)
    for a, b in DOCS:
        ref = alone.logits(Tensor(IDS[:1, a:b])).asnumpy()
        np.testing.assert_allclose(packed[0, a:b], ref[0], rtol=1e-4, atol=1e-4)


def test_without_the_mask_the_documents_see_each_other():
    """The check above can fail: without reset_attention_mask a later document's logits
    are not those of the document alone."""
    cfg = tiny_gpt(seq_length=12)
    packed = _model(cfg, Documents(EOD, True, False)).logits(Tensor(IDS)).asnumpy()
    ref = _model(cfg, None).logits(Tensor(IDS[:1, 6:12])).asnumpy()
    assert np.max(np.abs(packed[0, 6:12] - ref[0])) > 1e-3


def test_the_training_forward_and_its_gradients_under_documents():
    """loss through the training forward (decoder + MTP depth) of the packed window under
    document masking: finite, and different from the causal one's."""
    cfg = tiny_dsv3(seq_length=12, num_nextn_predict_layers=1)
    labels = np.roll(IDS, -1, 1).astype(np.int32)
    mask = np.ones_like(IDS, np.float32)
    losses = []
    for docs in (Documents(EOD, True, True), None):
        model = _model(cfg, docs)
        params = model.trainable_params()

        def fwd(*_):
            loss_sum, n, aux = model(Tensor(IDS), Tensor(labels), Tensor(mask))
            return loss_sum / n + aux
        loss, grads = ms.value_and_grad(fwd, None, params)()
        assert all(np.all(np.isfinite(g.asnumpy())) for g in grads)
        losses.append(float(loss.asnumpy()))
    assert np.isfinite(losses[0]) and abs(losses[0] - losses[1]) > 1e-4
