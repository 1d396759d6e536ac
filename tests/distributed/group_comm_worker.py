"""msrun worker: every GroupCommunicator collective on every group of a tp-2 mesh, checked
against numpy.

    python tests/distributed/group_comm_worker.py OUT_DIR ROUNDS

Mesh: tensor parallel 2, data parallel ``world // 2`` (4 workers: tp {0,1} {2,3}, dp {0,2}
{1,3}). Every rank builds every rank's input from (rank, round, case), so the expected result of
each collective is computed locally with numpy from all members' inputs. Integer-valued float32
data: sums are exact, so the comparison is exact. Each collective is followed by world-group
traffic (an all-reduce through the world ``Communicator``, checked too), so sub-group and
world-group operations interleave.

Writes ``OUT_DIR/rank{r}.json``: ``checks`` ([name, max abs error]), ``calls`` ([op, group
size, input bytes, receives] for every collective asked of the GroupCommunicator), ``stats``,
``transport``, ``world_stats``, ``backend``, ``errors`` (the messages of three calls with
bad arguments).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import numpy as np  # noqa: E402

SHAPE = (4, 8)   # both dims divisible by every group size used (2, 4)


def data(rank: int, rnd: int, case: int, shape=SHAPE) -> np.ndarray:
    n = int(np.prod(shape))
    return (((np.arange(n) * 7 + rank * 131 + rnd * 17 + case * 3) % 61) - 30.0).astype(
        np.float32).reshape(shape)


def tp_linear_checks(gc, mesh, rank, check, calls) -> None:
    """Column-parallel then row-parallel linear (an MLP without activation) on the tp group vs
    the one-process numpy forward and backward; each data-parallel rank has its own batch."""
    import mindspore as ms
    from mindformers_core.distributed.shard_spec import global_sq_norm, replicated
    from mindformers_core.models.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    d_in, hidden, d_out, batch = 6, 8, 5, 3
    w1 = data(0, 0, 90, (hidden, d_in)) % 5 - 2
    w2 = data(0, 0, 91, (d_out, hidden)) % 5 - 2
    x = data(mesh.coords(rank)["dp"], 0, 92, (batch, d_in)) % 7 - 3
    c = data(0, 0, 93, (batch, d_out)) % 3 - 1
    col, row = ColumnParallelLinear(d_in, hidden, gc), RowParallelLinear(hidden, d_out, gc)
    col.load_full(w1)
    row.load_full(w2)

    def loss_fn(xt):
        y = row(col(xt))
        return (y * ms.Tensor(c)).sum(), y

    grad_fn = ms.value_and_grad(loss_fn, grad_position=0, weights=[col.weight, row.weight],
                                has_aux=True)
    (loss, y), (dx, (dw1, dw2)) = grad_fn(ms.Tensor(x))
    h = x @ w1.T
    want_y = h @ w2.T
    dh = c @ w2
    k = mesh.local_rank("tp", rank)
    # forward: the row-parallel output; backward: the column-parallel input's gradient
    calls += [["all_reduce", 2, float(want_y.nbytes), True],
              ["all_reduce", 2, float(x.nbytes), True]]
    check("tp_linear/forward", y.asnumpy(), want_y)
    check("tp_linear/loss", loss.asnumpy(), np.sum(want_y * c))
    check("tp_linear/dx", dx.asnumpy(), dh @ w1)
    check("tp_linear/dw_column", dw1.asnumpy(), np.split(dh.T @ x, 2, 0)[k])
    check("tp_linear/dw_row", dw2.asnumpy(), np.split(c.T @ h, 2, 1)[k])
    # the sharded grad-norm rule over the real tp group (c stands in for a replicated gradient)
    local = [(col.spec, float(np.sum(dw1.asnumpy() ** 2))),
             (row.spec, float(np.sum(dw2.asnumpy() ** 2))), (replicated(c.shape), np.sum(c ** 2))]
    got = global_sq_norm(local, gc.group_sum)
    calls.append(["all_reduce", 2, 4.0, True])
    check("tp_linear/grad_sq_norm", got,
          np.sum((dh.T @ x) ** 2) + np.sum((c.T @ h) ** 2) + np.sum(c ** 2))
    check("tp_linear/shard_shapes", np.array(col.weight.shape + row.weight.shape),
          np.array([hidden // 2, d_in, d_out, hidden // 2]))


def main(out_dir: str, rounds: int) -> None:
    import mindspore as ms
    from mindformers_core.distributed.collectives import GroupCommunicator
    from mindformers_core.distributed.comm import init_distributed
    from mindformers_core.core.parallel_dims import make_mesh

    ms.runtime.launch_blocking()
    world = init_distributed()
    rank, w = world.rank, world.world_size
    mesh = make_mesh(w, tp=2)
    gc = GroupCommunicator(mesh, rank)
    checks, calls = [], []
    case = [0]

    def check(name, got, want):
        checks.append([name, float(np.max(np.abs(np.asarray(got, np.float64) - want)))
                       if np.shape(got) == np.shape(want) else float("inf")])

    def world_traffic(tag):
        case[0] += 1
        x = data(rank, 0, 1000 + case[0], (3,))
        check(f"world_interleave/{tag}", world.all_reduce_sum(x),
              sum(data(q, 0, 1000 + case[0], (3,)) for q in range(w)))

    for rnd in range(rounds):
        for group in ("tp", "dp", "world"):
            ranks = mesh.group_of(group, rank)
            g, i = len(ranks), ranks.index(rank)
            if g == 1:
                continue
            nb = float(np.prod(SHAPE) * 4)

            def inputs(c):
                return [data(q, rnd, c) for q in ranks]

            tag = f"r{rnd}/{group}"
            xs = inputs(1)
            check(f"all_reduce/{tag}", gc.all_reduce(xs[i], group), sum(xs))
            calls.append(["all_reduce", g, nb, True])
            world_traffic(f"all_reduce/{tag}")
            for axis in (0, 1):
                xs = inputs(2 + axis)
                check(f"all_gather{axis}/{tag}", gc.all_gather(xs[i], group, axis),
                      np.concatenate(xs, axis))
                calls.append(["all_gather", g, nb, True])
                world_traffic(f"all_gather{axis}/{tag}")
                xs = inputs(4 + axis)
                check(f"reduce_scatter{axis}/{tag}", gc.reduce_scatter(xs[i], group, axis),
                      np.split(sum(xs), g, axis)[i])
                calls.append(["reduce_scatter", g, nb, True])
                world_traffic(f"reduce_scatter{axis}/{tag}")
            for src in ranks:
                xs = inputs(6 + src)
                check(f"broadcast_from{src}/{tag}", gc.broadcast(xs[i], group, src),
                      xs[ranks.index(src)])
                calls.append(["broadcast", g, nb, rank != src])
                world_traffic(f"broadcast{src}/{tag}")
            for sa, ca in ((0, 0), (0, 1), (1, 0)):
                xs = inputs(20 + 2 * sa + ca)
                want = np.concatenate([np.split(xs[j], g, sa)[i] for j in range(g)], ca)
                check(f"all_to_all{sa}{ca}/{tag}", gc.all_to_all(xs[i], group, sa, ca), want)
                calls.append(["all_to_all", g, nb, True])
                world_traffic(f"all_to_all{sa}{ca}/{tag}")
        # pairwise, in one global order every rank walks (tp pairs, dp pairs, then pairs that
        # are in no mesh group, created on first use)
        pairs = [(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (1, 3), (0, 3), (1, 2)]
        for k, (s, d) in enumerate(p for p in pairs if max(p) < w):
            x = data(s, rnd, 40 + k)
            if rank == s:
                gc.send(x, d)
                calls.append(["send", 2, float(x.nbytes), False])
            elif rank == d:
                check(f"recv{s}->{d}/r{rnd}", gc.recv(np.zeros_like(x), s), x)
                calls.append(["recv", 2, float(x.nbytes), True])
            world_traffic(f"p2p{s}{d}/r{rnd}")
    tp_linear_checks(gc, mesh, rank, check, calls)
    errors = []   # the argument errors, raised before any communication
    other = [q for q in range(w) if q not in mesh.group_of("tp", rank)]
    for call in (lambda: gc.broadcast(data(rank, 0, 0), "tp", other[0] if other else w),
                 lambda: gc.reduce_scatter(data(rank, 0, 0, (3, 2)), "tp", 0),
                 lambda: gc.all_to_all(data(rank, 0, 0, (2, 3)), "tp", 1, 0)):
        try:
            call()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"world": w, "backend": gc.backend, "checks": checks, "calls": calls,
                   "errors": errors,
                   "stats": gc.stats.to_dict(), "transport": gc.transport.to_dict(),
                   "world_stats": world.stats.to_dict()}, fh)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
