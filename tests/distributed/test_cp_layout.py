"""Context-parallel layout math (distributed/cp_layout.py), in one process, and the cp cores on
a one-rank group (no communication: the block math of ring attention and the ulysses
re-ordering) against models/layers.causal_attention."""
import itertools

import numpy as np
import pytest

from mindformers_core.distributed import cp_layout as L


def test_balanced_split_pairs_early_and_late_chunks():
    assert [L.rank_chunks(4, i) for i in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert L.local_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert L.local_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert L.local_positions(12, 1, 0).tolist() == list(range(12))
    for cp in (1, 2, 3, 4):
        pos = np.concatenate([L.local_positions(8 * cp, cp, i) for i in range(cp)])
        assert sorted(pos.tolist()) == list(range(8 * cp))


def test_split_and_gather_are_inverse():
    x = np.arange(2 * 16 * 3).reshape(2, 16, 3)
    for cp in (1, 2, 4):
        parts = [L.split_sequence(x, cp, i) for i in range(cp)]
        assert all(p.shape == (2, 16 // cp, 3) for p in parts)
        np.testing.assert_array_equal(parts[0][:, :, 0] // 3 % 16,
                                      np.broadcast_to(L.local_positions(16, cp, 0), (2, 16 // cp)))
        np.testing.assert_array_equal(L.gather_sequence(parts), x)
    y = np.arange(2 * 3 * 8 * 2).reshape(2, 3, 8, 2)
    np.testing.assert_array_equal(
        L.gather_sequence([L.split_sequence(y, 2, i, axis=2) for i in range(2)], axis=2), y)


def test_bad_split_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"^sequence length 30 is not divisible by 2 \* context "
                                         r"parallel size = 4 \(the load-balanced causal split\)"):
        L.check_split(30, 2)
    with pytest.raises(ValueError, match="^context parallel size must be a positive integer, "
                                         "but got 0"):
        L.check_split(8, 0)
    with pytest.raises(ValueError, match=r"^context parallel rank 2 is outside 0\.\.1"):
        L.rank_chunks(2, 2)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_ring_blocks_cover_the_causal_mask_once_and_balance_the_work(n):
    """Over all steps each rank sees every visible (q chunk, k chunk) pair exactly once, with the
    right kind; each step costs every rank the same (diagonal block = half a full one)."""
    for pos in range(n):
        seen = {}
        for t in range(n):
            src = L.ring_source(pos, t, n)
            work = 0.0
            for a, b, kind in L.ring_blocks(pos, t, n):
                qc, kc = L.rank_chunks(n, pos)[a], L.rank_chunks(n, src)[b]
                assert (qc, kc) not in seen
                seen[qc, kc] = kind
                work += 1.0 if kind == L.FULL else 0.5
            assert work == 2.0, (pos, t)   # step 0: 2 diagonals + 1 full; later: 2 full
        want = {(qc, kc): ("causal" if qc == kc else "full")
                for qc in L.rank_chunks(n, pos) for kc in range(2 * n) if kc <= qc}
        assert seen == want


def test_ring_source_moves_blocks_forward():
    assert [L.ring_source(0, t, 4) for t in range(4)] == [0, 3, 2, 1]
    assert [L.ring_source(2, t, 4) for t in range(4)] == [2, 1, 0, 3]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_ring_phases_are_matchings_walked_in_one_order(n):
    """Every colour is a matching; simulating blocking rendezvous (a send completes only when its
    receiver is at the matching recv) finishes for every rank: no deadlock."""
    colours = [L.edge_colour(p, n) for p in range(n)]
    for c in set(colours):
        ends = [r for p in range(n) if colours[p] == c for r in (p, (p + 1) % n)]
        assert len(ends) == len(set(ends)), (n, c)
    progs = [L.ring_phases(p, n) for p in range(n)]
    assert all(sorted(prog) == sorted([("send", (p + 1) % n), ("recv", (p - 1) % n)])
               for p, prog in enumerate(progs))
    pc = [0] * n
    for _ in range(4 * n):
        for p in range(n):
            if pc[p] < 2 and progs[p][pc[p]][0] == "send":
                q = progs[p][pc[p]][1]
                if pc[q] < 2 and progs[q][pc[q]] == ("recv", p):
                    pc[p] += 1
                    pc[q] += 1
    assert pc == [2] * n
    assert L.ring_phases(0, 1) == []
    assert L.ring_phases(0, 2) == [("send", 1), ("recv", 1)]
    assert L.ring_phases(1, 2) == [("recv", 0), ("send", 0)]


def test_hybrid_groups_and_ulysses_order():
    members = (4, 5, 6, 7)    # a cp group of global ranks
    assert L.hybrid_groups(members, 2, 5) == ((4, 5), (5, 7))
    assert L.hybrid_groups(members, 2, 6) == ((6, 7), (4, 6))
    assert L.hybrid_groups(members, 4, 6) == ((4, 5, 6, 7), (6,))
    assert L.hybrid_groups(members, 1, 6) == ((6,), (4, 5, 6, 7))
    for cp, u in itertools.product((2, 4, 8), (1, 2, 4)):
        if cp % u:
            continue
        for g in range(cp // u):
            gathered = np.concatenate([L.local_positions(16 * cp, cp, g * u + m)
                                       for m in range(u)])
            order = L.ulysses_order(16 * cp, cp, u, g)
            np.testing.assert_array_equal(gathered[order],
                                          L.local_positions(16 * cp, cp // u, g))


def test_bad_ulysses_degree_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="^ulysses degree 3 does not divide the context "
                                         "parallel size 4"):
        L.check_ulysses(4, 3)
    with pytest.raises(ValueError, match="^6 attention heads are not divisible by the ulysses "
                                         "degree 4"):
        L.check_ulysses(4, 4, heads=6)
    with pytest.raises(ValueError, match="^ulysses degree 0 does not divide"):
        L.hybrid_groups((0, 1), 0, 0)
