"""Sharded checkpoints written by several simulated ranks in one process (files are not
communication), reloaded under other layouts bit for bit, and every refusal's message.

Each simulated rank holds only what its layout gives it (its shard of each sharded parameter
and of its optimizer slots, its ZeRO rows, its pipeline stage's parameters), describes it
and writes its rank file exactly as the trainer's save does; the references are numpy slices
of one full state."""
import json
import os

import numpy as np
import pytest

from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.distributed.shard_layout import shard_rows
from mindformers_core.distributed.shard_spec import ShardSpec, param_of, shard
from mindformers_core.checkpoint.store import (CheckpointError, checkpoint_name,
                                                 list_checkpoints, load_checkpoint,
                                                 prune_checkpoints, save_checkpoint)
from mindformers_core.checkpoint.file_io import CheckpointData, encode, write_atomic
from mindformers_core.checkpoint.sharded import (
    SHARD_FORMAT, RankLayout, ZeroRows, describe_pieces, rank_file_name, reshard, save_index,
    save_rank_file, shard_files_of, split_checkpoint, write_rank, zero_rows_of)
from mindformers_core.checkpoint.plan import axis_sizes

NAME = checkpoint_name("ck", 7)
SHAPES = {"embedding.word_embeddings.weight": (8, 4), "layers.0.linear_qkv.weight": (12, 4),
          "layers.0.linear_proj.weight": (4, 6), "layers.1.experts.weight1": (4, 4, 6),
          "layers.1.norm.weight": (4,), "output_layer.weight": (8, 4)}
SLOTS = ("main_param", "adam_m", "adam_v")
STAGES = [["embedding.word_embeddings.weight", "layers.0.linear_qkv.weight",
           "layers.0.linear_proj.weight"],
          ["layers.1.experts.weight1", "layers.1.norm.weight", "output_layer.weight"]]


def full_tensors():
    rng = np.random.default_rng(0)
    out = {}
    for name, shape in SHAPES.items():
        out[f"model.{name}"] = rng.standard_normal(shape).astype(np.float32)
        for slot in SLOTS:
            out[f"optim.{slot}.{name}"] = rng.standard_normal(shape).astype(np.float32)
    out["rng.numpy_keys"] = np.arange(5, dtype=np.uint32)
    return out


def full_data(path="full"):
    return CheckpointData(path=path, step=7, tensors=full_tensors(),
                          state={"train_state": {"step": 7}}, config={"x": 1},
                          dtypes={"model.layers.1.norm.weight": "bfloat16"}, run_id="run-a")


TP = {"layers.0.linear_qkv.weight": ShardSpec((12, 4), 0, "tp", 2),
      "layers.0.linear_proj.weight": ShardSpec((4, 6), 1, "tp", 2),
      "output_layer.weight": ShardSpec((8, 4), 0, "tp", 2)}
EP = {"layers.1.experts.weight1": ShardSpec((4, 4, 6), 0, "ep", 2)}
FSDP = {n: ShardSpec(s, 0, "dp_shard", 2) for n, s in SHAPES.items()}
#: the fused q | k | v rows of GQA (8 query rows, 2 key rows, 2 value rows), tp 2
TP_BLOCKED = {**TP, "layers.0.linear_qkv.weight": ShardSpec((12, 4), 0, "tp", 2,
                                                            blocks=(8, 2, 2))}
#: FSDP as distributed/fsdp.py records it: split over the "dp" group
FSDP_DP = {n: ShardSpec(s, 0, "dp", 2) for n, s in SHAPES.items()}


