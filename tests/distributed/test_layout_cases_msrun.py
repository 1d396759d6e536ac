"""Every ``TrainerCase`` of ``layout_cases.LAYOUTS``: N msrun workers under the case's layout
== 1 process on the same config, per step, on the case's metrics and tolerance (the real
Trainer on both sides; the N-worker runs come from one msrun launch per world size, the
layout-matrix harness of layout_matrix.py). A case's extra checks are named in ``CHECKS``."""
import math
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from layout_cases import LAYOUTS  # noqa: E402
from layout_matrix import compare_rows  # noqa: E402
from msrun_util import read_metrics  # noqa: E402

LAYOUT_GROUPS = ("layouts",)
#: a checkpoint resumed under another layout against the uninterrupted run (issue 30)
RESUMED_RTOL = 1e-6


def finite_mtp_loss(name, got, want):
    values = [r["mtp_loss"] for r in got if "mtp_loss" in r]
    assert values and all(math.isfinite(v) for v in values), f"{name}: mtp_loss {values}"


def qk_clip_active(name, got, want):
    """QK-Clip clipped heads (the compared max logits changed the weights)."""
    clipped = [r["qk_clipped_heads"] for r in want if "loss" in r]
    assert sum(clipped) > 0, f"{name}: qk_clipped_heads {clipped}"


def moe_layers_whole(name, got, want):
    """Each MoE layer's logged expert loads (the expert-bias counts) equal one process's and
    its aux loss is the whole sequences' (the cp parts summed), per step."""
    ref = {r["step"]: r["moe"]["layers"] for r in want if "moe" in r}
    rows = [r for r in got if "moe" in r]
    assert rows and [r["step"] for r in rows] == sorted(ref), (name, [r["step"] for r in rows])
    for r in rows:
        for layer, stats in r["moe"]["layers"].items():
            w = ref[r["step"]][layer]
            assert stats["tokens_per_expert"] == w["tokens_per_expert"], (name, r["step"], layer)
            assert math.isclose(stats["aux_loss"], w["aux_loss"], rel_tol=1e-4), \
                (name, r["step"], layer, stats["aux_loss"], w["aux_loss"])


