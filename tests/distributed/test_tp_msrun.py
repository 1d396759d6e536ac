"""Tensor parallel 2 with sequence parallel on real msrun CPU workers == 1 process.

Two msrun launches through scripts/msrun_launcher.sh (tests/distributed/tp_worker.py):

A. 2 workers (tp 2, dp 1): one forward/backward of the tiny GPT (GQA) and the tiny
   DeepSeek-V3 (MLA + MoE), each rank's local gradients against its slice of the unsharded
   model's gradients, its local-head max logits and its parameter bytes; then the real
   Trainer, 10 steps of each model with AdamW;
B. 4 workers (tp 2 x dp 2, ZeRO-1 over the dp group): the Trainer, 10 steps of the GPT.

This process runs the single-process Trainer on the same global batch and compares the
per-step loss and grad_norm (relative 1e-4), the MoE aux loss and expert loads.
"""
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from msrun_util import launch  # noqa: E402
from tp_case import CONFIGS, STEPS  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
WORKER = os.path.join(HERE, "tp_worker.py")


def run_workers(out, what, names, workers):
    proc, _ = launch(f"python {WORKER} {out} {what} " + " ".join(names), out / "logs",
                     timeout=1200, workers=workers)
    if proc.returncode != 0:
        logs = "".join(open(out / "logs" / f).read()[-3000:] for f in os.listdir(out / "logs")
                       if f.startswith("worker_"))
        pytest.fail(f"msrun job failed ({proc.returncode}):\n{proc.stderr[-2000:]}\n{logs}")
    return out


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    return run_workers(tmp_path_factory.mktemp("tp2"), "all", ["gpt", "dsv3"], 2)


@pytest.fixture(scope="module")
def tp2dp2(tmp_path_factory):
    return run_workers(tmp_path_factory.mktemp("tp2dp2"), "train", ["gpt"], 4)


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


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


@pytest.mark.parametrize("name", ["gpt", "dsv3"])
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
    if name == "dsv3":
        assert "decoder.layers.0.self_attention.linear_kv_up_proj.weight" in r["sharded"]
        assert "decoder.layers.1.mlp.router.weight" not in r["sharded"]


@pytest.mark.parametrize("name", ["gpt", "dsv3"])
def test_tp2_trainer_equals_one_process(tp2, single, name):
    got, want = read_metrics(tp2 / name), single[name]
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for g, w in zip(got, want):
        assert close(g["loss"], w["loss"]), (g["step"], g["loss"], w["loss"])
        assert close(g["grad_norm"], w["grad_norm"]), (g["step"], g["grad_norm"], w["grad_norm"])
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-12)
        if name == "dsv3":
            assert close(g["aux_loss"], w["aux_loss"])
            assert g["moe"]["layers"]["1"]["tokens_per_expert"] == \
                w["moe"]["layers"]["1"]["tokens_per_expert"]
    assert want[0]["loss"] - want[-1]["loss"] > 0.1    # the runs trained
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


def test_tp2_dp2_on_four_workers_equals_one_process(tp2dp2, tp2, single):
    got, want = read_metrics(tp2dp2 / "gpt"), single["gpt"]
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for g, w in zip(got, want):
        assert close(g["loss"], w["loss"]), (g["step"], g["loss"], w["loss"])
        assert close(g["grad_norm"], w["grad_norm"]), (g["step"], g["grad_norm"], w["grad_norm"])
    ranks = []
    for rank in range(4):
        with open(tp2dp2 / f"train.gpt.rank{rank}.json") as fh:
            ranks.append(json.load(fh))
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