def write_ranks(directory, specs, coords_of, world, names_of=None, zero_shards=1,
                data=None, skip=(), remove_redundancy=True):
    """Every rank's file as the trainer writes it (local tensors only), then the index."""
    data = data or full_data()
    sizes = axis_sizes([coords_of(r) for r in range(world)])
    for rank in range(world):
        if rank in skip:
            continue
        coords = coords_of(rank)
        local = reshard(data, specs, coords, names_of(rank) if names_of else None).tensors
        zero = None
        if zero_shards > 1:
            zero = zero_rows_of(local, zero_shards, coords["dp"], sizes["dp"])
            local = {k: (v[zero.rows[k][0]:zero.rows[k][1]] if k in zero.rows else v)
                     for k, v in local.items()}
        write_rank(str(directory), NAME, 7, rank, world, local, specs, coords, zero,
                   data.dtypes, data.run_id, sizes=sizes, remove_redundancy=remove_redundancy)
    return save_index(str(directory), NAME, 7, world, {"rng.numpy_keys": data.tensors[
        "rng.numpy_keys"]}, data.state, data.config, data.run_id)


def assert_same(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


LAYOUTS = {
    "tp2": (TP, lambda r: make_mesh(2, tp=2).coords(r), 2, None, 1),
    "ep2": (EP, lambda r: make_mesh(2, ep=2).coords(r), 2, None, 1),
    "fsdp_dp2": (FSDP, lambda r: {"dp": r, "dp_shard": r}, 2, None, 1),
    "zero_dp2": ({}, lambda r: {"dp": r}, 2, None, 2),
    "pp2": ({}, lambda r: make_mesh(2, pp=2).coords(r), 2, lambda r: STAGES[r], 1),
    "tp2_dp2_zero": (TP, lambda r: make_mesh(4, tp=2).coords(r), 4, None, 2),
    "tp2_blocked": (TP_BLOCKED, lambda r: make_mesh(2, tp=2).coords(r), 2, None, 1),
    "tp2_blocked_dp2_zero": (TP_BLOCKED, lambda r: make_mesh(4, tp=2).coords(r), 4, None, 2),
    "fsdp_dp_group": (FSDP_DP, lambda r: make_mesh(2).coords(r), 2, None, 1),
    "tp2_pp2": (TP, lambda r: make_mesh(4, tp=2, pp=2).coords(r), 4,
                lambda r: STAGES[make_mesh(4, tp=2, pp=2).coords(r)["pp"]], 1),
}


#: FSDP under context parallel (distributed/fsdp.py): split over the dp x cp ranks
FSDP_DP_CP = {n: ShardSpec(s, 0, "dp_cp", 4) for n, s in SHAPES.items()}
#: context-parallel layouts, world 4: (specs, mesh, the ZeRO group of a rank, ZeRO shards) as
#: the trainer lays them out: cp x dp's ZeRO-1 over every rank (the world communicator, shards
#: of data_parallel_shard), cp x tp's over the rank's dp_cp group, cp x FSDP's rows over dp_cp
CP_LAYOUTS = {
    "cp2_dp2_zero": ({}, make_mesh(4, cp=2), lambda m, r: tuple(range(4)), 2),
    "cp2_tp2_zero": (TP, make_mesh(4, cp=2, tp=2), lambda m, r: m.dp_cp_group(r), 2),
    "cp2_dp2_fsdp": (FSDP_DP_CP, make_mesh(4, cp=2), lambda m, r: m.dp_cp_group(r), 1),
}


@pytest.mark.parametrize("remove_redundancy", [True, False])
@pytest.mark.parametrize("layout", list(CP_LAYOUTS))
def test_context_parallel_zero_rows_and_fsdp_rows_merge_bit_identically(tmp_path, layout,
                                                                         remove_redundancy):
    """Under context parallel the ZeRO group spans the cp ranks, which hold other rows of the
    optimizer state: with remove_redundancy each row block is still written (by one of the
    ranks holding it), and the files merge to the whole tensors."""
    specs, mesh, zero_group, shards = CP_LAYOUTS[layout]
    data = full_data()
    sizes = axis_sizes([mesh.coords(r) for r in range(4)])
    for rank in range(4):
        coords = mesh.coords(rank)
        local = reshard(data, specs, coords).tensors
        zero = None
        if shards > 1:
            group = zero_group(mesh, rank)
            zero = zero_rows_of(local, shards, group.index(rank), len(group))
            local = {k: (v[zero.rows[k][0]:zero.rows[k][1]] if k in zero.rows else v)
                     for k, v in local.items()}
        write_rank(str(tmp_path), NAME, 7, rank, 4, local, specs, coords, zero, data.dtypes,
                   data.run_id, sizes=sizes, remove_redundancy=remove_redundancy)
    index = save_index(str(tmp_path), NAME, 7, 4, {"rng.numpy_keys": data.tensors[
        "rng.numpy_keys"]}, data.state, data.config, data.run_id)
    assert_same(load_checkpoint(index).tensors, full_tensors())


@pytest.mark.parametrize("remove_redundancy", [True, False])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sharded_write_merges_to_one_process_bit_identically(tmp_path, layout,
                                                             remove_redundancy):
    specs, coords_of, world, names_of, zero = LAYOUTS[layout]
    index = write_ranks(tmp_path, specs, coords_of, world, names_of, zero,
                        remove_redundancy=remove_redundancy)
    data = load_checkpoint(index, read_workers=3, merge_workers=2)
    assert_same(data.tensors, full_tensors())
    assert data.step == 7 and data.run_id == "run-a" and data.state == full_data().state
    assert data.dtypes == {"model.layers.1.norm.weight": "bfloat16"}
    # the index is the checkpoint the directory lists; rank files are not checkpoints
    assert list_checkpoints(str(tmp_path)) == [(7, index)]
    assert len(shard_files_of(index)) == world


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_one_process_checkpoint_splits_into_each_layout_and_back(tmp_path, layout):
    specs, coords_of, world, names_of, zero = LAYOUTS[layout]
    full = full_data()
    single = save_checkpoint(str(tmp_path / "one"), "ck", 7, full.tensors, full.state,
                             full.config, full.dtypes, run_id=full.run_id)
    loaded = load_checkpoint(single)
    for rank in range(world):   # 1 -> layout: each rank's tensors are the numpy slices
        got = reshard(loaded, specs, coords_of(rank), names_of(rank) if names_of else None)
        for key, arr in got.tensors.items():
            name = key.split(".", 2)[-1] if key.startswith("optim.") else key[6:]
            if names_of:
                assert key.startswith("rng.") or name in names_of(rank)
            spec = specs.get(name)
            want = full.tensors[key]
            if spec is not None and not key.startswith("rng."):
                want = shard(spec, want, coords_of(rank)[spec.group])
            assert np.array_equal(arr, want), key
    # and back: the layout written from those pieces merges to the original
    index = split_checkpoint(loaded, str(tmp_path / "split"), NAME, specs,
                             [RankLayout(coords_of(r), names_of(r) if names_of else None, zero)
                              for r in range(world)])
    assert_same(load_checkpoint(index).tensors, full.tensors)


def test_layout_to_layout_tp2_to_ep2_fsdp_and_zero(tmp_path):
    """tp2 -> (merge) -> each other layout's shards, equal to slicing the original."""
    index = write_ranks(tmp_path / "tp", *LAYOUTS["tp2"])
    merged = load_checkpoint(index)
    for rank in range(2):
        got = reshard(merged, FSDP, {"dp_shard": rank}).tensors
        for key, spec_name in (("optim.adam_m.layers.1.experts.weight1",
                                "layers.1.experts.weight1"),
                               ("model.embedding.word_embeddings.weight",
                                "embedding.word_embeddings.weight")):
            assert np.array_equal(got[key], shard(FSDP[spec_name], full_tensors()[key], rank))
    # dp2 ZeRO-1: the optimizer keeps its rows of the full tensors (distributed/zero.py)
    z = zero_rows_of(merged.tensors, 2, 1)
    start, stop, d0 = z.rows["optim.adam_v.layers.0.linear_qkv.weight"]
    assert (start, stop, d0) == shard_rows(12, 2, 1) + (12,)


def rank_file_pieces(index):
    """{rank file: {key: (offset, shape)}} as written."""
    from mindformers_core.checkpoint.file_io import read_header
    out = {}
    for path in shard_files_of(index):
        meta = read_header(path, os.path.getsize(path))["__metadata__"]
        out[os.path.basename(path)] = {k: (tuple(v["offset"]), tuple(v["shape"]))
                                       for k, v in json.loads(meta["pieces"]).items()}
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_removed_redundancy_writes_each_piece_once(tmp_path, layout):
    files = rank_file_pieces(write_ranks(tmp_path, *LAYOUTS[layout], remove_redundancy=True))
    boxes = [(k, box) for pieces in files.values() for k, box in pieces.items()]
    assert len(boxes) == len(set(boxes))


def test_removed_redundancy_balances_the_pieces_over_their_replicas(tmp_path):
    index = write_ranks(tmp_path, *LAYOUTS["tp2_dp2_zero"], remove_redundancy=True)
    files = rank_file_pieces(index)
    # mesh tp2 x dp2: the replicated weights are spread over all four ranks, the tp shards
    # over the two dp replicas of each tp index, not all on the coordinate-0 rank
    for pieces in files.values():
        assert any(k.startswith("model.") for k in pieces)
    # the (4,) norm's ZeRO rows (2 shards over dp) are replicated over tp: written once each
    assert sum("optim.adam_m.layers.1.norm.weight" in p for p in files.values()) == 2


def test_redundant_save_makes_every_rank_file_self_contained(tmp_path):
    specs, coords_of, world, _, zero_shards = LAYOUTS["tp2_dp2_zero"]
    index = write_ranks(tmp_path, specs, coords_of, world, None, zero_shards,
                        remove_redundancy=False)
    files = rank_file_pieces(index)
    for rank in range(world):
        local = reshard(full_data(), specs, coords_of(rank)).tensors
        held = {k for k in local if not k.startswith("rng.")}
        assert set(files[rank_file_name(NAME, rank, world)]) == held
    assert sum("optim.adam_m.layers.1.norm.weight" in p for p in files.values()) == 4


def test_replicas_that_differ_are_refused(tmp_path):
    index = write_ranks(tmp_path, *LAYOUTS["zero_dp2"], remove_redundancy=False)
    data = full_data()
    data.tensors["model.layers.1.norm.weight"] = data.tensors["model.layers.1.norm.weight"] + 1
    other = tmp_path / "b"
    write_ranks(other, *LAYOUTS["zero_dp2"], data=data, remove_redundancy=False)
    # rank 1's file of the other save, with its index entry rewritten to accept it
    os.replace(other / rank_file_name(NAME, 1, 2), tmp_path / rank_file_name(NAME, 1, 2))
    full = full_data()
    save_index(str(tmp_path), NAME, 7, 2, {"rng.numpy_keys": full.tensors["rng.numpy_keys"]},
               full.state, full.config, full.run_id)
    with pytest.raises(CheckpointError, match=(
            r"is corrupt: model\.layers\.1\.norm\.weight is stored in "
            r"ck_step00000007\.rank00000-of-00002\.safetensors and "
            r"ck_step00000007\.rank00001-of-00002\.safetensors with the same box \(offset "
            r"\(0,\), shape \(4,\)\) but different values; replicas must be identical")):
        load_checkpoint(index)


def test_negative_zero_in_one_replica_is_a_difference():
    from mindformers_core.checkpoint.sharded import Piece, merge_pieces
    piece = Piece((2,), (0,), (2,))
    a, b = np.array([0.0, 1.0], np.float32), np.array([-0.0, 1.0], np.float32)
    merged, _ = merge_pieces([("k", piece, a, "f0"), ("k", piece, a.copy(), "f1")], "w")
    assert merged["k"].tobytes() == a.tobytes()
    with pytest.raises(CheckpointError, match=r"k is stored in f0 and f1 with the same box"):
        merge_pieces([("k", piece, a, "f0"), ("k", piece, b, "f1")], "w")


def test_missing_rank_file_is_refused(tmp_path):
    index = write_ranks(tmp_path, *LAYOUTS["tp2"])
    os.remove(os.path.join(tmp_path, rank_file_name(NAME, 1, 2)))
    with pytest.raises(CheckpointError, match=r"is incomplete: rank file ck_step00000007\."
                       r"rank00001-of-00002\.safetensors \(rank 1 of 2\) is missing"):
        load_checkpoint(index)


def test_threaded_read_raises_the_first_failing_rank_s_error(tmp_path):
    index = write_ranks(tmp_path, *LAYOUTS["tp2_dp2_zero"])
    for rank in (1, 3):
        os.remove(os.path.join(tmp_path, rank_file_name(NAME, rank, 4)))
    for workers in (1, 4):
        with pytest.raises(CheckpointError, match=r"rank00001-of-00004\.safetensors \(rank 1 "
                                                  r"of 4\) is missing"):
            load_checkpoint(index, read_workers=workers, merge_workers=workers)


def test_flipped_byte_in_a_rank_file_is_refused(tmp_path):
    index = write_ranks(tmp_path, *LAYOUTS["ep2"])
    path = os.path.join(tmp_path, rank_file_name(NAME, 1, 2))
    raw = bytearray(open(path, "rb").read())
    raw[-3] ^= 0x01
    open(path, "wb").write(bytes(raw))
    with pytest.raises(CheckpointError, match=r"rank00001-of-00002\.safetensors is corrupt: its "
                       "header or tensor data does not match its sha256 digest"):
        load_checkpoint(index)


def test_flipped_byte_in_the_index_is_refused(tmp_path):
    index = write_ranks(tmp_path, *LAYOUTS["ep2"])
    raw = open(index, "rb").read()
    assert raw.count(b'\\"step\\": 7') == 1
    open(index, "wb").write(raw.replace(b'\\"step\\": 7', b'\\"step\\": 8'))
    with pytest.raises(CheckpointError, match="header or tensor data does not match its sha256"):
        load_checkpoint(index)


def test_rank_file_of_another_save_is_refused(tmp_path):
    index = write_ranks(tmp_path, *LAYOUTS["tp2"])
    other = full_data()
    other.run_id = "run-b"
    write_ranks(tmp_path / "b", *LAYOUTS["tp2"], data=other)
    os.replace(os.path.join(tmp_path / "b", rank_file_name(NAME, 1, 2)),
               os.path.join(tmp_path, rank_file_name(NAME, 1, 2)))
    with pytest.raises(CheckpointError, match=r"rank file ck_step00000007\.rank00001-of-00002"
                       r"\.safetensors is not the one the index was written with \(rank '1', "
                       r"step '7', sha256 \w{12}\.\.\., the index expects rank 1, step 7, "
                       r"sha256 \w{12}\.\.\.: a file of another save\)"):
        load_checkpoint(index)


def test_a_piece_no_rank_wrote_is_a_gap(tmp_path):
    """Rank 1 wrote no piece of linear_qkv (its half of the rows is missing)."""
    specs, coords_of, world, names_of, zero = LAYOUTS["tp2"]
    index = write_ranks(tmp_path, specs, coords_of, world)
    # rewrite rank 1 without its half of linear_qkv
    path = os.path.join(tmp_path, rank_file_name(NAME, 1, 2))
    local = reshard(full_data(), specs, coords_of(1)).tensors
    local.pop("rng.numpy_keys")
    local = {k: v for k, v in local.items() if "linear_qkv" not in k}
    pieces = describe_pieces(local, specs, coords_of(1))
    save_rank_file(str(tmp_path), NAME, 7, 1, 2, local, pieces, "run-a")
    assert os.path.exists(path)
    index = save_index(str(tmp_path), NAME, 7, 2, {}, {"train_state": {}}, {}, "run-a")
    with pytest.raises(CheckpointError, match=r"is incomplete: the pieces of "
                       r"model\.layers\.0\.linear_qkv\.weight cover 24 of the 48 elements of "
                       r"its full shape \(12, 4\)"):
        load_checkpoint(index)


def crafted_rank_file(tmp_path, rank, pieces: dict, tensors: dict):
    meta = {"format": SHARD_FORMAT, "step": "7", "run_id": "run-a", "rank": str(rank),
            "world": "2", "pieces": json.dumps(pieces)}
    write_atomic(str(tmp_path), rank_file_name(NAME, rank, 2), encode(tensors, meta))


def piece(full, offset, shape):
    return {"full_shape": list(full), "offset": list(offset), "shape": list(shape)}


@pytest.mark.parametrize("p0,p1,shape1,message", [
    (piece((4, 2), (0, 0), (2, 2)), piece((4, 2), (1, 0), (2, 2)), (2, 2),
     r"the pieces of model\.w in .*rank00000-of-00002\.safetensors \(offset \(0, 0\), shape "
     r"\(2, 2\)\) and .*rank00001-of-00002\.safetensors \(offset \(1, 0\), shape \(2, 2\)\) "
     r"overlap"),
    (piece((4, 2), (0, 0), (2, 2)), piece((6, 2), (2, 0), (2, 2)), (2, 2),
     r"model\.w has full shape \(4, 2\) in .*rank00000-of-00002\.safetensors but \(6, 2\) in "
     r".*rank00001-of-00002\.safetensors"),
    (piece((4, 2), (0, 0), (2, 2)), piece((4, 2), (3, 0), (2, 2)), (2, 2),
     r"the piece of model\.w at offset \(3, 0\) with shape \(2, 2\) lies outside its full shape"
     r" \(4, 2\)"),
    (piece((4, 2), (0, 0), (2, 2)), piece((4, 2), (2, 0), (2, 2)), (1, 2),
     r"tensor model\.w has shape \(1, 2\), its layout entry says \(2, 2\)"),
])
def test_crafted_layouts_are_clear_errors(tmp_path, p0, p1, shape1, message):
    crafted_rank_file(tmp_path, 0, {"model.w": p0}, {"model.w": np.zeros((2, 2), np.float32)})
    crafted_rank_file(tmp_path, 1, {"model.w": p1}, {"model.w": np.ones(shape1, np.float32)})
    index = save_index(str(tmp_path), NAME, 7, 2, {}, {}, {}, "run-a")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(index)


def test_layout_entries_and_tensors_must_agree(tmp_path):
    crafted_rank_file(tmp_path, 0, {"model.w": piece((2, 2), (0, 0), (2, 2))},
                      {"model.v": np.zeros((2, 2), np.float32)})
    crafted_rank_file(tmp_path, 1, {}, {})
    index = save_index(str(tmp_path), NAME, 7, 2, {}, {}, {}, "run-a")
    with pytest.raises(CheckpointError, match=r"is corrupt: its layout entries and tensors "
                       r"differ: \['model\.v', 'model\.w'\]"):
        load_checkpoint(index)
    crafted_rank_file(tmp_path, 0, {"model.w": {"offset": [0]}}, {"model.w": np.zeros(2)})
    index = save_index(str(tmp_path), NAME, 7, 2, {}, {}, {}, "run-a")
    with pytest.raises(CheckpointError, match=r"is corrupt: unreadable layout entries "
                       r"\(KeyError"):
        load_checkpoint(index)


def test_index_needs_every_rank_file_on_its_disk(tmp_path):
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*ck_step00000007\."
                       r"safetensors: rank file ck_step00000007\.rank00000-of-00002\.safetensors "
                       r"is missing \(is .* shared by all ranks\?\); the previous checkpoints "
                       r"are kept"):
        save_index(str(tmp_path), NAME, 7, 2, {}, {}, {}, "run-a")


