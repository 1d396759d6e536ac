"""Tensor parallel 2 with sequence parallel on real msrun CPU workers == 1 process.

Two cases of the layout matrix (layout_cases.py: ``tp2`` in the world-2 launch, ``tp2_dp2``
in the world-4 one) run tests/distributed/tp_worker.py:

A. 2 workers (tp 2, dp 1): one forward/backward of the tiny GPT (GQA), that GPT as a Qwen3
   (q/k head norms, head dim 12) and the tiny DeepSeek-V3 (MLA + MoE), each rank's local
   gradients against its slice of the unsharded model's gradients, its local-head max logits
   and its parameter bytes; then the real Trainer, 10 steps of each model with AdamW, and of
   the DeepSeek-V3 with Muon under ``comm_strategy`` allgather and allgather_deredundency
   (PyNative) and deredundency under ``training.jit: layer``, QK-Clip on at a threshold that
   clips heads every step;
B. 4 workers (tp 2 x dp 2, ZeRO-1 over the dp group): the Trainer, 10 steps of the GPT with
   AdamW and of the DeepSeek-V3 with Muon (allgather_deredundency, QK-Clip).

This process runs the single-process Trainer on the same global batch and compares the
per-step loss and grad_norm (relative 1e-4), the MoE aux loss and expert loads, and for Muon
the QK-Clip report (clipped heads summed over the tp ranks, the largest logit).
"""
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from msrun_util import read_metrics  # noqa: E402
from pathlib import Path  # noqa: E402
from tp_case import CONFIGS, MODELS, MUON_CASES, STEPS  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("tp",)


@pytest.fixture(scope="module")
def tp2(layout_matrix):
    """Case ``tp2`` of the layout matrix (layout_cases.py): tp_worker ``all`` on 2 workers."""
    return Path(layout_matrix.case_dir("tp2"))


