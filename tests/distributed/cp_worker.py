"""msrun worker (4 CPU workers): context-parallel core attention against one process.

    python tests/distributed/cp_worker.py OUT_DIR

One GroupCommunicator on the cp-4 mesh (the cp group is the world) plus an extra axis ``cp2``:
the cp groups {0, 1} {2, 3} of a cp 2 x dp 2 mesh (``GroupCommunicator.add_group``). Cases:
ring / ulysses on cp2, ring / ulysses / hybrid (ulysses degree 2) on cp4, each for GPT-style
(D = Dv) and MLA-style (qk head dim != v head dim) q, k, v, GPT-style under a document mask
(``doc``: the reference is ``causal_attention`` with that bias), and the ring ones on fp16 q,
k, v too. Every rank builds the full-sequence
inputs from a seed (cp2: one seed per cp group, so the two groups solve different problems),
runs ``models/layers.causal_attention`` on them (forward, and the gradients of
``sum(context * W)`` w.r.t. q, k, v), then the cp core on its own tokens
(``cp_layout.split_sequence``) with the loss ``sum(context_local * W_local)``: the sum over the
group of the local losses is the full loss, so each rank's gradients must be its rows of the
full ones.

Writes ``OUT_DIR/{case}.rank{r}.npz`` (the local ``ctx dq dk dv max_logits``, the full
``ref_*`` and ``rows_max``: numpy's max of the scaled unmasked scores over the queries this
rank's max_logits must cover) and ``.json`` (cp rank, cp members, communicator stats of the
case, seconds).
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import numpy as np  # noqa: E402

B, N, S = 2, 4, 16
SCALE = 0.35
# head dims (qk, v) and dtype; fp16 (ring only): K/V and their float32 gradients travel as two
# buffers, and the reference is the float32 result on the same fp16-rounded inputs
SHAPES = {"gpt": (8, 8, "float32"), "mla": (12, 6, "float32"), "fp16": (8, 8, "float16"),
          "doc": (8, 8, "float32")}
#: the "doc" cases: document masking (models/documents.py), end-of-document tokens at these
#: positions of sample 0 and 1 (sample 1's first document ends inside rank 0's second chunk
#: of cp 2, its second spans chunk boundaries); every core gets the whole [B, 1, S, S] bias
EODS = ((2, 9), (5, 6, 13))
METHODS = (("cp2_ring", "cp2", "colossal", 1), ("cp2_ulysses", "cp2", "ulysses", 1),
           ("cp4_ring", "cp", "colossal", 1), ("cp4_ulysses", "cp", "ulysses", 1),
           ("cp4_hybrid", "cp", "hybrid", 2))


def shapes(method: str):
    return [s for s in SHAPES if s != "fp16" or method == "colossal"]


CASES = [f"{m[0]}_{s}" for m in METHODS for s in shapes(m[2])]


def inputs(seed: int, d: int, dv: int, dtype: str):
    """q, k, v (``dtype``-rounded, as float32) and the loss weights w."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, N, S, d)).astype(dtype).astype(np.float32)
            for _ in range(2))
    v = rng.standard_normal((B, N, S, dv)).astype(dtype).astype(np.float32)
    w = rng.standard_normal((B, N, S, dv)).astype(np.float32)
    return q, k, v, w


def run(core, q, k, v, w, mask, dtype: str = "float32"):
    """(context, max_logits, dq, dk, dv) of ``core`` on ``dtype`` inputs for the loss
    sum(context * w), as float32 arrays (and the dtypes ``core`` returned)."""
    import mindspore as ms
    from mindspore import Tensor

    def loss(qt, kt, vt):
        ctx, max_logits = core(qt, kt, vt, SCALE, mask)
        return (ctx.astype(ms.float32) * Tensor(w)).sum(), (ctx, max_logits)

    grad = ms.value_and_grad(loss, grad_position=(0, 1, 2), has_aux=True)
    (_, (ctx, max_logits)), grads = grad(*(Tensor(x.astype(dtype)) for x in (q, k, v)))
    outs = [ctx, max_logits] + list(grads)
    return [o.asnumpy().astype(np.float32) for o in outs], [str(o.dtype) for o in outs]


