"""core/layout_cost.py against hand calculations, and core/device_profiles.py."""
import pytest

from mindformers_core.config import load_config
from mindformers_core.core.device_profiles import DeviceProfile, calibrated, get_profile
from mindformers_core.core.layout_cost import (all_to_all, bubble_from_busy, dp_comm_seconds,
                                               layer_flops_per_token, model_flops_per_token,
                                               p2p, ring_all_reduce, ring_gather, step_cost)
from mindformers_core.core.memory_plan import ActivationSettings, Layout, param_counts
from mindformers_core.core.pipeline_split import StageSplit

# a device with round numbers: 1e12 FLOP/s, 1e9 B/s and 1 us inside 8-device nodes, 1e8 B/s
# and 10 us between nodes, no baseline
FLAT = DeviceProfile("flat", "GPU", 1e12, 2e12, 1e12, 8, 1e9, 1e-6, 1e8, 1e-5, 0.0)


def _gpt(**extra):
    model = {"model_type": "gpt", "vocab_size": 1000, "hidden_size": 64, "num_layers": 4,
             "num_attention_heads": 4, "ffn_hidden_size": 256, "seq_length": 128}
    model.update(extra)
    return load_config({"model": model, "training": {"local_batch_size": 2,
                                                     "global_batch_size": 8, "steps": 10},
                        "train_dataset": {"type": "SyntheticMarkov"}})


def test_collective_formulas():
    assert ring_all_reduce(1e9, 1, 1e9, 1e-6) == 0.0
    # 2 (n-1) steps of latency, 2 (n-1)/n of the bytes
    assert ring_all_reduce(4e9, 4, 1e9, 1e-6) == pytest.approx(6e-6 + 6.0)
    assert ring_gather(4e9, 4, 1e9, 1e-6) == pytest.approx(3e-6 + 3.0)
    assert all_to_all(8e8, 8, 1e9, 0.0) == pytest.approx(0.7)
    assert p2p(1e9, 1e9, 1e-3) == pytest.approx(1.001)
    assert bubble_from_busy(6.0, 8.0) == pytest.approx(0.25)


def test_dp_strategies_by_hand():
    # 1e9 parameters, bf16 (2 bytes), 4 ranks, one unit, no latency, 1e9 B/s
    n, kw = 1e9, dict(n=4, param_bytes=2, units=1, num_micro=3, bw=1e9, alpha=0.0)
    assert dp_comm_seconds("no_shard", n, **kw) == pytest.approx(1.5 * 4)      # all-reduce fp32
    assert dp_comm_seconds("optim", n, **kw) == pytest.approx(1.5 * 4 + 0.75 * 2)
    assert dp_comm_seconds("optim_grads", n, **kw) == pytest.approx(0.75 * 4 + 0.75 * 2)
    # FSDP: per micro-batch, gathered twice (forward, backward) and reduce-scattered
    assert dp_comm_seconds("optim_grads_params", n, **kw) == pytest.approx(
        3 * (2 * 0.75 * 2 + 0.75 * 4))
    assert dp_comm_seconds("optim", n, n=1, param_bytes=2, units=1, num_micro=1, bw=1e9,
                           alpha=1.0) == 0.0


def test_layer_flops_by_hand():
    cfg = _gpt()
    counts = param_counts(cfg.model)
    lp = counts.layers[0]
    h, f, s = 64, 256, 128
    matrices = 4 * h * h + 3 * f * h        # qkv + proj (MHA), SwiGLU fc1 (2f) + fc2
    assert lp.attention + lp.mlp == matrices
    s1 = ActivationSettings()
    want = 6 * matrices + 6 * (h + h) * s
    assert layer_flops_per_token(cfg.model, lp, Layout(), s1) == pytest.approx(want)
    # tp 2 halves the matrices and the heads
    assert layer_flops_per_token(cfg.model, lp, Layout(tp=2, dp=1), s1) == pytest.approx(want / 2)
    full = ActivationSettings(recompute="full")
    assert layer_flops_per_token(cfg.model, lp, Layout(), full) == pytest.approx(want * 8 / 6)
    sel = ActivationSettings(recompute="selective")
    assert layer_flops_per_token(cfg.model, lp, Layout(), sel) == pytest.approx(
        want + 2 * 2 * h * s)