def rows_stored(name, case_dir):
    """tp x FSDP stored every rank's weights as dp rows of its tp slice: in each rank file of
    the step-4 checkpoint a row-parallel weight's model piece is a quarter of the whole
    (columns over tp, rows over dp), and every piece of a tp-split weight has its dp rows."""
    import json
    import struct
    ckpt = os.path.join(case_dir, "checkpoint")
    files = sorted(f for f in os.listdir(ckpt) if "step00000004.rank" in f)
    assert len(files) == 4, (name, files)
    for f in files:
        with open(os.path.join(ckpt, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            pieces = json.loads(json.loads(fh.read(n))["__metadata__"]["pieces"])
        fc2 = pieces["model.decoder.layers.0.mlp.linear_fc2.weight"]
        assert fc2["group"] == "tp" and fc2["split_dim"] == 1 and fc2["zero_shards"] == 2, fc2
        assert fc2["shape"][0] * fc2["shape"][1] * 4 == fc2["full_shape"][0] * \
            fc2["full_shape"][1], (name, f, fc2)
        split = [k for k, p in pieces.items() if k.startswith("model.") and p["group"] == "tp"]
        assert split and all(pieces[k]["zero_rows"] is not None for k in split), (name, f)


def cp_rows_stored(name, case_dir, ep=1):
    """cp x FSDP stored each weight as rows over dp x cp: in rank r's file of the step-4
    checkpoint every model piece of a split weight is group ``dp_cp``, one of 4 row blocks,
    at the rank's dp_cp coordinate (ParallelDims.coords), and a matrix weight is split; under
    cp x ep x FSDP (``ep`` > 1) the routed experts are pieces of the ep group instead, the
    rank's ep block."""
    import json
    import struct
    from mindformers_core.core.parallel_dims import make_mesh
    mesh = make_mesh(4, cp=2, ep=ep)
    ckpt = os.path.join(case_dir, "checkpoint")
    files = sorted(f for f in os.listdir(ckpt) if "step00000004.rank" in f)
    assert len(files) == 4, (name, files)
    for rank, f in enumerate(files):
        with open(os.path.join(ckpt, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            pieces = json.loads(json.loads(fh.read(n))["__metadata__"]["pieces"])
        split = {k: p for k, p in pieces.items() if k.startswith("model.") and p["group"]}
        assert "model.decoder.layers.0.mlp.linear_fc1.weight" in split, (name, f, sorted(split))
        experts = {k: p for k, p in split.items() if p["group"] == "ep"}
        assert bool(experts) == (ep > 1), (name, f, sorted(experts))
        for key, p in experts.items():
            assert p["num_shards"] == ep and p["shard_index"] == mesh.coords(rank)["ep"], \
                (name, f, key, p)
        for key, p in split.items():
            if key in experts:
                continue
            assert p["group"] == "dp_cp" and p["num_shards"] == 4, (name, f, key, p)
            assert p["shard_index"] == mesh.coords(rank)["dp_cp"], (name, f, key, p)
            assert p["shape"][0] * 4 == p["full_shape"][0], (name, f, key, p)


def state_replicated(name, case_dir):
    """``no_shard`` kept the optimizer state whole: the step-4 checkpoint is one file whose
    optimizer entries have their weights' shapes (no rank files: nothing is split), or under
    tp one file per rank whose every optimizer piece is one ZeRO shard of the shape of its
    weight's tp slice, where ZeRO-1 (``optim``) stores rows of it over dp."""
    import json
    import struct
    from safetensors.numpy import load_file
    ckpt = os.path.join(case_dir, "checkpoint")
    files = sorted(f for f in os.listdir(ckpt) if "step00000004.rank" in f)
    if not files:
        tensors = load_file(os.path.join(ckpt, "mindformers_core_step00000004.safetensors"))
        state = [k for k in tensors if k.startswith("optim.adam_")]
        assert state, (name, sorted(tensors)[:5])
        for key in state:
            weight = tensors["model." + key.split(".", 2)[2]]
            assert tensors[key].shape == weight.shape, (name, key, tensors[key].shape)
        return
    assert len(files) == 4, (name, files)
    for f in files:
        with open(os.path.join(ckpt, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            pieces = json.loads(json.loads(fh.read(n))["__metadata__"]["pieces"])
        state = {k: p for k, p in pieces.items() if k.startswith("optim.adam_")}
        assert state, (name, f, sorted(pieces)[:5])
        for key, p in state.items():
            weight = pieces["model." + key.split(".", 2)[2]]
            assert p["zero_shards"] == 1 and p["shape"] == weight["shape"], (name, f, key, p)


def split_rebuilds(name, case_dir):
    """``tools/convert_checkpoint.py`` writes tp x FSDP checkpoints: the step-4 checkpoint,
    merged to one file and split again with the layout of the run (its tp pieces, ZeRO-1
    over dp 2, ``fsdp_rows``), gives every rank file's tensors and pieces, bit for bit."""
    from safetensors.numpy import load_file
    from mindformers_core.checkpoint.file_io import read_header
    from mindformers_core.checkpoint.sharded import rank_file_name
    from mindformers_core.tools.convert_checkpoint import merge, split
    index = "mindformers_core_step00000004.safetensors"
    ckpt, out = os.path.join(case_dir, "checkpoint"), os.path.join(case_dir, "split_again")

    def pieces(path):
        meta = read_header(path, os.path.getsize(path))["__metadata__"]
        return {k: v for k, v in __import__("json").loads(meta["pieces"]).items()}

    files = [os.path.join(ckpt, rank_file_name(index, r, 4)) for r in range(4)]
    specs = {k[len("model."):]: p for k, p in pieces(files[0]).items()
             if k.startswith("model.") and p["group"] == "tp"}
    layout = {"world": 4, "mesh": {"tp": 2}, "zero_shards": 2, "fsdp_rows": {"num_shards": 2},
              "specs": {n: {"full_shape": p["full_shape"], "split_dim": p["split_dim"],
                            "group": "tp", "num_shards": p["num_shards"],
                            **({"blocks": p["blocks"]} if p.get("blocks") else {})}
                        for n, p in specs.items()}}
    merged = merge(os.path.join(ckpt, index), os.path.join(out, "merged.safetensors"))
    split(merged, layout, out)
    for rank, original in enumerate(files):
        again = os.path.join(out, rank_file_name(index, rank, 4))
        want, got = load_file(original), load_file(again)
        assert sorted(got) == sorted(want), (name, rank, set(got) ^ set(want))
        for key, value in want.items():
            assert got[key].shape == value.shape and (got[key] == value).all(), \
                (name, rank, key, got[key].shape, value.shape)
        assert pieces(again) == pieces(original), (name, rank)


#: name -> check(case name, N-worker rows, 1-process rows)
CHECKS = {"finite_mtp_loss": finite_mtp_loss, "qk_clip_active": qk_clip_active,
          "moe_layers_whole": moe_layers_whole}
def one_process_resumes(case, case_dir, want):
    """The layout's step-``case.one_process_at`` checkpoint, merged to one single-process file
    by ``tools/convert_checkpoint.py merge`` (a pipeline's is one already; merging it is a
    copy), resumed on one process: it runs the reference's next steps."""
    from layout_matrix import train_one
    from mindformers_core.tools.convert_checkpoint import merge
    step = case.one_process_at
    ckpt = os.path.join(case_dir, "checkpoint", f"mindformers_core_step{step:08d}.safetensors")
    one = os.path.join(case_dir, "merged_one_process")
    merged = merge(ckpt, os.path.join(one, "merged.safetensors"))
    train_one(case.config, list(case.reference_overrides(one)) + [
        f"checkpoint.load_path={merged}", "checkpoint.enable_save=false"], one)
    got = read_metrics(one)
    assert got and got[0]["step"] == step + 1, (case.name, got[:1])
    compare_rows(f"{case.name} merged, one process", got,
                 [r for r in want if r["step"] > step], case.metrics, case.rtol)


#: name -> check(case, the case's run directory, 1-process rows)
DIR_CHECKS = {"rows_stored": lambda case, d, want: rows_stored(case.name, d),
              "cp_rows_stored": lambda case, d, want: cp_rows_stored(
                  case.name, d, 2 if "parallelism.expert_parallel=2" in case.layout else 1),
              "split_rebuilds": lambda case, d, want: split_rebuilds(case.name, d),
              "state_replicated": lambda case, d, want: state_replicated(case.name, d)}


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("case", LAYOUTS, ids=[c.name for c in LAYOUTS])
def test_layout_equals_one_process(layout_matrix, case):
    got = read_metrics(layout_matrix.case_dir(case.name))
    want = read_metrics(layout_matrix.reference_dir(case))
    if case.resume_from is not None:   # another layout's checkpoint: the steps after it
        source, step = case.resume_from
        assert got and got[0]["step"] == step + 1, (case.name, got[:1])
        want = [r for r in want if r["step"] > step]
        uninterrupted = [r for r in read_metrics(layout_matrix.case_dir(source))
                         if r["step"] > step]
        compare_rows(f"{case.name} against the uninterrupted {source}", got, uninterrupted,
                     case.metrics, RESUMED_RTOL)
    compare_rows(case.name, got, want, case.metrics, case.rtol, case.steps)
    trained = [r["loss"] for r in want if "loss" in r]
    assert trained[0] != trained[-1], f"{case.name}: the reference loss never moved"
    for check in case.checks:
        if check in DIR_CHECKS:
            DIR_CHECKS[check](case, layout_matrix.case_dir(case.name), want)
        else:
            CHECKS[check](case.name, got, want)
    if case.one_process_at is not None:
        one_process_resumes(case, layout_matrix.case_dir(case.name), want)
    if case.resume_at is not None:   # its own checkpoint resumed under the same layout
        resumed = read_metrics(os.path.join(layout_matrix.case_dir(case.name), "resumed"))
        compare_rows(f"{case.name} resumed", resumed,
                     [r for r in want if r["step"] > case.resume_at], case.metrics, case.rtol)
        assert resumed and resumed[0]["step"] == case.resume_at + 1, resumed[:1]


def test_compare_rows_names_the_case_step_and_values():
    want = [{"step": 1, "loss": 2.0, "grad_norm": 1.0, "lr": 1e-3}]
    got = [{"step": 1, "loss": 2.1, "grad_norm": 1.0, "lr": 1e-3}]
    with pytest.raises(AssertionError, match=r"pp2_dp2 step 1: loss got 2.1, want 2.0 "
                                             r"\(rel 5.00e-02 > 0.0001\)"):
        compare_rows("pp2_dp2", got, want, ("loss", "grad_norm"), 1e-4)
    with pytest.raises(AssertionError, match=r"x: steps \[1\] != reference \[1, 2\]"):
        compare_rows("x", got, want + [{"step": 2, "loss": 1.0}], ("loss",), 1e-4)
    compare_rows("x", want, want, ("loss", "grad_norm", "mtp_loss"), 1e-4, steps=1)
