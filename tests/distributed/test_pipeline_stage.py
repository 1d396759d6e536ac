"""The stage forward/backward of distributed/pipeline_stage.py on one process: chaining the
virtual stages by hand (activation forward, gradient back) gives the gradients, loss and aux
of the whole model's accumulate_gradients on the same micro-batches."""
import numpy as np
import pytest

from mindformers_core.core.pipeline_split import StageSplit

SEQ, VOCAB, ROWS, MICRO = 8, 32, 2, 3

GPT = {"model_type": "gpt", "vocab_size": VOCAB, "hidden_size": 16, "num_layers": 4,
       "num_attention_heads": 2, "seq_length": SEQ}
MLA = {"model_type": "deepseek_v3", "multi_latent_attention": True, "vocab_size": VOCAB,
       "hidden_size": 16, "num_layers": 4, "num_attention_heads": 2, "ffn_hidden_size": 32,
       "seq_length": SEQ, "q_lora_rank": 8, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
       "qk_rope_head_dim": 4, "v_head_dim": 4, "first_k_dense_replace": 1,
       "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
       "n_shared_experts": 1, "moe_aux_loss_coeff": 0.01, "num_nextn_predict_layers": 1,
       "tie_word_embeddings": True}


def build(model_dict):
    from mindformers_core.config import load_config
    from mindformers_core.models import build_model
    cfg = load_config({"training": {"steps": 1, "local_batch_size": ROWS,
                                    "global_batch_size": ROWS * MICRO},
                       "optimizer": {"type": "AdamW"},
                       "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
                       "model": model_dict})
    return build_model(cfg.model, seed=3)


def batches():
    rng = np.random.default_rng(5)
    out = []
    for _ in range(MICRO):
        t = rng.integers(0, VOCAB, (ROWS, SEQ + 1)).astype(np.int32)
        out.append({"input_ids": t[:, :-1], "labels": t[:, 1:],
                    "loss_mask": (rng.random((ROWS, SEQ)) > 0.3).astype(np.float32)})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model_dict,pp,vpp,lps", [
    (GPT, 2, 1, None), (GPT, 2, 1, ["0-0", "1-3"]), (GPT, 2, 2, None),
    (dict(GPT, tie_word_embeddings=True), 4, 1, None),
    (MLA, 2, 2, None),    # MoE aux, MTP and the tied table on the last stage
    (dict(MLA, tie_word_embeddings=False), 2, 1, ["0-2", "3-3"])])
def test_chained_stages_equal_the_whole_model(model_dict, pp, vpp, lps):
    import mindspore as ms
    from mindformers_core.distributed.pipeline_stage import StageRunner
    from mindformers_core.trainer.accumulate import (accumulate_gradients, count_loss_tokens,
                                                     make_grad_fn)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    bs = batches()
    total = count_loss_tokens(bs)
    ref_model = build(model_dict)
    params = list(ref_model.trainable_params())
    ref_grads, ref_loss, ref_aux = accumulate_gradients(make_grad_fn(ref_model, params), bs,
                                                        total, 1.0)
    model = build(model_dict)
    split = StageSplit.build(model_dict["num_layers"], pp, vpp, lps,
                             shares_embedding=bool(model_dict.get("tie_word_embeddings")))
    runners = {s: StageRunner(model, split, s, list(model.trainable_params()))
               for s in range(pp)}
    lw, aw = ms.Tensor(np.float32(1.0 / total)), ms.Tensor(np.float32(1.0 / MICRO))
    acc, loss, aux = None, 0.0, 0.0
    for j, b in enumerate(bs):
        t = {k: ms.Tensor(v) for k, v in b.items()}
        h = None
        for v in range(split.num_virtual):
            h, stats = runners[v % pp].forward(v, j, h, t, lw, aw)
            aux += float(stats[-1].asnumpy()) / MICRO
        loss += float(stats[0].asnumpy())
        g = None
        for v in reversed(range(split.num_virtual)):
            g, grads = runners[v % pp].backward(v, j, g)
            acc = grads if acc is None else [a + x for a, x in zip(acc, grads)]
    assert all(r.in_flight == 0 for r in runners.values())
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert aux == pytest.approx(ref_aux, rel=1e-4, abs=1e-7)
    if model_dict is MLA:
        assert ref_aux > 0   # the MoE aux and MTP losses are in the comparison
    for p, a, r in zip(params, acc, ref_grads):
        a, r = a.asnumpy(), r.asnumpy()
        assert np.abs(a - r).max() <= 1e-4 * max(np.abs(r).max(), 1e-6), p.name
