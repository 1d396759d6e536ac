"""MoE load statistics of a step (trainer/moe_metrics.py) on a real model, one process (the
sum over data-parallel ranks is tested with msrun in test_moe_dp_msrun.py)."""
import numpy as np
import pytest

from mindformers_core.models import build_model
from mindformers_core.trainer.grad_reducer import IdentityGradReducer
from mindformers_core.trainer.metrics import StepMetrics, format_step_line
from mindformers_core.trainer.moe_metrics import load_imbalance, log_due, moe_step_stats
from model_test_utils import T, batch, tiny_dsv3, tiny_gpt


def test_load_imbalance():
    assert load_imbalance([4, 4, 4, 4]) == 1.0
    assert load_imbalance([8, 0, 0, 0]) == 4.0
    assert load_imbalance([0, 0]) == 0.0


def test_log_due():
    assert [s for s in range(1, 26) if log_due(s, 10, 25)] == [10, 20, 25]


def test_step_stats_of_two_forwards_and_the_step_line():
    cfg = tiny_dsv3(num_layers=3, moe_aux_loss_coeff=0.1, moe_expert_capacity_factor=0.5)
    model = build_model(cfg, seed=0)
    ids, labels, mask = batch(cfg, b=2, s=6)
    model.reset_moe_stats()
    auxes = []
    for _ in range(2):                                     # two micro-batches
        model(T(ids), T(labels), T(mask))
        auxes.append({i: float(m.aux_sum.asnumpy()) for i, m in model.moe_layers().items()})
    stats = moe_step_stats(model, IdentityGradReducer(), due=True)
    assert sorted(stats.layers) == [1, 2]
    for i, layer in stats.layers.items():
        assert sum(layer.tokens_per_expert) == 2 * 2 * 6 * cfg.num_experts_per_tok
        load = np.array(layer.tokens_per_expert)
        assert layer.imbalance == pytest.approx(load.max() / load.mean())
        assert layer.aux_loss == pytest.approx(auxes[1][i] / 2)    # mean of the two forwards
        assert layer.dropped == model.moe_layers()[i].dropped > 0
    row = stats.row()
    assert row["max_imbalance"] == max(s.imbalance for s in stats.layers.values())
    assert row["dropped"] == sum(s.dropped for s in stats.layers.values())
    assert set(row["layers"]) == {"1", "2"}
    m = StepMetrics(step=1, total_steps=1, loss=1.0, lr=0.1, lrs=[0.1], grad_norm=1.0,
                    tokens_per_s=1.0, step_time_s=1.0, consumed_samples=4, global_batch_size=4,
                    moe=stats)
    assert m.row()["moe"] == row
    assert format_step_line(m).endswith(
        f"moe_imbalance: {row['max_imbalance']:.2f}, moe_dropped: {row['dropped']} }}")


def test_not_due_and_gpt_give_no_stats():
    cfg = tiny_dsv3()
    model = build_model(cfg, seed=0)
    ids, labels, mask = batch(cfg)
    model(T(ids), T(labels), T(mask))
    assert moe_step_stats(model, IdentityGradReducer(), due=False) is None
    assert moe_step_stats(model, IdentityGradReducer(), due=True) is not None
    assert moe_step_stats(build_model(tiny_gpt(), seed=0), IdentityGradReducer(), due=True) is None


def test_ep_rank_load_and_its_log_fields():
    from mindformers_core.trainer.moe_metrics import MoELayerStats, MoEStepStats, ep_rank_load
    assert ep_rank_load([3, 1, 4, 1, 5, 9], 2) == [8.0, 15.0]
    assert ep_rank_load([3, 1, 4, 1, 5, 9], 3) == [4.0, 5.0, 14.0]
    with pytest.raises(ValueError, match=r"^6 experts cannot be split over 4 expert-parallel "
                                         r"ranks$"):
        ep_rank_load(np.zeros(6), 4)
    layers = {1: MoELayerStats([3, 1, 4, 1], 1.6, None, 0, ep_rank_load([3, 1, 4, 1], 2)),
              2: MoELayerStats([2, 2, 2, 2], 1.0, None, 1, ep_rank_load([2, 2, 2, 2], 2))}
    stats = MoEStepStats(layers)
    assert stats.tokens_per_ep_rank == [8.0, 9.0]
    assert stats.row()["tokens_per_ep_rank"] == [8.0, 9.0]
    assert stats.row()["layers"]["1"]["tokens_per_ep_rank"] == [4.0, 5.0]
    assert stats.short() == "moe_imbalance: 1.60, moe_dropped: 1, moe_ep_rank_tokens: [8, 9]"
    plain = MoEStepStats({1: MoELayerStats([3, 1], 1.5, None, 0)})
    assert plain.tokens_per_ep_rank is None and "tokens_per_ep_rank" not in plain.row()
    assert "moe_ep_rank_tokens" not in plain.short()
