"""GlobalBatchSampler / TrainDataset: determinism, rank sharding, DP layout equivalence, resume."""
import numpy as np
import pytest

from mindformers_core.config.model import ModelConfig
from mindformers_core.data import GlobalBatchSampler, build_dataset

MODEL = ModelConfig(vocab_size=64, seq_length=8)


def _rows(batch):
    """Samples of a batch as hashable rows (input_ids + last label), for set comparisons."""
    full = np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1)
    return [tuple(r) for r in full]


def _step_rows(ds_by_rank, step, num_micro, local):
    rows = []
    for ds in ds_by_rank:
        for j in range(num_micro):
            rows += _rows(ds.micro_batch(step, j, num_micro, local))
    return rows


def _token_file(tmp_path, n_tokens=8 * 13 + 1):
    path = tmp_path / "tok.npy"
    np.save(path, (np.arange(n_tokens) * 7 % 64).astype(np.uint16))
    return str(path)


@pytest.mark.parametrize("num_samples,shuffle", [(None, True), (10, True), (10, False)])
def test_ranks_and_micro_batches_partition_the_global_batch(num_samples, shuffle):
    world, local, accum = 2, 3, 2
    g = world * local * accum
    samplers = [GlobalBatchSampler(num_samples, 5, shuffle, r, world) for r in range(world)]
    for step in range(4):
        got = np.concatenate([s.micro_indices(step * g, j, accum, local)
                              for s in samplers for j in range(accum)])
        want = samplers[0].sample_indices(np.arange(step * g, (step + 1) * g))
        assert sorted(got.tolist()) == sorted(want.tolist())
        r0 = samplers[0].micro_indices(step * g, 0, accum, local)
        r1 = samplers[1].micro_indices(step * g, 0, accum, local)
        if num_samples is None:          # an infinite stream never repeats a sample
            assert set(r0.tolist()).isdisjoint(r1.tolist())


def test_shuffled_epochs_are_permutations_and_differ():
    s = GlobalBatchSampler(10, seed=3, shuffle=True)
    e0, e1 = s.sample_indices(np.arange(10)), s.sample_indices(np.arange(10, 20))
    assert sorted(e0.tolist()) == list(range(10)) == sorted(e1.tolist())
    assert e0.tolist() != e1.tolist() and e0.tolist() != list(range(10))
    np.testing.assert_array_equal(GlobalBatchSampler(10, 3).sample_indices(np.arange(20)),
                                  np.concatenate([e0, e1]))
    assert GlobalBatchSampler(10, 3, shuffle=False).sample_indices(np.arange(12)).tolist() == \
        list(range(10)) + [0, 1]


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match=r"rank must be in \[0, world=2\), got 2"):
        GlobalBatchSampler(None, 0, rank=2, world=2)
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        GlobalBatchSampler(0, 0)
    s = GlobalBatchSampler(None, 0)
    with pytest.raises(ValueError, match=r"micro_index must be in \[0, 2\), got 2"):
        s.micro_positions(0, 2, 2, 1)
    with pytest.raises(ValueError, match="local_batch_size must be >= 1"):
        s.micro_positions(0, 0, 1, 0)


@pytest.mark.parametrize("source", ["SyntheticMarkov", "TokenFile"])
def test_dp_layout_equivalence(tmp_path, source):
    cfg = {"type": source}
    if source == "TokenFile":
        cfg["data_path"] = _token_file(tmp_path)
    dp2 = [build_dataset(cfg, MODEL, seed=9, rank=r, world=2) for r in range(2)]
    dp1 = [build_dataset(cfg, MODEL, seed=9)]
    for step in range(5):
        a = _step_rows(dp2, step, num_micro=1, local=2)
        b = _step_rows(dp1, step, num_micro=2, local=2)
        assert sorted(a) == sorted(b) and len(a) == 4
    assert dp2[0].consumed_samples == dp1[0].consumed_samples == 20


