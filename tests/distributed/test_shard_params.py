"""Keeping this rank's slice of a parameter (distributed/shard_params.py).

The reproducer of why expert weights are cut into new Parameters: in MindSpore 2.10 a
Parameter cut in place (``set_data``) and not read by the differentiated function gets a
gradient of the shape it was built with."""
import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn

import pytest

from mindformers_core.distributed.shard_params import cut_parameter, cut_parameters, keep_shard
from mindformers_core.distributed.shard_spec import ShardSpec, shard


class Experts(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight1 = Parameter(Tensor(np.arange(24, dtype=np.float32).reshape(4, 3, 2)),
                                 name="experts.weight1")

    def construct(self, x, use: bool):
        return (x * self.weight1).sum() if use else x.sum() * 0


SPEC = ShardSpec((4, 3, 2), 0, "ep", 2)


def grads_of(cell, use):
    x = Tensor(np.ones((2, 3, 2), np.float32))
    fn = ms.value_and_grad(lambda v: cell(v, use), grad_position=None,
                           weights=cell.trainable_params())
    return fn(x)[1][0]


def test_in_place_cut_keeps_the_built_shape_in_an_unused_gradient():
    # the MindSpore behaviour cut_parameter exists for: if this starts giving (2, 3, 2), the
    # in-place cut is safe again
    cell = Experts()
    keep_shard(cell.weight1, SPEC, 1)
    assert cell.weight1.shape == (2, 3, 2)
    assert grads_of(cell, use=False).shape == (4, 3, 2)


def test_cut_parameter_gives_local_gradients_used_or_not():
    cell = Experts()
    full = cell.weight1.asnumpy().copy()
    new = cut_parameter(cell, "weight1", SPEC, 1)
    assert cell.weight1 is new and new.name == "experts.weight1" and new.requires_grad
    np.testing.assert_array_equal(new.asnumpy(), shard(SPEC, full, 1))
    assert [p.name for p in cell.trainable_params()] == ["experts.weight1"]
    unused = grads_of(cell, use=False)
    assert unused.shape == (2, 3, 2) and not unused.asnumpy().any()
    np.testing.assert_array_equal(grads_of(cell, use=True).asnumpy(), np.ones((2, 3, 2)))


def test_cut_parameter_keeps_a_half_precision_dtype():
    cell = Experts()
    cell.weight1 = Parameter(cell.weight1.astype(ms.float16), name="experts.weight1")
    new = cut_parameter(cell, "weight1", SPEC, 0)
    assert new.dtype == ms.float16
    np.testing.assert_array_equal(new.asnumpy().astype(np.float32),
                                  np.arange(12, dtype=np.float32).reshape(2, 3, 2))


def test_cut_parameters_finds_each_weight_on_its_sub_cell():
    """By name, as tensor parallelism cuts them (models/tp_model.py): the sub-cell's
    attribute becomes a new Parameter of the local shape; a name that is no sub-cell's
    attribute is refused."""
    class Model(nn.Cell):
        def __init__(self):
            super().__init__()
            self.experts = Experts()
    model = Model()
    full = model.experts.weight1.asnumpy().copy()
    old = model.experts.weight1
    cut_parameters(model, {"experts.weight1": SPEC}, 0)
    assert model.experts.weight1 is not old and model.experts.weight1.shape == (2, 3, 2)
    np.testing.assert_array_equal(model.experts.weight1.asnumpy(), shard(SPEC, full, 0))
    assert grads_of(model.experts, use=False).shape == (2, 3, 2)
    with pytest.raises(ValueError, match=r"^parameter 'experts.weight2' is not the attribute "
                                         r"'weight2' of a sub-cell 'experts' of the model$"):
        cut_parameters(model, {"experts.weight2": SPEC}, 0)

