"""The one runner interface (distributed/model_runner.py): every runner the model can run
through implements ``ModelRunner``, declares its optional capabilities, and runs a range of
decoder layers by index exactly as the whole decoder (what a pipeline stage relies on)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.distributed.collectives import GroupCommunicator
from mindformers_core.distributed.fsdp import FSDPRunner
from mindformers_core.distributed.model_runner import ModelRunner
from mindformers_core.models import build_model
from mindformers_core.models.compiled import Runner
from mindformers_core.models.tp_model import TensorParallelRunner

from model_test_utils import tiny_dsv3, tiny_gpt


def _comm():
    return GroupCommunicator(make_mesh(1), 0, "cpu")


def _runners(model):
    """One runner of each kind over ``model`` (one process: no weight is split)."""
    return {"plain": Runner(model, "none"),
            "tp": TensorParallelRunner(model, _comm(), "tp", set()),
            "fsdp": FSDPRunner(model, _comm(), set())}


def _hidden(model, b=2, s=6, seed=0):
    ids = np.random.RandomState(seed).randint(0, model.cfg.vocab_size, (b, s)).astype(np.int32)
    return model.embed_ids(Tensor(ids)), model.static_tables(b, s)


def test_every_runner_is_a_model_runner_with_its_declared_capabilities():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build_model(tiny_gpt(num_layers=3), seed=3)
    runners = _runners(model)
    assert all(isinstance(r, ModelRunner) for r in runners.values())
    assert {k: (r.gathers_weights, r.vocab_parallel) for k, r in runners.items()} == {
        "plain": (False, False), "tp": (False, True), "fsdp": (True, False)}
    assert {k: r.mode for k, r in runners.items()} == {"plain": "none", "tp": "none",
                                                       "fsdp": "none"}
    # the plain runner hands the weights back as they are
    ws = model.output_weights()
    assert runners["plain"].full_weights(list(ws)) == tuple(ws)


def test_runner_defaults_refuse_what_the_runner_lacks():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build_model(tiny_gpt(), seed=3)
    ids = Tensor(np.zeros((1, 4), np.int32))
    plain, fsdp = Runner(model, "none"), FSDPRunner(model, _comm(), set())
    with pytest.raises(NotImplementedError, match="Runner splits no vocabulary "
                                                  r"\(vocab_parallel False\): take the argmax"):
        plain.greedy_next(ids)
    with pytest.raises(NotImplementedError, match="Runner splits no vocabulary "
                                                  r"\(vocab_parallel False\): read the model"):
        plain.next_logits(ids)
    with pytest.raises(NotImplementedError, match=r"FSDPRunner has no compiled whole forward "
                                                  r"\(training.jit: model\); it runs under "
                                                  r"mode 'none'"):
        fsdp.model(ids, ids, ids)


@pytest.mark.parametrize("make_cfg", [lambda: tiny_gpt(num_layers=4),
                                      lambda: tiny_dsv3(num_layers=3, moe_aux_loss_coeff=0.01)],
                         ids=["gpt", "dsv3"])
@pytest.mark.parametrize("kind", ["plain", "tp", "fsdp"])
def test_layers_by_index_in_pieces_equal_all_layers(make_cfg, kind):
    """Running layers [0..i] then [i+1..L-1] gives bit for bit the hidden states, the aux
    loss sum and the max logits of running all layers at once."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build_model(make_cfg(), seed=5)
    runner = _runners(model)[kind]
    h, tables = _hidden(model)
    whole_h, whole_aux, whole_ml = runner.layers(h, tables)
    n = model.cfg.num_layers
    assert len(whole_ml) == n
    for cut in range(1, n):
        h1, aux1, ml1 = runner.layers(h, tables, list(range(cut)))
        h2, aux2, ml2 = runner.layers(h1, tables, list(range(cut, n)))
        np.testing.assert_array_equal(h2.asnumpy(), whole_h.asnumpy())
        assert len(ml1) + len(ml2) == n
        for got, want in zip(ml1 + ml2, whole_ml):
            np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
        if whole_aux is None:
            assert aux1 is None and aux2 is None
        else:
            parts = [a for a in (aux1, aux2) if a is not None]
            total = parts[0] if len(parts) == 1 else parts[0] + parts[1]
            np.testing.assert_array_equal(total.asnumpy(), whole_aux.asnumpy())


def test_run_layers_records_max_logits_in_the_rows_of_its_indices():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build_model(tiny_gpt(num_layers=3), seed=5)
    h, tables = _hidden(model)
    model.reset_max_attention_logits()
    model.run_layers(h, tables, [1, 2])
    got = model.get_max_attention_logits()
    assert np.isneginf(got[0]).all() and np.isfinite(got[1:]).all()


def test_run_layers_eager_equals_the_compiled_layers():
    """``run_layers(..., eager=True)`` (generation's growing window under the pipeline) gives
    the compiled layers' values in PyNative, for every length asked."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build_model(tiny_gpt(num_layers=2), seed=3, jit="layer")
    assert model.jit_mode == "layer"
    for s in (5, 6):
        h, tables = _hidden(model, b=1, s=s)
        want, _ = model.run_layers(h, tables, [0, 1])
        got, _ = model.run_layers(h, tables, [0, 1], eager=True)
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make_cfg", [lambda: tiny_gpt(num_layers=2),
                                      lambda: tiny_dsv3(num_layers=3)], ids=["gpt", "dsv3"])
@pytest.mark.parametrize("kind", ["plain", "tp", "fsdp"])
def test_cached_decode_through_each_runner_equals_the_full_forward(make_cfg, kind):
    """The key/value-cached decode (models/kv_cache.py) runs its pieces through the model's
    runner (``decode_*``): the prompt, then one token at a time, each position's logits and
    greedy id are the full forward's (a one-rank tp group: the tp boundaries are sums over
    that group, the top ids combined through it)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build_model(make_cfg(), seed=5)
    ids = np.random.RandomState(1).randint(0, model.cfg.vocab_size, (1, 7)).astype(np.int32)
    full = model.logits(Tensor(ids)).asnumpy()[0]
    model.set_runner(_runners(model)[kind])
    dec = model.cached_decoder(model.cfg.seq_length)
    for t in range(3, 8):
        dec.feed(Tensor(ids[:, :3] if t == 3 else ids[:, t - 1:t]))
        np.testing.assert_allclose(dec.next_logits(), full[t - 1], rtol=1e-5, atol=1e-6)
        assert dec.greedy_next() == int(np.argmax(full[t - 1]))
    assert dec.length == 7
