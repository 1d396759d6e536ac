"""The model's side of context parallel on one process (models/cp_model.py): a rank's chunks
of the tokens and of the RoPE tables are the rows of its global positions, and the parts the
MoE aux loss leaves on each cp rank sum to the whole sequences' loss (the msrun runs:
test_cp_train_msrun.py)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import cp_layout
from mindformers_core.models import router as rt
from mindformers_core.models.cp_model import SequenceChunks
from mindformers_core.models.layers import attention_tables
from mindformers_core.models.precision import Precision


@pytest.mark.parametrize("cp", [2, 4])
def test_chunks_hold_the_rows_of_their_global_positions(cp):
    b, s = 2, 16
    ids = np.arange(b * s, dtype=np.int32).reshape(b, s)
    full = attention_tables(b, s, 4, 2, 8, 10000.0, Precision(ms.float32, ms.float32))
    for rank in range(cp):
        chunks = SequenceChunks(cp, rank)
        pos = cp_layout.local_positions(s, cp, rank)
        np.testing.assert_array_equal(chunks.take(Tensor(ids)).asnumpy(), ids[:, pos])
        local = chunks.tables(full)
        for got, want in zip(local[:4], full[:4]):
            np.testing.assert_array_equal(got.asnumpy(), want.asnumpy()[:, :, pos])
        assert local[5].shape == (b, 4, s // cp, s // cp)


@pytest.mark.parametrize("kind", ["seq_aux_loss", "aux_loss"])
@pytest.mark.parametrize("cp", [2, 4])
def test_aux_loss_parts_sum_over_the_cp_ranks_to_the_full_loss(kind, cp):
    b, s, e, k = 2, 16, 4, 2
    rng = np.random.default_rng(0)
    scores = rng.random((b, s, e)).astype(np.float32)
    idx = np.argsort(-scores, -1)[..., :k]
    counts = np.zeros((b, e), np.float32)
    for bi in range(b):
        np.add.at(counts[bi], idx[bi].reshape(-1), 1.0)
    full = rt.aux_loss(Tensor(scores.reshape(b * s, e)), Tensor(counts), b, s, k, kind, 1e-2)
    parts = []
    for rank in range(cp):
        pos = cp_layout.local_positions(s, cp, rank)
        local = Tensor(np.ascontiguousarray(scores[:, pos]).reshape(-1, e))
        # the MoE's part (models/moe.py): counts summed over cp, the loss / cp**2
        parts.append(float(rt.aux_loss(local, Tensor(counts), b, s // cp, k, kind,
                                       1e-2).asnumpy()) / cp ** 2)
    assert abs(sum(parts) - float(full.asnumpy())) < 1e-6 * abs(float(full.asnumpy())) + 1e-9