def test_index_file_list_must_match_its_world(tmp_path):
    from mindformers_core.checkpoint.file_io import run_metadata
    from mindformers_core.checkpoint.sharded import INDEX_FORMAT
    meta = run_metadata(INDEX_FORMAT, 7, {}, {}, {}, "run-a")
    meta.update(world="3", files=json.dumps([{"name": "a"}, {"name": "b"}]))
    path = write_atomic(str(tmp_path), NAME, encode({}, meta))
    with pytest.raises(CheckpointError, match="its list of rank files does not match its world "
                       "size '3'"):
        load_checkpoint(path)


def test_target_layout_mismatch_is_refused(tmp_path):
    merged = load_checkpoint(write_ranks(tmp_path, *LAYOUTS["tp2"]))
    wrong = {"layers.0.linear_qkv.weight": ShardSpec((16, 4), 0, "tp", 2)}
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.linear_qkv\.weight has full "
                       r"shape \(12, 4\), the target layout of layers\.0\.linear_qkv\.weight "
                       r"expects \(16, 4\)"):
        reshard(merged, wrong, {"tp": 0})
    with pytest.raises(CheckpointError, match=r"the layout splits layers\.0\.linear_\w+\.weight "
                       r"over group 'tp', but this rank has no index in 'tp' \(known groups: "
                       r"\['dp'\]\)"):
        reshard(merged, TP, {"dp": 0})


