"""Which rank writes which piece (checkpoint/plan.py), against hand-worked layouts."""
import pytest

from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.checkpoint.plan import (ZERO_REPLICA, axis_sizes,
                                                      balanced_assignment, pieces_to_write,
                                                      replica_member, replicated_axes)
from mindformers_core.checkpoint.sharded import Piece

REP = Piece((4,), (0,), (4,))
TP = Piece((4, 2), (2, 0), (2, 2), 0, "tp", 1, 2)
EP = Piece((4, 2), (2, 0), (2, 2), 0, "ep", 1, 2)
FSDP = Piece((4, 2), (2, 0), (2, 2), 0, "dp_shard", 1, 2)
ZERO = Piece((4,), (2,), (2,), zero_rows=(2, 4), zero_shards=2, zero_index=1)


def test_replicated_axes_by_layout():
    assert replicated_axes(REP) == ("tp", "cp", "dp")
    assert replicated_axes(TP) == ("cp", "dp")
    assert replicated_axes(EP) == ("edp",)   # ep folds over tp x cp x dp
    assert replicated_axes(FSDP) == ("tp", "cp", "dp_replicate")
    assert replicated_axes(Piece((4, 2), (2, 0), (2, 2), 0, "dp", 1, 2)) == ("tp", "cp")
    # the ZeRO group spans dp and cp (ZeRO-1 over dp x cp under context parallel)
    assert replicated_axes(ZERO) == ("tp", ZERO_REPLICA)


def test_replica_member_is_the_mixed_radix_index_along_the_axes():
    sizes = {"tp": 2, "cp": 1, "dp": 3}
    assert replica_member(("tp", "cp", "dp"), {"tp": 1, "dp": 2}, sizes) == (1 + 2 * 2, 6)
    assert replica_member(("cp", "dp"), {"tp": 1, "dp": 2}, sizes) == (2, 3)
    assert replica_member((), {"dp": 2}, sizes) == (0, 1)
    with pytest.raises(ValueError, match=r"this rank's index 3 along 'dp' is outside its "
                                         r"size 3"):
        replica_member(("dp",), {"dp": 3}, sizes)


def test_balanced_assignment_is_upstreams_greedy():
    # largest first, then by name: a(5)->0 [5, 0], b(4)->1 [5, 4], c(3)->1 [5, 7],
    # d(3)->0 [8, 7], e(1)->1 [8, 8]
    got = balanced_assignment([("c", 3), ("a", 5), ("e", 1), ("b", 4), ("d", 3)], 2)
    assert got == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}
    # equal sizes: by name, round robin
    assert balanced_assignment([("x", 2), ("w", 2), ("y", 2)], 3) == {"w": 0, "x": 1, "y": 2}
    assert balanced_assignment([], 4) == {}
    with pytest.raises(ValueError, match=r"a replica group has at least one member, got 0"):
        balanced_assignment([("a", 1)], 0)


def test_pieces_to_write_every_piece_once_over_a_tp2_dp2_mesh():
    mesh = make_mesh(4, tp=2)
    sizes = {a: mesh.size(a) for a in ("tp", "cp", "dp", "pp", "ep", "edp", "world")}
    pieces = {"model.a": REP, "model.b": REP, "model.c": REP, "model.d": REP,
              "model.t": TP, "model.u": TP}
    nbytes = {"model.a": 40, "model.b": 30, "model.c": 20, "model.d": 10,
              "model.t": 8, "model.u": 6}
    written = {r: pieces_to_write(pieces, nbytes, mesh.coords(r), sizes, True)
               for r in range(4)}
    # replicated over tp x dp (member = tp + 2 dp): a->0, b->1, c->2, d->3 (rank = member);
    # tp pieces over dp only, per tp index: t->dp 0, u->dp 1
    assert written == {0: ["model.a", "model.t"], 1: ["model.b", "model.t"],
                       2: ["model.c", "model.u"], 3: ["model.d", "model.u"]}
    # (every rank holds its own shard of t and u: tp 0 ranks write box 0, tp 1 ranks box 1)
    assert all(pieces_to_write(pieces, nbytes, mesh.coords(r), sizes, False) == sorted(pieces)
               for r in range(4))


def test_pieces_to_write_zero_rows_over_their_replicas():
    # dp 4, ZeRO-1 over 2 shards: 2 replicas of each row block (rank // 2)
    pieces = {"optim.adam_m.w": ZERO, "optim.adam_v.w": ZERO}
    nbytes = {"optim.adam_m.w": 8, "optim.adam_v.w": 8}
    sizes = {"dp": 4, ZERO_REPLICA: 2}
    assert pieces_to_write(pieces, nbytes, {"dp": 1, ZERO_REPLICA: 0}, sizes, True) == \
        ["optim.adam_m.w"]
    assert pieces_to_write(pieces, nbytes, {"dp": 3, ZERO_REPLICA: 1}, sizes, True) == \
        ["optim.adam_v.w"]


def test_axis_sizes_of_a_whole_layout():
    mesh = make_mesh(4, tp=2)
    # upstream's MoE folding (core/parallel_dims.py): without expert parallel every rank of the
    # stage (tp x dp) holds the same routed experts, so edp is 4
    assert axis_sizes([mesh.coords(r) for r in range(4)]) == {
        "tp": 2, "cp": 1, "dp": 2, "pp": 1, "ep": 1, "edp": 4, "dp_cp": 2, "world": 4}
    assert axis_sizes([]) == {}


def test_balanced_load_divides_the_rank_files_over_the_ranks_by_bytes():
    from mindformers_core.checkpoint.balanced_load import file_sharing, files_to_read
    nbytes = [100, 10, 60, 50, 0]
    parts = [files_to_read(nbytes, r, 2) for r in range(2)]
    # 100 -> 0, 60 -> 1, 50 -> 1 (60 < 100), 10 -> 0 (100 < 110), 0 -> 0 (110 = 110, lower)
    assert parts == [[0, 1, 4], [2, 3]]
    assert files_to_read(nbytes, 0, 1) == [0, 1, 2, 3, 4]
    # one process (no communicator) and an unbalanced load share nothing
    assert file_sharing(True, None) is None and file_sharing(False, object()) is None


def test_what_a_balanced_load_broadcasts_survives_its_int32_packing():
    import pickle

    import numpy as np
    from mindformers_core.distributed.object_exchange import (from_words, join_count,
                                                              split_count, to_words)
    for raw in (b"", b"a", b"abcd", pickle.dumps({3: [("k", np.arange(5, dtype=np.float32))]})):
        words = to_words(raw)
        assert words.dtype == np.int32 and words.size == (len(raw) + 3) // 4
        assert from_words(words, len(raw)) == raw
    for n in (0, 7, 2**30 - 1, 2**30, 5 * 2**30 + 11):
        pair = split_count(n)
        assert pair.dtype == np.int32 and join_count(pair) == n
