"""The context-parallel cores on a one-rank group, in one process (no communication: ring
attention's block math and online softmax, its ring backward, the ulysses re-ordering), against
models/layers.causal_attention; GroupCommunicator.add_group and the cores' argument errors.
The multi-rank transport is tests/distributed/test_cp_msrun.py."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed.collectives import GroupCommunicator
from mindformers_core.distributed.context_parallel import context_parallel_attention
from mindformers_core.core.parallel_dims import Mesh
from mindformers_core.distributed.ring_attention import RingAttention
from mindformers_core.models.layers import causal_attention

B, N, S = 2, 3, 12


def one_rank():
    return GroupCommunicator(Mesh(world=1), 0, backend="cpu")


def run(core, q, k, v, w, mask):
    def loss(qt, kt, vt):
        ctx, max_logits = core(qt, kt, vt, 0.3, mask)
        return (ctx * Tensor(w)).sum(), (ctx, max_logits)
    (_, (ctx, ml)), grads = ms.value_and_grad(loss, grad_position=(0, 1, 2), has_aux=True)(
        Tensor(q), Tensor(k), Tensor(v))
    return [ctx.asnumpy(), ml.asnumpy()] + [g.asnumpy() for g in grads]


@pytest.mark.parametrize("method", ["colossal", "ulysses", "hybrid"])
@pytest.mark.parametrize("dims", [(8, 8), (10, 6)], ids=["gpt", "mla"])
def test_core_matches_causal_attention(method, dims):
    d, dv = dims
    rng = np.random.default_rng(7)
    q, k = (rng.standard_normal((B, N, S, d)).astype(np.float32) for _ in range(2))
    v, w = (rng.standard_normal((B, N, S, dv)).astype(np.float32) for _ in range(2))
    bias = np.where(np.triu(np.ones((S, S), bool), 1), -np.inf, 0.0).astype(np.float32)
    ref = run(causal_attention, q, k, v, w,
              Tensor(np.ascontiguousarray(np.broadcast_to(bias, (B, N, S, S)))))
    core = context_parallel_attention(one_rank(), method, inner=causal_attention)
    # no mask_bias: the cores must build their own causal masks (on one rank a whole
    # [.., S, S] bias is a document mask, tests/models/test_document_masking.py)
    got = run(core, q, k, v, w, None)
    for name, g, r in zip(("ctx", "max_logits", "dq", "dk", "dv"), got, ref):
        assert g.shape == r.shape
        assert np.max(np.abs(g - r)) / np.max(np.abs(r)) < 1e-5, name


def test_bad_core_arguments_are_refused_with_the_reason():
    comm = one_rank()
    with pytest.raises(ValueError, match=r"^context parallel method 'ring' is not one of "
                                         r"\('colossal', 'ulysses', 'hybrid'\)"):
        context_parallel_attention(comm, "ring")
    with pytest.raises(ValueError, match="^ulysses context parallel needs the model's core "
                                         "attention as `inner`"):
        context_parallel_attention(comm, "ulysses")
    with pytest.raises(ValueError, match="^ulysses degree 2 does not divide the context "
                                         "parallel size 1"):
        context_parallel_attention(comm, "hybrid", ulysses_degree=2)
    x = Tensor(np.zeros((1, 1, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"^ring attention: the local sequence length 3 is not "
                                         r"even"):
        RingAttention(comm)(x, x, x, 1.0, None)


def test_add_group_names_an_extra_axis():
    comm = GroupCommunicator(Mesh(world=2, dp=2), 0, backend="cpu")
    assert comm.add_group("cp_ring", [0]) == (0,)
    assert comm.ranks("cp_ring") == (0,)
    assert comm.add_group("cp_ring", (0,)) == (0,)     # again, same members: a no-op
    assert comm.add_group("pair", (1, 0)) == (0, 1)
    assert comm.ranks("pair") == (0, 1) == comm.ranks("dp")
    with pytest.raises(ValueError, match=r"^add_group: axis 'cp_ring' already names the group "
                                         r"\(0,\), not \(0, 1\)"):
        comm.add_group("cp_ring", (0, 1))
    with pytest.raises(ValueError, match="^add_group: 'cp' is a mesh axis; extra axes need "
                                         "another name"):
        comm.add_group("cp", (0,))
    with pytest.raises(ValueError, match=r"^add_group: the x group \(1,\) must hold this rank 0 "
                                         r"and only ranks of the world of 2"):
        comm.add_group("x", (1,))
    with pytest.raises(ValueError, match=r"^add_group: the x group \(0, 2\) must hold"):
        comm.add_group("x", (0, 2))
