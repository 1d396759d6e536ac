"""The mesh's group math (pure): Megatron order, tp fastest, then cp, dp, pp; ep folded over the
tp x cp x dp ranks of a stage (upstream's MoE folding; without tp and cp: ep inside dp)."""
import itertools

import pytest

from mindformers_core.core.parallel_dims import Mesh, group_name, make_mesh

SAME = {"tp": ("cp", "dp", "pp"), "cp": ("tp", "dp", "pp"), "dp": ("tp", "cp", "pp"),
        "pp": ("tp", "cp", "dp"), "ep": ("pp", "edp"), "edp": ("pp", "ep")}


def test_tp2_dp2_groups_on_four_ranks():
    m = make_mesh(4, tp=2)
    assert (m.tp, m.dp) == (2, 2)
    assert m.groups("tp") == [(0, 1), (2, 3)]
    assert m.groups("dp") == [(0, 2), (1, 3)]
    assert m.groups("world") == [(0, 1, 2, 3)]
    assert m.groups("pp") == [(0,), (1,), (2,), (3,)]
    assert m.group_of("dp", 3) == (1, 3) and m.local_rank("dp", 3) == 1
    # without expert parallel every rank of the stage holds the same experts: edp = tp x dp
    assert m.coords(3) == {"tp": 1, "cp": 0, "dp": 1, "pp": 0, "ep": 0, "edp": 3, "dp_cp": 1,
                           "world": 3}


def test_dp_cp_group_holds_the_ranks_of_one_tp_shard_and_stage():
    m = make_mesh(4, tp=2, cp=2)   # cp x tp on 4: cp {0,2} {1,3}, tp {0,1} {2,3}
    assert m.groups("cp") == [(0, 2), (1, 3)] and m.dp == 1
    assert [m.dp_cp_group(r) for r in range(4)] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    m = make_mesh(16, tp=2, cp=2, pp=2)   # dp 2
    for r in range(16):
        group = m.dp_cp_group(r)
        assert len(group) == m.dp * m.cp and r in group
        assert {m.coords(g)["tp"] for g in group} == {m.coords(r)["tp"]}
        assert {m.coords(g)["pp"] for g in group} == {m.coords(r)["pp"]}
        assert set(group) >= set(m.group_of("dp", r)) | set(m.group_of("cp", r))
        # the dp_cp coordinate is the rank's index in that group (FSDP's rows under cp)
        assert group.index(r) == m.coords(r)["dp_cp"]
    # dp2 x cp2 with ep2 on 4: ep folds over cp x dp, so the ep group is the cp group
    m = make_mesh(4, cp=2, ep=2)
    assert m.groups("ep") == m.groups("cp") == [(0, 1), (2, 3)]
    assert m.groups("edp") == m.groups("dp") == [(0, 2), (1, 3)]
    assert m.dp_cp_group(3) == (0, 1, 2, 3)


def test_rank_formula_and_partition_for_a_full_mesh():
    m = make_mesh(48, tp=2, cp=3, pp=2, ep=2)
    assert m.dp == 4 and m.size("edp") == 12   # tp * cp * dp / ep
    for r in range(48):
        c = m.coords(r)
        # the closed form of the module docstring
        assert r == c["tp"] + 2 * (c["cp"] + 3 * (c["dp"] + 4 * c["pp"]))
        # MoE folding: ep fastest over the stage's tp x cp x dp ranks
        assert c["tp"] + 2 * (c["cp"] + 3 * c["dp"]) == c["ep"] + 2 * c["edp"]
    for axis in ("tp", "cp", "dp", "pp", "ep", "edp"):
        groups = m.groups(axis)
        assert sorted(itertools.chain(*groups)) == list(range(48))   # a partition
        assert all(len(g) == m.size(axis) for g in groups)
        for g in groups:
            # members agree on every other coordinate and cover this one
            cs = [m.coords(r) for r in g]
            assert all(all(c[k] == cs[0][k] for k in SAME[axis]) for c in cs)
            assert sorted(c[axis] for c in cs) == list(range(m.size(axis)))


def test_expert_groups_are_consecutive_data_parallel_ranks():
    m = make_mesh(8, ep=4)      # dp 8, tp 1
    assert m.groups("ep") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert m.groups("edp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    m = make_mesh(8, tp=2, ep=2)   # dp 4: ep folded over tp x dp (upstream), tp ranks first
    assert m.groups("ep") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert m.groups("edp") == [(0, 2, 4, 6), (1, 3, 5, 7)]


def test_group_names_come_from_the_members():
    assert group_name("tp", (2, 3)) == "tp_2_3"
    m = make_mesh(4, tp=2)
    # every member derives the same name
    assert {group_name("dp", m.group_of("dp", r)) for r in (1, 3)} == {"dp_1_3"}


def test_mesh_errors_name_the_fields():
    with pytest.raises(ValueError, match=r"tensor_parallel\(4\) \* pipeline_parallel\(1\) \* "
                                         r"context_parallel\(1\) must be less than or equal to "
                                         r"world_size\(2\)\."):
        make_mesh(2, tp=4)
    with pytest.raises(ValueError, match=r"world_size\(6\) must be divisible by "
                                         r"tensor_parallel\(4\)"):
        make_mesh(6, tp=4)
    with pytest.raises(ValueError, match=r"data_parallel\(4\) must be divisible by "
                                         r"expert_parallel\(3\)"):
        make_mesh(4, ep=3)
    with pytest.raises(ValueError, match=r"tensor_parallel must be a positive integer, but got 0"):
        make_mesh(4, tp=0)
    with pytest.raises(ValueError, match=r"rank 4 is outside the world of 4 ranks"):
        make_mesh(4).coords(4)
    with pytest.raises(ValueError, match=r"unknown parallel axis 'xp'"):
        Mesh(world=2, dp=2).group_of("xp", 0)


def test_fsdp_splits_over_dp_times_cp_when_every_dp_rank_shards():
    from mindformers_core.core.parallel_dims import fsdp_ranks
    assert fsdp_ranks(2, 2, 2) == 4      # dp2 x cp2: the dp_cp group
    assert fsdp_ranks(1, 1, 2) == 2      # cp2 alone: the two cp ranks
    assert fsdp_ranks(4, 4) == 4 and fsdp_ranks(4, 1, 2) == 1
