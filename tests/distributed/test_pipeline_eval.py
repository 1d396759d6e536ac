"""The forward-only pass of distributed/pipeline_eval.py on one process: the two stages of a
pp 2 split run one after the other over one model, their transfers handed over by a wire
(stage 0 sends before stage 1 receives, the order the msrun run has too); the last stage's
eval loss and greedy next id equal the whole model's, and its key/value-cached decode
(``PipelineDecoder``) the whole model's cached decode (msrun: tests/distributed/
test_eval_layouts_msrun.py, pp2 and the composed pp layouts)."""
from types import SimpleNamespace

import numpy as np
import pytest

from mindformers_core.core.pipeline_split import StageSplit
from test_pipeline_stage import GPT, MLA, batches, build


class Wire:
    """send / recv between the stages of one process; all_reduce sees one stage's values (the
    others', zeros, are checked to be zeros)."""

    def __init__(self, rank, queues):
        self.rank, self.queues, self.reduced = rank, queues, []

    def send(self, x, dst):
        self.queues.setdefault((self.rank, dst), []).append(x)

    def recv(self, like, src):
        x = self.queues[(src, self.rank)].pop(0)
        assert tuple(x.shape) == tuple(like.shape) and x.dtype == like.dtype
        return x

    def all_reduce(self, x, group):
        assert group == "pp"
        self.reduced.append(np.asarray(x))
        return x


def stages(model, split):
    from mindformers_core.distributed.pipeline_eval import PipelineForward
    queues = {}
    return [PipelineForward(SimpleNamespace(model=model, split=split, stage=s,
                                            comm=Wire(s, queues),
                                            stage_ranks={r: r for r in range(split.pp)}))
            for s in range(split.pp)]


@pytest.mark.parametrize("model_dict,lps", [(GPT, None), (GPT, ["0-0", "1-3"]),
                                            (dict(MLA, num_nextn_predict_layers=0), None)])
def test_stage_forward_equals_the_whole_model(model_dict, lps):
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build(model_dict)
    split = StageSplit.build(model.cfg.num_layers, 2, 1, lps)
    first, last = stages(model, split)
    b = batches(1)[0]
    ids, labels, mask = (ms.Tensor(b[k]) for k in ("input_ids", "labels", "loss_mask"))
    ref_loss, ref_tokens, _ = model(ids, labels, mask)
    assert first(ids, labels, mask)[0].asnumpy() == 0.0   # not the last stage: adds zeros
    assert not first.pipeline.comm.reduced[-1].any()
    loss, tokens, _ = last(ids, labels, mask)
    assert float(tokens.asnumpy()) == float(ref_tokens.asnumpy())
    assert float(loss.asnumpy()) == pytest.approx(float(ref_loss.asnumpy()), rel=1e-6)
    prompt = ms.Tensor(b["input_ids"][:1])
    want = int(np.argmax(model.logits(prompt).asnumpy()[0, -1]))
    assert first.greedy_next(prompt) == 0
    assert last.greedy_next(prompt) == want
    # the whole logits sampling draws from: the last position's, on the last stage
    whole = model.logits(prompt).asnumpy()[0, -1]
    assert not first.next_logits(prompt).any()
    np.testing.assert_allclose(last.next_logits(prompt), whole, rtol=1e-5, atol=1e-6)
    assert first.cfg is model.cfg
    from mindformers_core.models.generation import Decoder
    assert isinstance(first, Decoder) and isinstance(model, Decoder)
    assert not model.vocab_parallel


@pytest.mark.parametrize("model_dict,lps", [(GPT, ["0-0", "1-3"]),
                                            (dict(MLA, num_nextn_predict_layers=0), None)])
def test_cached_decode_through_the_stages_equals_the_whole_model(model_dict, lps):
    """The prompt, then one token at a time: each stage caches its layers, only the new
    rows travel; the last stage's logits and greedy id equal the whole model's cached
    decode, the other stage adds zeros."""
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = build(model_dict)
    split = StageSplit.build(model.cfg.num_layers, 2, 1, lps)
    first, last = (s.cached_decoder(model.cfg.seq_length) for s in stages(model, split))
    whole = model.cached_decoder(model.cfg.seq_length)
    ids = batches(1)[0]["input_ids"][:1]
    feeds = [ids[:, :3]] + [ids[:, t:t + 1] for t in range(3, ids.shape[1])]
    for step in feeds:
        for dec in (first, last, whole):
            dec.feed(ms.Tensor(step))
        want = whole.next_logits()
        np.testing.assert_allclose(last.next_logits(), want, rtol=1e-5, atol=1e-6)
        assert last.greedy_next() == whole.greedy_next() == int(np.argmax(want))
        assert not first.next_logits().any() and first.greedy_next() == 0
    assert last.cache.length == first.cache.length == ids.shape[1]
    with pytest.raises(ValueError, match="the cache holds"):
        first.feed(ms.Tensor(ids[:, :1]))
