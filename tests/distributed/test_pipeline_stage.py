"""The stage forward/backward of distributed/pipeline_stage.py on one process: every stage's
schedule program, with the transfers handing tensors between the stages' executors, gives the
gradients, loss, aux loss and expert loads of the whole model's accumulate_gradients on the
same micro-batches."""
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


def build(model_dict, micro=MICRO):
    from mindformers_core.config import load_config
    from mindformers_core.models import build_model
    cfg = load_config({"training": {"steps": 1, "local_batch_size": ROWS,
                                    "global_batch_size": ROWS * micro},
                       "optimizer": {"type": "AdamW"},
                       "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
                       "model": model_dict})
    return build_model(cfg.model, seed=3)


def batches(n=MICRO):
    rng = np.random.default_rng(5)
    out = []
    for _ in range(n):
        t = rng.integers(0, VOCAB, (ROWS, SEQ + 1)).astype(np.int32)
        out.append({"input_ids": t[:, :-1], "labels": t[:, 1:],
                    "loss_mask": (rng.random((ROWS, SEQ)) > 0.3).astype(np.float32)})
    return out


def drive(programs, ex):
    """Run every stage's program on one process: compute in each stage's order, a transfer
    hands the tensor from one StageExecutor to the other once both reach it. Returns each
    stage's peak of in-flight micro-batches."""
    from mindformers_core.distributed.pipeline_schedule import Transfer
    stages = sorted(programs)
    pos = {s: 0 for s in stages}
    peak = {s: 0 for s in stages}
    while any(pos[s] < len(programs[s]) for s in stages):
        for s in stages:
            while pos[s] < len(programs[s]) and not isinstance(programs[s][pos[s]], Transfer):
                ex[s].compute(programs[s][pos[s]])
                peak[s] = max(peak[s], ex[s].runner.in_flight)
                pos[s] += 1
            if pos[s] < len(programs[s]):
                t = programs[s][pos[s]]
                peer = t.dst if t.src == s else t.src
                if pos[peer] < len(programs[peer]) and programs[peer][pos[peer]] == t:
                    ex[t.dst].incoming(t, ex[t.src].outgoing(t))
                    pos[s] += 1
                    pos[peer] += 1
    return peak


def run_pipeline_in_one_process(model, split, bs, total, name):
    """Every stage's program (distributed/pipeline_schedule.py) on one process over one model."""
    import mindspore as ms
    from mindformers_core.distributed.pipeline_parallel import micro_batch_tensors
    from mindformers_core.distributed.pipeline_schedule import p2p_program, schedule
    from mindformers_core.distributed.pipeline_stage import StageExecutor, StageRunner
    pp, vpp = split.pp, split.vpp
    ranks = {s: s for s in range(pp)}
    programs = p2p_program({s: schedule(name, pp, s, len(bs), vpp) for s in range(pp)},
                           pp, vpp, ranks)
    params = list(model.trainable_params())
    lw, aw = ms.Tensor(np.float32(1.0 / total)), ms.Tensor(np.float32(1.0 / len(bs)))
    ex = {s: StageExecutor(StageRunner(model, split, s, params), micro_batch_tensors(bs), lw, aw)
          for s in range(pp)}
    peak = drive(programs, ex)
    results = [ex[s].result() for s in range(pp)]
    grads = [sum(parts[1:], parts[0]) for parts in zip(*(r[0] for r in results))]
    return grads, sum(r[1] for r in results), sum(r[2] for r in results), peak


