"""What the trainer calls without probing (trainer/protocols.py): the training data it builds
satisfies ``TrainData``; every optimizer says whether its ``state_dict`` is a collective; an
optimizer state splits into arrays and plain values (trainer/payload.py)."""
import mindspore as ms
import numpy as np

from mindformers_core.data.run_data import build_run_datasets
from mindformers_core.optim.adamw import AdamW
from mindformers_core.trainer.payload import state_arrays
from mindformers_core.trainer.protocols import TrainData

from tests.trainer.test_trainer import tiny_cfg


def test_the_run_datasets_are_train_data(tmp_path):
    train, held = build_run_datasets(tiny_cfg(tmp_path, steps=2))
    assert isinstance(train, TrainData)
    assert train.entropy_floor is not None   # SyntheticMarkov knows its entropy rate
    assert train.load_state_dict(train.state_dict()) is None
    assert held is None or isinstance(held, TrainData)


def test_a_plain_optimizer_state_dict_is_not_a_collective():
    weight = ms.Parameter(ms.Tensor(np.ones((2, 2), np.float32)), name="w")
    assert AdamW([weight], lr=1e-3).collective_state_dict is False


def test_state_arrays_splits_tensors_from_plain_values():
    state = {"step": 3, "m": np.ones(2, np.float32), "v": ms.Tensor(np.full(2, 2.0, np.float32)),
             "bf": ms.Tensor(np.ones(2, np.float32)).astype(ms.bfloat16), "name": "adamw"}
    arrays, scalars = state_arrays(state)
    assert scalars == {"step": 3, "name": "adamw"}
    assert sorted(arrays) == ["bf", "m", "v"]
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    np.testing.assert_array_equal(arrays["v"], [2.0, 2.0])
    assert arrays["bf"].dtype == np.float32
