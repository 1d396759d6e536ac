"""ShardSpec: shard shapes and slices, shard/unshard round trips, and the sharded grad-norm rule,
against numpy on the full tensors."""
import numpy as np
import pytest

from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.distributed.shard_spec import (ShardSpec, global_sq_norm, local_shape,
                                                      local_slice, replicated, shard, unshard)


def test_column_and_row_shards():
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    col = ShardSpec((4, 6), split_dim=0, group="tp", num_shards=2)
    row = ShardSpec((4, 6), split_dim=1, group="tp", num_shards=3)
    assert local_shape(col) == (2, 6) and local_shape(row) == (4, 2)
    assert local_slice(col, 1) == (slice(2, 4), slice(0, 6))
    np.testing.assert_array_equal(shard(col, w, 1), w[2:4])
    np.testing.assert_array_equal(shard(row, w, 2), w[:, 4:6])
    for spec in (col, row):
        parts = [shard(spec, w, k) for k in range(spec.num_shards)]
        np.testing.assert_array_equal(unshard(spec, parts), w)


def test_replicated_is_the_whole_tensor():
    w = np.ones((3, 2))
    spec = replicated((3, 2))
    assert not spec.is_sharded and local_shape(spec) == (3, 2)
    np.testing.assert_array_equal(shard(spec, w, 0), w)
    np.testing.assert_array_equal(unshard(spec, [w]), w)
    assert ShardSpec([3, 2]).full_shape == (3, 2)   # any sequence, stored as a tuple


def test_grad_norm_counts_replicated_once_and_sums_shards_over_their_group():
    rng = np.random.default_rng(0)
    mesh = make_mesh(8, tp=2, ep=2)      # dp 4, ep 2 inside dp
    specs = {"norm": replicated((6,)),
             "qkv": ShardSpec((8, 6), 0, "tp", 2), "proj": ShardSpec((6, 8), 1, "tp", 2),
             "expert": ShardSpec((4, 6, 6), 0, "ep", 2)}
    full = {k: rng.standard_normal(s.full_shape) for k, s in specs.items()}
    want = sum(float(np.sum(g ** 2)) for g in full.values())

    def local(rank):
        idx = {"tp": mesh.local_rank("tp", rank), "ep": mesh.local_rank("ep", rank)}
        return [(s, float(np.sum(shard(s, full[k], idx.get(s.group, 0)) ** 2)))
                for k, s in specs.items()]

    for rank in range(mesh.world):
        def group_sum(group, x, rank=rank):
            # every member's own partial for this group: what the all_reduce returns
            total = 0.0
            for q in mesh.group_of(group, rank):
                total += sum(sq for s, sq in local(q) if s.group == group)
            assert sum(sq for s, sq in local(rank) if s.group == group) == x
            return total
        assert global_sq_norm(local(rank), group_sum) == pytest.approx(want, rel=1e-12)


def test_spec_errors():
    with pytest.raises(ValueError, match=r"dim 1 of shape \(4, 6\) \(6\) is not divisible by "
                                         r"the tp group size 4"):
        ShardSpec((4, 6), 1, "tp", 4)
    with pytest.raises(ValueError, match=r"split_dim 2 is out of range for shape \(4, 6\)"):
        ShardSpec((4, 6), 2, "tp", 2)
    with pytest.raises(ValueError, match=r"needs a group name \(tp, ep or dp_shard\)"):
        ShardSpec((4, 6), 0, None, 2)
    with pytest.raises(ValueError, match=r"a replicated parameter has no group and 1 shard, but "
                                         r"got group='tp', num_shards=1"):
        ShardSpec((4, 6), None, "tp")
    with pytest.raises(ValueError, match=r"num_shards must be a positive integer, but got 0"):
        ShardSpec((4, 6), 0, "tp", 0)
    spec = ShardSpec((4, 6), 0, "tp", 2)
    with pytest.raises(ValueError, match=r"shard index 2 is out of range for 2 shards"):
        local_slice(spec, 2)
    with pytest.raises(ValueError, match=r"expected the full shape \(4, 6\), but got \(2, 6\)"):
        shard(spec, np.zeros((2, 6)), 0)
    with pytest.raises(ValueError, match=r"expected 2 shards, but got 1"):
        unshard(spec, [np.zeros((2, 6))])
    with pytest.raises(ValueError, match=r"shard 1 has shape \(3, 6\), expected \(2, 6\)"):
        unshard(spec, [np.zeros((2, 6)), np.zeros((3, 6))])
    with pytest.raises(AttributeError):
        spec.split_dim = 1     # frozen