def test_local_shape_that_contradicts_its_spec_is_refused():
    with pytest.raises(ValueError, match=r"model\.w: shape \(3, 4\) does not match its layout "
                       r".*expected \(2, 4\)"):
        describe_pieces({"model.w": np.zeros((3, 4))}, {"w": ShardSpec((4, 4), 0, "tp", 2)},
                        {"tp": 0})
    with pytest.raises(ValueError, match=r"ZeRO rows \(0, 3, 4\); expected \(3, 4\)"):
        describe_pieces({"optim.adam_m.w": np.zeros((2, 4))}, {},
                        {"dp": 0}, ZeroRows({"optim.adam_m.w": (0, 3, 4)}, 2, 0, 0))


def test_prune_removes_the_rank_files_of_a_pruned_sharded_checkpoint(tmp_path):
    write_ranks(tmp_path, *LAYOUTS["tp2"])
    data = full_data()
    save_checkpoint(str(tmp_path), "ck", 9, data.tensors, data.state, data.config,
                    run_id="run-a")
    removed = prune_checkpoints(str(tmp_path), "ck", 1, run_id="run-a")
    assert sorted(os.path.basename(p) for p in removed) == sorted(
        [NAME, rank_file_name(NAME, 0, 2), rank_file_name(NAME, 1, 2)])
    assert sorted(os.listdir(tmp_path)) == [checkpoint_name("ck", 9)]