def test_step_cost_single_device_by_hand():
    cfg = _gpt()
    counts = param_counts(cfg.model)
    layout = Layout()
    split = StageSplit.build(4, 1)
    st = ActivationSettings(micro_batch=2, num_micro_batches=4)
    cost = step_cost(cfg.model, counts, layout, split, st, FLAT, 0.0, 8)
    per_layer = layer_flops_per_token(cfg.model, counts.layers[0], layout, st)
    flops = 4 * 2 * 128 * (4 * per_layer + 6 * 1000 * 64)   # M b s (layers + output layer)
    assert cost.compute_s == pytest.approx(flops / 1e12)
    assert cost.exposed_comm_s == 0.0 and cost.bubble_s == 0.0
    assert cost.step_s == pytest.approx(cost.compute_s)
    mf = model_flops_per_token(cfg.model, counts) * 8 * 128
    assert cost.mfu == pytest.approx(mf / (cost.step_s * 2e12))


def test_step_cost_tp_pp_dp_by_hand():
    cfg = _gpt()
    counts = param_counts(cfg.model)
    # tp 2 x pp 2 x dp 2 = 8 ranks (one node); 2 micro-batches of 2 per dp rank
    layout = Layout(dp=2, tp=2, pp=2, dp_shard=2, shard_strategy="no_shard")
    split = StageSplit.build(4, 2)
    st = ActivationSettings(micro_batch=2, num_micro_batches=2)
    cost = step_cost(cfg.model, counts, layout, split, st, FLAT, 0.25, 8)
    T = 2 * 128
    # tp: 4 all-reduces of T h c (float32) per layer and micro-batch, 2 layers, 2 micro-batches
    tp_one = ring_all_reduce(T * 64 * 4, 2, 1e9, 1e-6)
    assert cost.comm_s["tp"] == pytest.approx(2 * 2 * 4 * tp_one)
    # pp: forward activation + backward gradient per micro-batch
    assert cost.comm_s["pp"] == pytest.approx(2 * 2 * p2p(T * 64 * 4, 1e9, 1e-6))
    # dp: the last stage's parameters (2 layers / tp, output layer / tp, final norm)
    last = sum(counts.layers[i].per_rank(2, 1) for i in (2, 3)) + counts.output // 2 + 64
    assert cost.comm_s["dp"] == pytest.approx(
        dp_comm_seconds("no_shard", last, 2, 4, 4, 2, 1e9, 1e-6))
    # bubble 0.25 stretches the busiest stage's M micro-batches by 1 / (1 - 0.25)
    busiest = cost.compute_s + cost.comm_s["tp"]
    assert cost.bubble_s == pytest.approx(busiest / 0.75 - busiest)
    assert cost.step_s == pytest.approx(busiest / 0.75 + cost.comm_s["pp"] + cost.comm_s["dp"])


def test_links_and_oversubscription():
    assert FLAT.link(8) == (1e9, 1e-6) and FLAT.link(16) == (1e8, 1e-5)
    cpu = DeviceProfile("c", "CPU", 0, 1e11, 8e9, 1 << 30, 1e9, 0, 1e9, 0, 0, cores=2)
    assert cpu.rate_per_worker(1) == 8e9 and cpu.rate_per_worker(2) == 8e9
    assert cpu.rate_per_worker(4) == 4e9          # 4 workers share 2 cores
    assert get_profile("ascend910b").memory_bytes == 64 * 1024 ** 3
    with pytest.raises(ValueError, match="unknown device 'tpu'; known: ascend910b, cpu, gpu80g"):
        get_profile("tpu")
    c = calibrated(get_profile("cpu"), {"matmul_flops": 5e9, "intra_bandwidth_Bps": 2e9,
                                        "intra_latency_s": 1e-4, "other": 1})
    assert c.matmul_flops == 5e9 and c.inter_bandwidth_Bps == 2e9 and c.inter_latency_s == 1e-4


def test_moe_experts_as_run():
    cfg = load_config("configs/muon_deepseek_v3_tiny.yaml")
    counts = param_counts(cfg.model)
    moe = counts.layers[1]
    assert moe.num_experts == 4
    dense = ActivationSettings(moe_dispatch="dense")
    a2a = ActivationSettings(moe_dispatch="alltoall")
    f_dense = layer_flops_per_token(cfg.model, moe, Layout(), dense)
    f_a2a = layer_flops_per_token(cfg.model, moe, Layout(dp=2, ep=2), a2a)
    # dense: all 4 experts on every token; all-to-all: k = 2 of them
    assert f_dense - f_a2a == pytest.approx(6 * moe.experts / 2)