@pytest.fixture(scope="module")
def tp2dp2(layout_matrix):
    """Case ``tp2_dp2``: tp_worker ``train`` gpt, dsv3_muon_deredundency on 4 workers."""
    return Path(layout_matrix.case_dir("tp2_dp2"))


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The 1-process Trainer runs (global batch 4 as 2 micro-batches of 2)."""
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    out = {}
    for name, make in CONFIGS.items():
        run_dir = tmp_path_factory.mktemp(f"single_{name}")
        Trainer(make(str(run_dir)), str(run_dir)).train()
        out[name] = read_metrics(run_dir)
    return out


def close(got, want, rel=1e-4) -> bool:
    return abs(got - want) <= rel * abs(want)


@pytest.mark.parametrize("name", ["gpt", "qwen3", "dsv3"])
def test_local_gradients_are_slices_of_the_unsharded_gradients(tp2, name):
    for rank in (0, 1):
        with open(tp2 / f"grad.{name}.rank{rank}.json") as fh:
            r = json.load(fh)
        full_loss, tp_loss = r["loss_sum"]
        assert close(tp_loss, full_loss, 1e-5)
        assert r["aux"][1] == pytest.approx(r["aux"][0], rel=1e-5)
        bad = {k: v for k, v in r["grad_rel_err"].items() if v > 1e-4}
        assert not bad, bad
        # max logits: [layers, local heads], the unsharded model's heads of this rank
        assert r["max_logits_shape"] == [2, 2]
        assert r["max_logits_rel_err"] < 1e-5
        # every sharded parameter holds half the bytes, replicated ones all of them
        for pname, full in r["bytes_full"].items():
            want = full // 2 if pname in r["sharded"] else full
            assert r["bytes_tp"][pname] == want, pname
    if name == "qwen3":   # the q/k gains are replicated (their gradient is summed over tp)
        assert "decoder.layers.0.self_attention.linear_qkv.weight" in r["sharded"]
        assert "decoder.layers.0.self_attention.q_layernorm.weight" in r["grad_rel_err"]
        assert "decoder.layers.0.self_attention.k_layernorm.weight" not in r["sharded"]
    if name == "dsv3":
        assert "decoder.layers.0.self_attention.linear_kv_up_proj.weight" in r["sharded"]
        assert "decoder.layers.1.mlp.router.weight" not in r["sharded"]


def assert_same_steps(got, want, name, aux=True):
    """Per-step loss and grad_norm (rel 1e-4), lr; MoE loads and (``aux``) aux loss; QK-Clip
    report. ``aux`` False under dp > 1: the logged aux loss is rank 0's micro-batches' mean
    there (the data-parallel reducer does not average it over the replicas)."""
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for g, w in zip(got, want):
        assert close(g["loss"], w["loss"]), (g["step"], g["loss"], w["loss"])
        assert close(g["grad_norm"], w["grad_norm"]), (g["step"], g["grad_norm"], w["grad_norm"])
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-12)
        if name.startswith("dsv3"):
            assert not aux or close(g["aux_loss"], w["aux_loss"])
            assert g["moe"]["layers"]["1"]["tokens_per_expert"] == \
                w["moe"]["layers"]["1"]["tokens_per_expert"]
        if name in MUON_CASES:
            # each tp rank clipped its local heads; the report is one process's
            assert g["qk_clipped_heads"] == w["qk_clipped_heads"], g["step"]
            assert close(g["max_attention_logit"], w["max_attention_logit"])
    if name in MUON_CASES:
        assert all(w["qk_clipped_heads"] > 0 for w in want)    # the threshold clips heads
    assert want[0]["loss"] - want[-1]["loss"] > 0.1    # the runs trained


@pytest.mark.parametrize("name", MODELS + MUON_CASES)
def test_tp2_trainer_equals_one_process(tp2, single, name):
    assert_same_steps(read_metrics(tp2 / name), single[name], name)
    for rank in (0, 1):
        with open(tp2 / f"train.{name}.rank{rank}.json") as fh:
            meta = json.load(fh)
        assert meta["world"] == 2 and meta["data_rank"] == 0   # both tp ranks read one shard


def test_tp2_sharded_layers_hold_half_the_bytes_per_rank(tp2):
    with open(tp2 / "grad.gpt.rank0.json") as fh:
        r = json.load(fh)
    sharded = r["sharded"]
    full = sum(r["bytes_full"][n] for n in sharded)
    for rank in (0, 1):
        with open(tp2 / f"train.gpt.rank{rank}.json") as fh:
            per_rank = json.load(fh)["bytes"]
        assert sum(per_rank[n] for n in sharded) / full == pytest.approx(0.5)


def train_meta(out, name, workers=2):
    return [json.load(open(out / f"train.{name}.rank{r}.json")) for r in range(workers)]


def test_tp2_muon_uses_full_shapes_and_deredundency_splits_the_newton_schulz(tp2):
    with open(tp2 / "grad.dsv3.rank0.json") as fh:
        layout = json.load(fh)
    for name in MUON_CASES:
        for meta in train_meta(tp2, name):
            assert meta["optimizer"] == "Muon"
            # the pieces and the scale of a split weight come from its unsharded shape
            for pname in layout["sharded"]:
                assert 4 * int(np.prod(meta["full_shapes"][pname])) == \
                    layout["bytes_full"][pname], pname
    gathered = train_meta(tp2, "dsv3_muon_allgather")
    assert gathered[0]["ns_flops"] == gathered[1]["ns_flops"] > 0   # every rank runs every NS
    for name in ("dsv3_muon_deredundency", "dsv3_muon_layer"):
        dr = train_meta(tp2, name)
        owners = dr[0]["owners"]
        assert owners == dr[1]["owners"] and set(owners.values()) == {0, 1}
        assert set(owners) <= set(layout["sharded"])      # only split weights have owners
        for meta in dr:      # each rank orthogonalises its owned split weights only
            assert meta["ns_flops"] < 0.85 * gathered[0]["ns_flops"], meta["ns_flops"]


def test_tp2_dp2_muon_with_zero_on_four_workers_equals_one_process(tp2dp2, tp2, single):
    name = "dsv3_muon_deredundency"
    assert_same_steps(read_metrics(tp2dp2 / name), single[name], name, aux=False)
    # ZeRO-1 over dp on top of the TP shards: about half of a tp-2 rank's Muon state
    unsharded = train_meta(tp2, name)[0]["state_bytes"]
    for m in train_meta(tp2dp2, name, 4):
        assert m["optimizer"] == "ShardedMuon"
        assert 0.45 <= m["state_bytes"] / unsharded <= 0.6, (m["state_bytes"], unsharded)


def test_tp2_dp2_on_four_workers_equals_one_process(tp2dp2, tp2, single):
    assert_same_steps(read_metrics(tp2dp2 / "gpt"), single["gpt"], "gpt")
    ranks = train_meta(tp2dp2, "gpt", 4)
    # Megatron order: tp {0,1} {2,3}; dp index = rank // 2 picks the data shard
    assert [m["data_rank"] for m in ranks] == [0, 0, 1, 1]
    assert all(m["world"] == 4 for m in ranks)
    assert np.all([ranks[0]["bytes"] == ranks[2]["bytes"], ranks[1]["bytes"] == ranks[3]["bytes"]])
    # ZeRO-1 over the dp group on the local shards: each rank keeps about half of the AdamW
    # state a tp-2 rank without data parallelism keeps
    with open(tp2 / "train.gpt.rank0.json") as fh:
        unsharded = json.load(fh)["state_bytes"]
    for m in ranks:
        assert 0.45 <= m["state_bytes"] / unsharded <= 0.55, (m["state_bytes"], unsharded)
