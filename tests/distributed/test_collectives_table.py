"""The capability table, the byte formulas and the one-rank identity of GroupCommunicator."""
import numpy as np
import pytest

from mindformers_core.distributed.collectives import (CAPABILITIES, OPS, GroupCommunicator,
                                                      is_native, logical_bytes)
from mindformers_core.core.parallel_dims import make_mesh


def test_cpu_has_sum_everywhere_and_gather_broadcast_on_the_world_only():
    assert is_native("cpu", "all_reduce", on_world=False)
    for op in ("all_gather", "broadcast"):
        assert is_native("cpu", op, on_world=True) and not is_native("cpu", op, on_world=False)
    for op in ("reduce_scatter", "all_to_all", "send_recv"):
        assert not is_native("cpu", op, on_world=True)
    assert all(is_native("ascend", op, on_world=False) for op in OPS)
    assert set(CAPABILITIES["cpu"]) == set(OPS)


def test_unknown_backend_or_op_is_refused():
    with pytest.raises(ValueError, match=r"no collective capability table for backend 'gpu'; "
                                         r"known: \['ascend', 'cpu'\]"):
        is_native("gpu", "all_reduce", True)
    with pytest.raises(ValueError, match=r"unknown collective 'scan'"):
        is_native("cpu", "scan", True)
    with pytest.raises(ValueError, match=r"unknown collective 'scan'"):
        logical_bytes("scan", 2, 8)
    with pytest.raises(ValueError, match=r"no collective capability table for backend 'gpu'"):
        GroupCommunicator(make_mesh(1), 0, backend="gpu")


@pytest.mark.parametrize("op,g,n,receives,want", [
    ("all_reduce", 4, 100, True, 150.0),       # 2 (G-1)/G n
    ("all_gather", 4, 100, True, 300.0),       # (G-1) n
    ("reduce_scatter", 4, 100, True, 75.0),    # (G-1)/G n
    ("all_to_all", 2, 100, True, 50.0),
    ("broadcast", 4, 100, True, 100.0),
    ("broadcast", 4, 100, False, 0.0),         # the source receives nothing
    ("recv", 2, 100, True, 100.0),
    ("send", 2, 100, False, 0.0),
])
def test_ring_byte_formulas(op, g, n, receives, want):
    assert logical_bytes(op, g, n, receives) == want


def test_one_rank_is_the_identity_and_counts_nothing():
    gc = GroupCommunicator(make_mesh(1), 0, backend="cpu")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for out in (gc.all_reduce(x, "tp"), gc.all_gather(x, "dp", 1), gc.reduce_scatter(x, "tp"),
                gc.broadcast(x, "world", 0), gc.all_to_all(x, "ep", 0, 1)):
        np.testing.assert_array_equal(out, x)
        assert out is not x
    assert gc.stats.total_bytes == 0 and gc.transport.total_bytes == 0


def test_send_to_itself_is_refused():
    gc = GroupCommunicator(make_mesh(1), 0, backend="cpu")
    with pytest.raises(ValueError, match=r"send: peer rank 0 must be another rank of the world "
                                         r"of 1 \(this rank is 0\)"):
        gc.send(np.zeros(2, np.float32), 0)