def document_bias_of(eods) -> np.ndarray:
    """The [B, 1, S, S] document mask bias of samples whose end-of-document tokens sit at
    ``eods[b]`` (``models/documents.py``)."""
    from mindformers_core.core.documents import document_positions_and_mask
    from mindformers_core.models.documents import document_bias
    ids = np.ones((B, S), np.int64)
    for b, where in enumerate(eods):
        ids[b, list(where)] = 0
    return document_bias(document_positions_and_mask(ids, 0)[1])


def main(out_dir: str) -> None:
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.distributed import cp_layout
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.distributed.comm import init_distributed
    from mindformers_core.distributed.context_parallel import context_parallel_attention
    from mindformers_core.core.parallel_dims import make_mesh
    from mindformers_core.models.layers import causal_attention

    ms.runtime.launch_blocking()
    world = init_distributed()
    rank = world.rank
    assert world.world_size == 4, world.world_size
    gc = GroupCommunicator(make_mesh(4, cp=4), rank)
    gc.add_group("cp2", make_mesh(4, cp=2).group_of("cp", rank))
    cores = {}
    os.makedirs(out_dir, exist_ok=True)
    for name, group, method, degree in METHODS:
        members = gc.ranks(group)
        cp, cp_rank = len(members), members.index(rank)
        key = (group, method)
        if key not in cores:
            cores[key] = context_parallel_attention(gc, method, inner=causal_attention,
                                                    ulysses_degree=degree, group=group)
        # the query rows this rank's max_logits covers (context_parallel.py's docstring)
        if method == "colossal":
            rows = cp_layout.local_positions(S, cp, cp_rank)
        elif method == "ulysses":
            rows = np.arange(S)
        else:
            rows = cp_layout.local_positions(S, cp // degree, cp_rank // degree)
        for shape in shapes(method):
            d, dv, dtype = SHAPES[shape]
            case = f"{name}_{shape}"
            seed = 1000 * len(CASES) + CASES.index(case) * 10 + (members[0] if cp == 2 else 0)
            q, k, v, w = inputs(seed, d, dv, dtype)
            bias = np.where(np.triu(np.ones((S, S), bool), 1), -np.inf, 0.0).astype(np.float32)
            full_mask = Tensor(np.ascontiguousarray(np.broadcast_to(bias, (B, N, S, S))))
            # a zero local mask_bias: the cores must build their own causal masks
            local_mask = Tensor(np.zeros((B, N, S // cp, S // cp), np.float32))
            if shape == "doc":
                bias = document_bias_of(EODS)
                full_mask = local_mask = Tensor(bias)
            ref, _ = run(causal_attention, q, k, v, w, full_mask)
            scores = np.einsum("bnqd,bnkd->bnqk", q.astype(np.float64), k) * SCALE + bias
            loc = [cp_layout.split_sequence(x, cp, cp_rank, axis=2) for x in (q, k, v, w)]
            gc.stats.reset()
            t0 = time.monotonic()
            got, dtypes = run(cores[key], *loc, local_mask, dtype)
            seconds = time.monotonic() - t0
            names = ("ctx", "max_logits", "dq", "dk", "dv")
            arrays = {n: a for n, a in zip(names, got)}
            arrays.update({"ref_" + n: a for n, a in zip(names, ref)})
            arrays["rows_max"] = scores[:, :, rows].max(axis=(0, 2, 3))
            base = os.path.join(out_dir, f"{case}.rank{rank}")
            np.savez(base + ".npz", **arrays)
            with open(base + ".json", "w") as fh:
                json.dump({"cp": cp, "cp_rank": cp_rank, "members": list(members),
                           "method": method, "degree": degree, "stats": gc.stats.to_dict(),
                           "dtype": dtype, "dtypes": dtypes,
                           "seconds": seconds}, fh)
            world.all_reduce_sum(np.zeros(1, np.float32))   # keep the ranks in step


if __name__ == "__main__":
    main(sys.argv[1])