def test_same_seed_same_batches_other_seed_other_batches():
    a = build_dataset({}, MODEL, seed=1).micro_batch(2, 0, 1, 4)
    b = build_dataset({}, MODEL, seed=1).micro_batch(2, 0, 1, 4)
    c = build_dataset({}, MODEL, seed=2).micro_batch(2, 0, 1, 4)
    d = build_dataset({"seed": 1}, MODEL, seed=2).micro_batch(2, 0, 1, 4)  # dataset seed wins
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        np.testing.assert_array_equal(a[k], d[k])
    assert not np.array_equal(a["input_ids"], c["input_ids"])
    assert a["input_ids"].dtype == np.int32 and a["labels"].dtype == np.int32
    assert a["loss_mask"].dtype == np.float32 and a["input_ids"].shape == (4, 8)
    np.testing.assert_array_equal(a["input_ids"][:, 1:], a["labels"][:, :-1])


def test_rank_slices_are_disjoint():
    r0 = build_dataset({}, MODEL, seed=1, rank=0, world=2).micro_batch(0, 0, 1, 4)
    r1 = build_dataset({}, MODEL, seed=1, rank=1, world=2).micro_batch(0, 0, 1, 4)
    assert set(_rows(r0)).isdisjoint(_rows(r1))


@pytest.mark.parametrize("source", ["SyntheticMarkov", "TokenFile"])
def test_resume_equals_uninterrupted(tmp_path, source):
    cfg = {"type": source, "loss_mask_mode": "random_prefix"}
    if source == "TokenFile":
        cfg["data_path"] = _token_file(tmp_path)   # 13 samples: crosses epochs
    straight = build_dataset(cfg, MODEL, seed=4)
    want = [[straight.micro_batch(s, j, 2, 3) for j in range(2)] for s in range(6)]
    first = build_dataset(cfg, MODEL, seed=4)
    for s in range(3):
        for j in range(2):
            first.micro_batch(s, j, 2, 3)
    state = first.state_dict()
    assert state["consumed_samples"] == 18
    resumed = build_dataset(cfg, MODEL, seed=4)
    resumed.load_state_dict(state)
    for s in range(3, 6):
        start = resumed.consumed_samples       # trainer-style: start = consumed before the step
        for j in range(2):
            got = resumed.micro_batch(s, j, 2, 3, step_start=start)
            for k in got:
                np.testing.assert_array_equal(got[k], want[s][j][k])
    assert resumed.state_dict() == straight.state_dict()


def test_changing_global_batch_reads_a_contiguous_stream():
    ds = build_dataset({}, MODEL, seed=0)
    seen = []
    for local in (1, 2, 4):          # a batch ramp: global batch 1, 2, 4
        start = ds.consumed_samples
        seen += _rows(ds.micro_batch(0, 0, 1, local, step_start=start))
    assert ds.consumed_samples == 7
    assert seen == _rows(build_dataset({}, MODEL, seed=0).samples(np.arange(7)))
    nb = build_dataset({}, MODEL, seed=0)
    assert _rows(nb.next_batch(3)) + _rows(nb.next_batch(4)) == seen


def test_load_state_from_other_corpus_is_refused():
    ds = build_dataset({}, MODEL, seed=0)
    with pytest.raises(ValueError, match="saved with seed=1, this dataset has seed=0"):
        ds.load_state_dict({"consumed_samples": 4, "kind": "SyntheticMarkov", "seed": 1})
    with pytest.raises(ValueError, match="no 'consumed_samples'"):
        ds.load_state_dict({})


@pytest.mark.parametrize("num_samples", [None, 7])
def test_every_layout_of_one_global_batch_reads_the_same_set(num_samples):
    layouts = [(1, 12, 1), (2, 3, 2), (3, 2, 2), (4, 1, 3), (6, 2, 1), (12, 1, 1)]  # (dp, b, accum)
    per_layout = []
    for world, local, accum in layouts:
        samplers = [GlobalBatchSampler(num_samples, 1, True, r, world) for r in range(world)]
        steps = []
        for step in range(3):
            got = [int(i) for s in samplers for j in range(accum)
                   for i in s.micro_indices(step * 12, j, accum, local)]
            steps.append(sorted(got))
        per_layout.append(steps)
    assert all(p == per_layout[0] for p in per_layout)
    assert len(per_layout[0][0]) == 12
