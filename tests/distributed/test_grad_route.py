"""The one gradient reduction and norm (distributed/grad_route.py, grad_reduce.py
``reduce_gradients`` / ``gradient_norm``) on one process: the plan is pure, and the executor is
driven through a recording communicator whose sums are known multiples, so each gradient's
collectives can be read off its values. Real processes: every layout's msrun test
(test_layout_cases_msrun.py and the per-kind ones) against one process."""
import numpy as np
import pytest
from mindspore import Tensor

from mindformers_core.distributed.grad_reduce import WORLD, gradient_norm, reduce_gradients
from mindformers_core.distributed.grad_route import (GradRoute, combine_sq_norms, norm_batches,
                                                     rerouted, route_batches)

ALL = [True] * 6


def test_batches_group_by_collectives_in_sorted_order():
    routes = [GradRoute(("dp",)), GradRoute(("edp",)), GradRoute(("dp",)),
              GradRoute(("pp", "dp")), GradRoute((), "dp"), GradRoute()]
    assert route_batches(routes, ALL) == [
        (((), "dp"), [4]), ((("dp",), None), [0, 2]), ((("edp",), None), [1]),
        ((("pp", "dp"), None), [3])]
    # a gradient that is None on every rank takes no part; nothing to do: no batch
    assert route_batches(routes, [False, True, False, True, True, True]) == [
        (((), "dp"), [4]), ((("edp",), None), [1]), ((("pp", "dp"), None), [3])]


def test_norm_batches_put_the_replicated_first_and_skip_uncounted():
    routes = [GradRoute(norm_group="tp"), GradRoute(), GradRoute(norm_group="ep"),
              GradRoute(counted=False), GradRoute(norm_group="tp"), GradRoute()]
    assert norm_batches(routes, ALL) == [(None, [1, 5]), ("ep", [2]), ("tp", [0, 4])]


def test_combine_is_the_closed_form():
    sums = {"tp": 10.0, "ep": 100.0, "pp": 1000.0}
    calls = []

    def group_sum(group, x):
        calls.append((group, x))
        return x * sums[group]

    # replicated 1 + 2, tp 3 + 4 summed over tp, ep 5 over ep, then the stages over pp
    got = combine_sq_norms([(None, 1.0), ("tp", 3.0), (None, 2.0), ("ep", 5.0), ("tp", 4.0)],
                           group_sum, outer=("pp",))
    assert got == (3.0 + 7.0 * 10 + 5.0 * 100) * 1000
    assert calls == [("ep", 5.0), ("tp", 7.0), ("pp", 573.0)]   # sorted groups, one sum each


def test_a_route_cannot_sum_and_scatter_over_one_group():
    with pytest.raises(ValueError, match=r"^a gradient reduce-scattered over 'dp' is not also "
                                         r"summed over it \(sum_over \('pp', 'dp'\)\)$"):
        GradRoute(("pp", "dp"), "dp")
    assert rerouted(GradRoute(("dp",)), counted=False) == GradRoute(("dp",), counted=False)


class Recording:
    """A 4-rank communicator seen from one rank: a sum over group G multiplies by FACTOR[G]
    (so the value tells which sums a gradient took), a reduce-scatter keeps rows 0..1 of 4 and
    multiplies them by 2."""
    FACTOR = {WORLD: 2.0, "dp": 3.0, "edp": 5.0, "pp": 7.0}
    world_size = 4

    def __init__(self):
        self.calls = []

    def all_reduce(self, x, group):
        self.calls.append(("all_reduce", group, tuple(x.shape)))
        return x * self.FACTOR[group] if isinstance(x, Tensor) else np.asarray(x) * self.FACTOR[group]

    def reduce_scatter(self, x, group):
        self.calls.append(("reduce_scatter", group, tuple(x.shape)))
        return x[:1] * 2.0

    def size(self, group):
        return 2

    def group_sum(self, group, value):
        return value * self.FACTOR[group]


def test_every_gradient_takes_its_route_and_the_scalars_ride_the_data_bucket():
    comm = Recording()
    ones = [Tensor(np.ones(shape, np.float32)) for shape in ((2, 3), (4,), (2, 2), (3,), (2,))]
    routes = [GradRoute(("dp",)), GradRoute(("edp",)), GradRoute((), "dp"),
              GradRoute(("pp", "dp")), GradRoute(("dp",), scale=0.5)]
    out, loss_sum, tokens = reduce_gradients(ones + [None], routes + [GradRoute(("dp",))], comm,
                                             "dp", 1.5, 8.0)
    assert out[5] is None
    np.testing.assert_array_equal(out[0].asnumpy(), np.full((2, 3), 3.0))
    np.testing.assert_array_equal(out[1].asnumpy(), np.full((4,), 5.0))
    np.testing.assert_array_equal(out[2].asnumpy(), np.full((1, 2), 2.0))   # this rank's row
    np.testing.assert_array_equal(out[3].asnumpy(), np.full((3,), 21.0))    # pp, then dp
    np.testing.assert_array_equal(out[4].asnumpy(), np.full((2,), 1.5))     # dp, then x 0.5
    assert (loss_sum, tokens) == (4.5, 24.0)
    # one collective per batch: the scatter; the two dp gradients with the scalars (6+2+2);
    # the experts; the shared embedding over pp, then over dp
    assert comm.calls == [("reduce_scatter", "dp", (2, 2)), ("all_reduce", "dp", (10,)),
                          ("all_reduce", "edp", (4,)), ("all_reduce", "pp", (3,)),
                          ("all_reduce", "dp", (3,))]


def test_the_scalars_go_alone_when_no_gradient_takes_the_data_route():
    comm = Recording()
    out, loss_sum, tokens = reduce_gradients([Tensor(np.ones(2, np.float32))],
                                             [GradRoute(("edp",))], comm, "dp", 1.0, 2.0)
    assert (loss_sum, tokens) == (3.0, 6.0)
    assert comm.calls == [("all_reduce", "edp", (2,)), ("all_reduce", "dp", (2,))]


def test_the_norm_counts_each_gradient_over_its_group():
    comm = Recording()
    grads = [Tensor(np.full(4, 1.0, np.float32)), Tensor(np.full(1, 2.0, np.float32)),
             Tensor(np.full(1, 3.0, np.float32)), None]
    routes = [GradRoute(), GradRoute(norm_group="edp"), GradRoute(counted=False),
              GradRoute(norm_group="dp")]
    # 4 replicated + 4 * 5 over edp, the stage's sum 24 over pp (x 7)
    assert gradient_norm(grads, routes, comm.group_sum, outer=("pp",)) == pytest.approx(
        np.sqrt(24.0 * 7.0), rel=1e-12)
    # one replicated batch: the bucket norm as it is
    assert gradient_norm(grads[:1], routes[:1], comm.group_sum) == 2.0
