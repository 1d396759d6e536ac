"""tools/convert_checkpoint: a sharded checkpoint merged into one safetensors file and one
split back into a layout (tp2 from a mesh, pp2 from per-rank names, ZeRO rows), bit for bit,
and the exit codes and messages of its failures."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from mindformers_core.tools.convert_checkpoint import main, parse_layout
from mindformers_core.checkpoint.store import (FORMAT, load_checkpoint, save_checkpoint)
from mindformers_core.checkpoint.file_io import read_header
from mindformers_core.checkpoint.sharded import (INDEX_FORMAT, rank_file_name,
                                                         shard_files_of)
from tests.trainer.test_sharded_checkpoint import STAGES, full_data

SPECS = {"layers.0.linear_qkv.weight": {"full_shape": [12, 4], "split_dim": 0, "group": "tp",
                                        "num_shards": 2},
         "layers.0.linear_proj.weight": {"full_shape": [4, 6], "split_dim": 1, "group": "tp",
                                         "num_shards": 2}}


@pytest.fixture
def single(tmp_path):
    d = full_data()
    return save_checkpoint(str(tmp_path / "one"), "ck", 7, d.tensors, d.state, d.config,
                           d.dtypes, run_id=d.run_id)


def fmt(path):
    return read_header(path, os.path.getsize(path))["__metadata__"]["format"]


@pytest.mark.parametrize("layout", [
    {"world": 2, "mesh": {"tp": 2}, "specs": SPECS},
    {"world": 2, "mesh": {"pp": 2}, "names": STAGES},
    {"world": 2, "coords": [{"dp": 0}, {"dp": 1}], "zero_shards": 2},
    {"world": 4, "mesh": {"tp": 2}, "specs": SPECS, "zero_shards": 2},
    {"world": 4, "mesh": {"tp": 2}, "specs": SPECS, "zero_shards": 2,
     "remove_redundancy": True},
    {"world": 4, "mesh": {"tp": 2}, "specs": SPECS, "zero_shards": 2,
     "fsdp_rows": {"num_shards": 2}},
])
def test_split_then_merge_is_the_original(tmp_path, single, capsys, layout):
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps(layout))
    assert main(["split", "--input", single, "--layout", str(lay),
                 "--output", str(tmp_path / "sharded")]) == 0
    index = str(tmp_path / "sharded" / "ck_step00000007.safetensors")
    assert f"wrote {index}" in capsys.readouterr().out
    assert fmt(index) == INDEX_FORMAT
    for r in range(layout["world"]):
        assert os.path.isfile(tmp_path / "sharded" / rank_file_name(
            "ck_step00000007.safetensors", r, layout["world"]))
    out = str(tmp_path / "merged.safetensors")
    assert main(["merge", "--input", str(tmp_path / "sharded"), "--output", out]) == 0
    assert fmt(out) == FORMAT
    got, want = load_checkpoint(out), load_checkpoint(single)
    assert sorted(got.tensors) == sorted(want.tensors)
    for k, v in want.tensors.items():
        assert got.tensors[k].dtype == v.dtype and np.array_equal(got.tensors[k], v), k
    assert (got.step, got.state, got.config, got.dtypes, got.run_id) == \
        (want.step, want.state, want.config, want.dtypes, want.run_id)
    # upstream's default keeps every rank file self-contained: the replicated norm is in
    # every file holding it; with remove_redundancy in one
    norm = "layers.1.norm.weight"
    copies = sum(f"model.{norm}" in load_file(p) for p in shard_files_of(index))
    holders = sum(norm in n for n in layout["names"]) if "names" in layout else layout["world"]
    assert copies == (1 if layout.get("remove_redundancy") else holders)


def test_weights_only_merge_has_the_parameter_names(tmp_path, single):
    out = str(tmp_path / "w.safetensors")
    assert main(["merge", "--input", single, "--output", out, "--weights-only"]) == 0
    w = load_file(out)
    want = {k[len("model."):]: v for k, v in full_data().tensors.items()
            if k.startswith("model.")}
    assert sorted(w) == sorted(want)
    assert all(np.array_equal(w[k], want[k]) for k in want)


def test_bad_layouts_exit_2_naming_the_field(tmp_path, single, capsys):
    cases = [({"world": 0}, "layout: 'world' must be a positive integer"),
             ({"world": 2, "coords": [{"tp": 0}]},
              "layout: 'coords' must list 2 objects, one per rank"),
             ({"world": 2, "mesh": {"tp": 2}, "specs": {"x": {"full_shape": [3], "split_dim": 0,
                                                             "group": "tp", "num_shards": 2}}},
              "layout: specs.x: dim 0 of shape (3,) (3) is not divisible by the tp group size 2"),
             ({"world": 3, "mesh": {"tp": 2}},
              "world_size(3) must be divisible by tensor_parallel(2)"),
             ({"world": 2, "remove_redundancy": "yes"},
              "layout: 'remove_redundancy' must be true or false, got 'yes'"),
             ({"world": 2, "fsdp_rows": 2},
              "layout: 'fsdp_rows' must be an object with 'num_shards' and optional 'group', "
              "'names', got 2"),
             ({"world": 2, "fsdp_rows": {"num_shards": 0}},
              "layout: fsdp_rows.num_shards must be a positive integer, got 0"),
             ({"world": 2, "fsdp_rows": {"num_shards": 2, "group": "tp"}},
              "layout: fsdp_rows.group must be 'dp' or 'dp_cp', got 'tp'"),
             ({"world": 2, "fsdp_rows": {"num_shards": 2, "names": "x"}},
              "layout: fsdp_rows.names must be a list of parameter names")]
    for layout, message in cases:
        lay = tmp_path / "layout.json"
        lay.write_text(json.dumps(layout))
        assert main(["split", "--input", single, "--layout", str(lay),
                     "--output", str(tmp_path / "s")]) == 2
        assert message in capsys.readouterr().err


def test_unusable_checkpoint_exits_1(tmp_path, single, capsys):
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps({"world": 2, "mesh": {"tp": 2}, "specs": SPECS}))
    main(["split", "--input", single, "--layout", str(lay), "--output", str(tmp_path / "s")])
    os.remove(tmp_path / "s" / rank_file_name("ck_step00000007.safetensors", 0, 2))
    capsys.readouterr()
    assert main(["merge", "--input", str(tmp_path / "s" / "ck_step00000007.safetensors"),
                 "--output", str(tmp_path / "m.safetensors")]) == 1
    assert "is incomplete: rank file ck_step00000007.rank00000-of-00002.safetensors (rank 0 " \
           "of 2) is missing" in capsys.readouterr().err


def test_parse_layout_coords_from_the_mesh():
    specs, ranks = parse_layout({"world": 4, "mesh": {"tp": 2}, "specs": SPECS})
    assert [(r.coords["tp"], r.coords["dp"]) for r in ranks] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert specs["layers.0.linear_proj.weight"].split_dim == 1


def test_split_keeps_the_tp_x_fsdp_rows_of_each_tp_slice(tmp_path, single):
    """``fsdp_rows`` (tp2 x FSDP dp2, optim_grads_params): rank (tp, dp) keeps block dp of
    the rows of its tp slice of every weight whose slice has an even number of rows, in its
    model tensor and its optimizer entries: the slices of the whole tensor, indexed by hand."""
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps({"world": 4, "mesh": {"tp": 2}, "specs": SPECS, "zero_shards": 2,
                               "fsdp_rows": {"num_shards": 2}}))
    assert main(["split", "--input", single, "--layout", str(lay),
                 "--output", str(tmp_path / "s")]) == 0
    full = load_checkpoint(single).tensors
    for rank in range(4):
        tp, dp = rank % 2, rank // 2   # tp fastest
        got = load_file(str(tmp_path / "s" / rank_file_name("ck_step00000007.safetensors",
                                                              rank, 4)))
        for prefix in ("model.", "optim.adam_m.", "optim.adam_v."):
            proj = full[prefix + "layers.0.linear_proj.weight"]   # (4, 6), columns over tp
            assert np.array_equal(got[prefix + "layers.0.linear_proj.weight"],
                                  proj[2 * dp:2 * dp + 2, 3 * tp:3 * tp + 3]), (rank, prefix)
            qkv = full[prefix + "layers.0.linear_qkv.weight"]   # (12, 4), rows over tp
            assert np.array_equal(got[prefix + "layers.0.linear_qkv.weight"],
                                  qkv[6 * tp + 3 * dp:6 * tp + 3 * dp + 3]), (rank, prefix)
            emb = full[prefix + "embedding.word_embeddings.weight"]   # (8, 4), replicated
            assert np.array_equal(got[prefix + "embedding.word_embeddings.weight"],
                                  emb[4 * dp:4 * dp + 4]), (rank, prefix)


def test_fsdp_rows_names_choose_the_weights_kept_as_rows(tmp_path, single):
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps({"world": 4, "mesh": {"tp": 2}, "specs": SPECS,
                               "fsdp_rows": {"num_shards": 2,
                                             "names": ["layers.0.linear_qkv.weight"]}}))
    assert main(["split", "--input", single, "--layout", str(lay),
                 "--output", str(tmp_path / "s")]) == 0
    got = load_file(str(tmp_path / "s" / rank_file_name("ck_step00000007.safetensors", 2, 4)))
    full = load_checkpoint(single).tensors
    assert got["model.layers.0.linear_qkv.weight"].shape == (3, 4)
    assert np.array_equal(got["model.embedding.word_embeddings.weight"],
                          full["model.embedding.word_embeddings.weight"])