def whole_model(model_dict, pp, vpp):
    """The step's micro-batches, their loss tokens, the whole model, its trainable parameters
    and accumulate_gradients' (gradients, loss sum, aux) on them."""
    import mindspore as ms
    from mindformers_core.trainer.accumulate import (accumulate_gradients, count_loss_tokens,
                                                     make_grad_fn)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    bs = batches(MICRO if vpp == 1 else 2 * pp)
    total = count_loss_tokens(bs)
    model = build(model_dict, len(bs))
    params = list(model.trainable_params())
    return bs, total, model, params, accumulate_gradients(make_grad_fn(model, params), bs,
                                                          total, 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("model_dict,pp,vpp,lps", [
    (GPT, 2, 1, None), (GPT, 2, 1, ["0-0", "1-3"]), (GPT, 2, 2, None),
    (dict(GPT, tie_word_embeddings=True), 4, 1, None),
    (MLA, 2, 2, None),    # MoE aux, MTP and the tied table on the last stage
    (dict(MLA, tie_word_embeddings=False), 2, 1, ["0-2", "3-3"])])
def test_stage_programs_equal_the_whole_model(model_dict, pp, vpp, lps):
    bs, total, ref_model, params, (ref_grads, ref_loss, ref_aux) = whole_model(model_dict, pp,
                                                                               vpp)
    ref_loads = ref_model.get_tokens_per_expert()
    model = build(model_dict, len(bs))
    split = StageSplit.build(model_dict["num_layers"], pp, vpp, lps,
                             shares_embedding=bool(model_dict.get("tie_word_embeddings")
                                                   or model_dict.get("num_nextn_predict_layers")))
    grads, loss, aux, peak = run_pipeline_in_one_process(
        model, split, bs, total, "1f1b" if vpp == 1 else "interleaved_1f1b")
    if vpp == 1:   # 1F1B holds at most pp - stage micro-batches
        assert peak == {s: min(pp - s, len(bs)) for s in range(pp)}
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert aux == pytest.approx(ref_aux, rel=1e-4, abs=1e-7)
    if model_dict is MLA:
        assert ref_aux > 0   # the MoE aux and MTP losses are in the comparison
    # the recompute for the backward does not count the expert loads twice
    for i, load in model.get_tokens_per_expert().items():
        np.testing.assert_array_equal(load, ref_loads[i])
    for p, a, r in zip(params, grads, ref_grads):
        a, r = a.asnumpy(), r.asnumpy()
        assert np.abs(a - r).max() <= 1e-4 * max(np.abs(r).max(), 1e-6), p.name


def run_released_stages(model_dict, split, bs, total, name):
    """Every stage on its own model with the other stages' parameters released (what a
    pipeline rank holds), the programs run by ``drive``: (per
    stage: held bytes, owned params, their gradients), loss, aux."""
    import mindspore as ms
    from mindformers_core.distributed.pipeline_parallel import micro_batch_tensors
    from mindformers_core.distributed.pipeline_release import (held_parameter_bytes,
                                                               release_foreign_parameters)
    from mindformers_core.distributed.pipeline_schedule import p2p_program, schedule
    from mindformers_core.distributed.pipeline_stage import StageExecutor, StageRunner
    pp, vpp = split.pp, split.vpp
    models = {s: build(model_dict, len(bs)) for s in range(pp)}
    shapes = {s: release_foreign_parameters(models[s], split, s) for s in range(pp)}
    held = {s: held_parameter_bytes(models[s]) for s in range(pp)}
    params = {s: list(models[s].trainable_params()) for s in range(pp)}
    programs = p2p_program({s: schedule(name, pp, s, len(bs), vpp) for s in range(pp)},
                           pp, vpp, {s: s for s in range(pp)})
    lw, aw = ms.Tensor(np.float32(1.0 / total)), ms.Tensor(np.float32(1.0 / len(bs)))
    ex = {s: StageExecutor(StageRunner(models[s], split, s, params[s]), micro_batch_tensors(bs),
                           lw, aw) for s in range(pp)}
    drive(programs, ex)
    results = {s: ex[s].result() for s in range(pp)}
    return (held, shapes, params, {s: results[s][0] for s in range(pp)},
            sum(r[1] for r in results.values()), sum(r[2] for r in results.values()))


@pytest.mark.slow
@pytest.mark.parametrize("model_dict,pp,vpp,lps", [
    (dict(GPT, tie_word_embeddings=True), 2, 1, ["0-0", "1-3"]),
    (MLA, 2, 2, None)])
def test_released_stages_hold_their_share_and_equal_the_whole_model(model_dict, pp, vpp, lps):
    """A rank keeps only its stage's parameter bytes (the dtype's itemsize times the element
    count of every parameter it holds, the shared table on both ends), and the stages run on
    those alone give the whole model's gradients (the shared table's summed over its two
    stages, as PipelineParallel.reduce does) and loss."""
    bs, total, ref_model, ref_params, (ref_grads, ref_loss, ref_aux) = whole_model(model_dict,
                                                                                   pp, vpp)
    full_bytes = {p.name: int(np.prod(p.shape)) * 4 for p in ref_model.get_parameters()}
    split = StageSplit.build(model_dict["num_layers"], pp, vpp, lps, shares_embedding=True)
    held, shapes, params, grads, loss, aux = run_released_stages(
        model_dict, split, bs, total, "1f1b" if vpp == 1 else "interleaved_1f1b")
    for s in range(pp):
        share = sum(b for n, b in full_bytes.items() if s in split.holders(n))
        assert 0 < share < sum(full_bytes.values())
        assert held[s] == share, s
        assert shapes[s] == {p.name: tuple(p.shape) for p in ref_model.get_parameters()}
        assert sorted(p.name for p in params[s]) == sorted(
            p.name for p in ref_params if s in split.holders(p.name))
    table = "embedding.word_embeddings.weight"
    assert sum(held.values()) == sum(full_bytes.values()) + full_bytes[table]
    got = {}
    for s in range(pp):
        for p, g in zip(params[s], grads[s]):
            got[p.name] = g.asnumpy() + got.get(p.name, 0.0)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert aux == pytest.approx(ref_aux, rel=1e-4, abs=1e-7)
    assert sorted(got) == sorted(p.name for p in ref_params)
    for p, r in zip(ref_params, ref_grads):
        r = r.asnumpy()
        assert np.abs(got[p.name] - r).max() <= 1e-4 * max(np.abs(r).max(), 1e-6), p.name