def test_overwrite_moves_a_sharded_checkpoint_with_its_rank_files(tmp_path):
    from mindformers_core.trainer.run_dir import move_aside
    write_ranks(tmp_path, *LAYOUTS["tp2"])
    moved = move_aside(None, str(tmp_path), "another-run")
    assert sorted(os.path.basename(p) for p in moved) == sorted(
        [NAME, rank_file_name(NAME, 0, 2), rank_file_name(NAME, 1, 2)])
    assert_same(load_checkpoint([p for p in moved if p.endswith(NAME)][0]).tensors,
                full_tensors())


def test_blocked_shard_is_one_box_of_the_shard_major_order(tmp_path):
    """Rank 1 of the fused qkv holds rows 4-7 (q), 9 (k) and 11 (v): its piece is rows 6-11
    of the shard-major order [q0 k0 v0 | q1 k1 v1] and records the blocks."""
    full = full_tensors()["model.layers.0.linear_qkv.weight"]
    spec = TP_BLOCKED["layers.0.linear_qkv.weight"]
    local = shard(spec, full, 1)
    np.testing.assert_array_equal(local, full[[4, 5, 6, 7, 9, 11]])
    piece = describe_pieces({"model.layers.0.linear_qkv.weight": local}, TP_BLOCKED,
                            {"tp": 1})["model.layers.0.linear_qkv.weight"]
    assert (piece.offset, piece.shape, piece.blocks) == ((6, 0), (6, 4), (8, 2, 2))


