"""``tensor_parallel: 2`` (+sp) x ``expert_parallel: 2`` on 4 msrun CPU workers == 1 process on
the same global batch (``tpep_case``: the tiny DeepSeek-V3 with 4 layers, Muon with QK-Clip at
threshold 1.0 and 0.05 (clipping every step) under the two comm strategies (the second with
the deredundant dispatch), AdamW):
per-step loss, grad norm, lr, aux loss, expert loads and clipped heads over 10 steps (rel 1e-4;
the tiny config has no MTP, which tensor parallelism refuses).

Also checked: each rank holds its tp slices and its 2 whole experts (the single-process
weights' pieces at the end of the run, by their ShardSpecs), the experts' optimizer state stays
whole on their rank, and every rank applies the single-process expert-bias update. Sharded
checkpoints (``CKPT_CASE``): the 4-rank step-7 checkpoint holds the single-process shapes,
and resumed under tp x ep or on one process it gives the uninterrupted run's steps 8-10 (rel
1e-5; the one-process run's within the layouts' 1e-4).
"""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from tpep_case import (CASES, CKPT_CASE, MOE_LAYERS, SAVE_AT, STEPS, WORKERS, checkpoint_at,  # noqa: E402
                       reference)
from msrun_util import read_metrics, rel_err  # noqa: E402
from rank_layout import load_layouts, single_process  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("tpep",)


@pytest.fixture(scope="module")
def runs(layout_matrix):
    """Case ``tpep`` of the layout matrix's world-4 launch (layout_cases.py)."""
    out = Path(layout_matrix.case_dir("tpep"))
    res = {}
    for name in CASES:
        for rank, layout in load_layouts(out, name, WORKERS).items():
            res[name, rank] = layout
        res[name] = read_metrics(out / name)
    res[f"{CKPT_CASE}_resumed"] = read_metrics(out / f"{CKPT_CASE}_resumed")
    res["out"] = out
    return res


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    from tpep_case import case_config
    return {name: single_process(case_config(name, False), tmp_path_factory.mktemp(name))
            for name in sorted({reference(c) for c in CASES})}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_grad_norm_and_routing_match_one_process(runs, references, case):
    ref = references[reference(case)]["metrics"]
    got = runs[case]
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, STEPS + 1))
    for g, w in zip(got, ref):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), g["step"]
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4), g["step"]
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-12)
        assert g["aux_loss"] == pytest.approx(w["aux_loss"], rel=1e-4), g["step"]
        assert g.get("qk_clipped_heads") == w.get("qk_clipped_heads"), g["step"]
        if "max_attention_logit" in w:
            assert g["max_attention_logit"] == pytest.approx(w["max_attention_logit"], rel=1e-4)
        for layer in MOE_LAYERS:   # the micro-batches' global loads
            gl, wl = g["moe"]["layers"][layer], w["moe"]["layers"][layer]
            assert gl["tokens_per_expert"] == wl["tokens_per_expert"], (g["step"], layer)
            assert gl["aux_loss"] == pytest.approx(wl["aux_loss"], rel=1e-4)
    if "optimizer.qk_clip_threshold=0.05" in CASES[case][1]:   # heads clipped in most steps
        # (the 2-layer model's max logits are 0.048-0.085: 7 of the 10 steps clip)
        assert sum(r["qk_clipped_heads"] > 0 for r in ref) >= STEPS // 2
    assert ref[-1]["loss"] < ref[0]["loss"]       # the runs trained


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_holds_its_slices_and_experts(runs, references, case):
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.distributed.shard_spec import ShardSpec, shard
    ref = references[reference(case)]["params"]
    dims = make_mesh(WORKERS, tp=2, ep=2)
    for rank in range(WORKERS):
        meta, local = runs[case, rank]
        groups = {s[2] for s in meta["specs"].values()}
        assert groups == {"tp", "ep"}, groups
        experts = [k for k, s in meta["specs"].items() if s[2] == "ep"]
        assert len(experts) == 2 * len(MOE_LAYERS)   # weight1 / weight2 of each MoE layer
        for name, (full, dim, group, n) in meta["specs"].items():
            spec = ShardSpec(tuple(full), dim, group, n)
            want = shard(spec, ref[name], dims.coords(rank)[group])
            assert local[name].shape == want.shape, name
            assert rel_err(local[name], want) < 1e-4, (rank, name)
        for name in experts:   # the experts' state stays whole on their rank (not ZeRO rows)
            for key, shape in meta["state_shapes"].items():
                if key.endswith(name):
                    assert shape == meta["local_shapes"][name], key
        for key, bias in meta["expert_bias"].items():   # the single-process bias update
            assert np.array_equal(np.float32(bias), ref[key]), key
            assert np.abs(ref[key]).max() > 0


def by_step(rows):
    return {r["step"]: r for r in rows if "loss" in r}


def assert_same_steps(got, want, tol):
    for step in range(SAVE_AT + 1, STEPS + 1):
        for key in ("loss", "grad_norm"):
            assert got[step][key] == pytest.approx(want[step][key], rel=tol), (step, key)


def test_checkpoint_holds_full_shapes_and_resumes_under_tp_x_ep(runs, references):
    from mindformers_core.checkpoint.store import load_checkpoint
    index = checkpoint_at(str(runs["out"] / CKPT_CASE), SAVE_AT)
    data = load_checkpoint(index)
    want = {k: v.shape for k, v in references[reference(CKPT_CASE)]["params"].items()}
    got = {k[len("model."):]: v.shape for k, v in data.tensors.items() if k.startswith("model.")}
    assert got == want
    resumed = by_step(runs[f"{CKPT_CASE}_resumed"])
    assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1))
    assert_same_steps(resumed, by_step(runs[CKPT_CASE]), 1e-5)


def test_tp_x_ep_checkpoint_resumes_on_one_process(runs, references, tmp_path):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from tpep_case import case_config
    index = checkpoint_at(str(runs["out"] / CKPT_CASE), SAVE_AT)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(case_config(CKPT_CASE, False, [f"checkpoint.load_path={index}"]), str(tmp_path),
            overwrite=True).train()
    got = by_step(read_metrics(tmp_path))
    assert sorted(got) == list(range(SAVE_AT + 1, STEPS + 1))
    assert_same_steps(got, by_step(runs[CKPT_CASE]), 1e-5)
    assert_same_steps(got, by_step(references[reference(CKPT_CASE)]["metrics"]), 1e-4)
