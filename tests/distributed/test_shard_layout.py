"""Pure parts of data parallelism: dim-0 shards, flat packing, NS cost, owners, buckets."""
import numpy as np
import pytest

from mindformers_core.distributed.grad_reduce import plan_buckets
from mindformers_core.distributed.shard_layout import (ShardLayout, assign_owners, ns_cost,
                                                       ns_flops, shard_rows)


@pytest.mark.parametrize("d0,shards", [(10, 2), (7, 2), (7, 3), (3, 3), (64, 4), (5, 4)])
def test_shard_rows_tile_the_rows_like_array_split(d0, shards):
    bounds = [shard_rows(d0, shards, k) for k in range(shards)]
    want = np.array_split(np.arange(d0), shards)
    assert [list(range(a, b)) for a, b in bounds] == [list(w) for w in want]


def test_shard_rows_rejects_a_bad_index():
    with pytest.raises(ValueError, match="shard index 2 out of range for 2 shards"):
        shard_rows(4, 2, 2)


def test_layout_replicates_small_and_scalar_params():
    lay = ShardLayout([(1,), (), (2, 3), (5, 2)], num_shards=2, rank=1, world_size=2)
    assert [e.sharded for e in lay.entries] == [False, False, True, True]
    assert lay.shard_shape(0) == (1,) and lay.rows(0) == (0, 1)
    assert lay.shard_shape(2) == (1, 3) and lay.rows(2) == (1, 2)
    assert lay.rows(3) == (3, 5)   # array_split: 3 + 2 rows


def test_layout_rejects_shards_not_dividing_the_world():
    with pytest.raises(ValueError, match=r"num_shards \(3\) must divide world_size \(4\)"):
        ShardLayout([(4,)], 3, 0, 4)


@pytest.mark.parametrize("world,shards", [(2, 2), (3, 3), (4, 2)])
def test_pack_and_unpack_of_an_all_gather_rebuild_every_tensor(world, shards):
    """Every rank packs its rows; the rank-ordered concatenation (what AllGather returns)
    unpacks to the full tensors on any rank, also with HSDP (shards < world)."""
    rng = np.random.default_rng(0)
    shapes = [(7, 3), (2,), (5,), (4, 2, 2), (1, 4)]
    full = [rng.normal(size=s).astype(np.float32) for s in shapes]
    layouts = [ShardLayout(shapes, shards, r, world) for r in range(world)]
    idx = [i for i in range(len(shapes)) if layouts[0].is_sharded(i)]
    buffers = []
    for lay in layouts:
        items = [(i, full[i][slice(*lay.rows(i))]) for i in idx]
        buffers.append(lay.pack(items))
    assert len({b.size for b in buffers}) == 1
    gathered = np.concatenate(buffers)
    for lay in layouts:
        for i, arr in zip(idx, lay.unpack_gathered(gathered, idx)):
            np.testing.assert_array_equal(arr, full[i])


def test_pack_rejects_a_piece_of_the_wrong_size():
    lay = ShardLayout([(4, 2)], 2, 0, 2)
    with pytest.raises(ValueError, match="piece of parameter 0 has 6 elements, expected 4"):
        lay.pack([(0, np.zeros((3, 2)))])


def test_ns_cost_and_flops_closed_form():
    # (A, B) = (8, 32): L = 32, s = 8; 5 steps
    assert ns_cost([(8, 32)], 5) == 5 * (2 * 32 * 8 ** 2 + 8 ** 3) + 8 * 32
    assert ns_flops([(8, 32)], 5) == 5 * (4 * 32 * 8 ** 2 + 2 * 8 ** 3)
    # a 3-D batch counts each matrix; orientation does not matter
    assert ns_cost([(4, 32, 8)], 5) == 4 * ns_cost([(8, 32)], 5)
    assert ns_flops([(32, 8)], 3) == ns_flops([(8, 32)], 3)


def test_ns_flops_agrees_with_newton_schulz_counter():
    from mindformers_core.optim.newton_schulz import ns_matmul_flops
    for shape in [(16, 48), (48, 16), (3, 8, 8)]:
        assert ns_flops([shape], 5) == ns_matmul_flops(shape, 5)


def test_assign_owners_greedy_example_and_balance():
    # LPT by decreasing cost: 9 -> r0 (0,0); 7 -> r1 (9,0); 5 -> r1 (9,7); 4 -> r0 (9,12);
    # 2 -> r1 (13,12)
    assert assign_owners([5, 9, 2, 7, 4], 2) == [1, 0, 1, 1, 0]
    rng = np.random.default_rng(1)
    costs = list(rng.integers(1, 100, 40))
    owners = assign_owners(costs, 4)
    loads = [sum(c for c, o in zip(costs, owners) if o == r) for r in range(4)]
    assert max(loads) - min(loads) <= max(costs)
    assert owners == assign_owners(costs, 4)   # deterministic: every rank agrees


def test_plan_buckets_keeps_order_and_limits_size():
    assert plan_buckets([10, 10, 10], bucket_bytes=80) == [[0, 1], [2]]
    assert plan_buckets([100, 1, 1], bucket_bytes=8) == [[0], [1, 2]]
    assert plan_buckets([], bucket_bytes=8) == [[]]
    flat = [i for b in plan_buckets(list(range(1, 30)), 64) for i in b]
    assert flat == list(range(29))


def test_layout_keeps_whole_the_params_it_is_told_to():
    """Expert weights under expert parallelism: the ranks hold different experts, so their
    state is never row-sharded (``whole``), whatever their row count."""
    shapes = [(8, 3), (4, 6, 6), (8, 2)]
    for rank in (0, 1):
        layout = ShardLayout(shapes, 2, rank, 2, whole=[False, True, False])
        assert [layout.is_sharded(i) for i in range(3)] == [True, False, True]
        assert layout.shard_shape(1) == (4, 6, 6) and layout.rows(1) == (0, 4)
        assert layout.shard_shape(0) == (4, 3)
    assert ShardLayout(shapes, 2, 0, 2).is_sharded(1)