def _tp_fsdp_rows(local, dp_index):
    """tp x FSDP's rows of one rank (``model.set_row_shards``): block ``dp_index`` of 2 of
    every tensor whose first dim (of its tp slice) divides by 2."""
    rows = {}
    for key, arr in local.items():
        name = param_of(key)
        d0 = np.shape(arr)[0] if np.ndim(arr) else 0
        if name is not None and d0 and d0 % 2 == 0:
            rows[name] = (dp_index * d0 // 2, (dp_index + 1) * d0 // 2, d0)
    return rows


@pytest.mark.parametrize("with_optimizer_rows", [False, True])
def test_tp_fsdp_rows_on_top_of_the_tp_pieces_merge_bit_identically(tmp_path,
                                                                    with_optimizer_rows):
    """tp2 x FSDP dp2: each rank holds its dp rows of its tp slice (a row-parallel weight
    split in two dimensions); ``with_model_rows`` describes the model and optimizer entries
    the optimizer did not (with or without its own ZeRO rows), and the rank files merge to
    the whole tensors, bit for bit."""
    from mindformers_core.checkpoint.sharded import with_model_rows
    data, mesh = full_data(), make_mesh(4, tp=2)
    sizes = axis_sizes([mesh.coords(r) for r in range(4)])
    for rank in range(4):
        coords = mesh.coords(rank)
        local = reshard(data, TP, coords).tensors
        rows = _tp_fsdp_rows(local, coords["dp"])
        zero = None
        if with_optimizer_rows:   # the optimizer's own rows of its main_param entries
            zero = ZeroRows({k: rows[param_of(k)] for k in local
                             if k.startswith("optim.main_param.") and param_of(k) in rows},
                            2, coords["dp"], 0)
        zero = with_model_rows(zero, local, rows)
        assert zero.num_shards == 2 and zero.shard_index == coords["dp"] and zero.replica == 0
        local = {k: (v[zero.rows[k][0]:zero.rows[k][1]] if k in zero.rows else v)
                 for k, v in local.items()}
        proj = local["model.layers.0.linear_proj.weight"]
        assert proj.shape == (2, 3)   # (4, 6): columns over tp, rows over dp
        write_rank(str(tmp_path), NAME, 7, rank, 4, local, TP, coords, zero, data.dtypes,
                   data.run_id, sizes=sizes)
    index = save_index(str(tmp_path), NAME, 7, 4, {"rng.numpy_keys": data.tensors[
        "rng.numpy_keys"]}, data.state, data.config, data.run_id)
    assert_same(load_checkpoint(index).tensors, full_tensors())


def test_without_model_rows_the_optimizer_rows_are_unchanged():
    from mindformers_core.checkpoint.sharded import with_model_rows
    zero = ZeroRows({"optim.adam_m.x": (0, 2, 4)}, 2, 0, 1)
    assert with_model_rows(zero, {"model.x": np.zeros(4)}, {}) is zero
    assert with_model_rows(None, {"model.x": np.zeros(4)}, {}) is None


def test_reshard_for_model_keeps_the_model_s_dp_rows_of_its_tp_slice():
    """Resuming under tp x FSDP: the tp slice, then the model's dp rows of it; the optimizer
    entries stay the whole slice (the optimizer keeps its rows itself)."""
    from mindformers_core.checkpoint.sharded_save import reshard_for_model

    class Model:
        def shard_specs(self):
            return TP

        def row_shards(self):
            return {"layers.0.linear_proj.weight": (2, 4, 4)}

        def get_parameters(self):
            return [type("P", (), {"name": n})() for n in SHAPES]

    coords = make_mesh(4, tp=2).coords(3)   # tp 1, dp 1
    got = reshard_for_model(full_data(), Model(), type("L", (), {"coords": lambda s: coords})())
    full = full_tensors()
    np.testing.assert_array_equal(got.tensors["model.layers.0.linear_proj.weight"],
                                  full["model.layers.0.linear_proj.weight"][2:4, 3:6])
    np.testing.assert_array_equal(got.tensors["optim.adam_m.layers.0.linear_proj.weight"],
                                  full["optim.adam_m.layers.0.linear_proj.weight"][:, 3:6])
