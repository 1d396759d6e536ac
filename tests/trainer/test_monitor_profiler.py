"""monitor: records in metrics.jsonl against direct forward/backward passes; profiler: MindSpore's
profiler writes its trace for the configured window under the output dir; context settings."""
import glob
import io
import json
import os

import mindspore as ms
import numpy as np
import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.context import ContextConfig
from mindformers_core.trainer import Trainer
from mindformers_core.trainer.context import apply_context, context_settings
from mindformers_core.trainer.monitor import select_names


def cfg_with(**sections):
    data = {
        "training": {"steps": 2, "local_batch_size": 2, "global_batch_size": 4, "seed": 3},
        "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "weight_decay": 0.0},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1.e-3,
                         "warmup_steps": 0},
        "model": {"model_type": "gpt", "vocab_size": 32, "hidden_size": 16, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 8},
        "train_dataset": {"type": "SyntheticMarkov", "loss_mask_mode": "random_prefix"},
    }
    data.update(sections)
    return load_config(data)


def rows(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return [json.loads(x) for x in fh]


def test_select_names():
    names = ["embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight",
             "output_layer.weight"]
    assert select_names(names, None) == [] and select_names(names, []) == [0, 1, 2]
    assert select_names(names, ["embedding"]) == [0]
    assert select_names(names, ["*.weight"]) == [0, 1, 2]
    assert select_names(names, ["decoder.*", "output_layer*"]) == [1, 2]


def test_monitor_records_match_direct_passes(tmp_path):
    cfg = cfg_with(monitor={"train_state": {"local_loss": True, "device_loss": True,
                                            "local_norm": "embedding", "device_norm": True}})
    t = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    batches = t.fetch_micro_batches(t.num_micro_batches())
    assert len(batches) == 2
    tokens = [float(np.asarray(b["loss_mask"]).sum()) for b in batches]
    emb = [p for p in t.model.trainable_params() if "embedding" in p.name]
    assert len(emb) == 1
    want_loss, want_norm = [], []
    for b in batches:
        ids, lab = ms.Tensor(b["input_ids"], ms.int32), ms.Tensor(b["labels"], ms.int32)
        mask = ms.Tensor(np.asarray(b["loss_mask"], np.float32))

        def loss_fn(i, l, m):
            return t.model(i, l, m)[0] / sum(tokens)
        (g,) = ms.grad(loss_fn, grad_position=None, weights=emb)(ids, lab, mask)
        want_loss.append(float(t.model(ids, lab, mask)[0].asnumpy()) / float(mask.sum().asnumpy()))
        want_norm.append(float(np.linalg.norm(g.asnumpy().astype(np.float64))))
    t.train()
    row = rows(tmp_path)[0]
    np.testing.assert_allclose(row["local_loss"], want_loss, rtol=1e-5)
    assert [list(d) for d in row["local_norm"]] == [[emb[0].name]] * 2
    np.testing.assert_allclose([d[emb[0].name] for d in row["local_norm"]], want_norm, rtol=1e-4)
    # one process: this rank's loss is the step's, and the per-parameter norms compose the
    # global gradient norm (before clipping)
    assert row["device_loss"] == pytest.approx(row["loss"], rel=1e-6)
    total = np.sqrt(sum(v * v for v in row["device_norm"].values()))
    assert total == pytest.approx(row["grad_norm"], rel=1e-5)
    assert len(row["device_norm"]) == len(t.optimizer.parameters)
    assert len(rows(tmp_path)) == 2 and "local_loss" in rows(tmp_path)[1]


def test_no_monitor_keys_without_monitor(tmp_path):
    t = Trainer(cfg_with(), str(tmp_path), stream=io.StringIO())
    t.train()
    assert not {"local_loss", "device_loss", "local_norm", "device_norm"} & set(rows(tmp_path)[0])


@pytest.mark.slow
def test_profiler_writes_the_window_under_the_output_dir(tmp_path):
    cfg = cfg_with(training={"steps": 3, "local_batch_size": 2, "global_batch_size": 2,
                             "seed": 3},
                   profiler={"enable_profiling": True, "start_step": 2, "end_step": 2,
                             "output_path": "prof", "with_stack": False})
    t = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    t.train()
    runs = glob.glob(os.path.join(str(tmp_path), "prof", "*_ascend_ms"))
    assert len(runs) == 1
    detail = glob.glob(os.path.join(runs[0], "FRAMEWORK", "cpu_op_detail_info_*.csv"))
    assert detail and os.path.getsize(detail[0]) > 0
    assert len(rows(tmp_path)) == 3


def test_profiler_off_for_other_ranks(tmp_path):
    cfg = cfg_with(profiler={"enable_profiling": True, "profiler_rank": [1]})
    t = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    assert not t.profiler.active
    t.train()
    assert not os.path.exists(os.path.join(str(tmp_path), "profile"))


def test_context_settings():
    def ctx(**kw):
        return ContextConfig.from_dict(kw, "context")
    assert context_settings(ctx(), "CPU") == {}
    assert context_settings(ctx(device_target="Ascend"), "CPU") == {
        "device_target": "Ascend", "max_device_memory": "59GB"}
    assert context_settings(ctx(max_device_memory="8GB", deterministic="ON"), "Ascend") == {
        "max_device_memory": "8GB", "deterministic": "ON"}
    assert context_settings(ctx(device_target="CPU", max_device_memory="8GB"), "CPU") == {
        "device_target": "CPU"}


def test_apply_context_on_cpu():
    cfg = cfg_with(context={"device_target": "CPU", "deterministic": "ON"})
    assert apply_context(cfg) == {"device_target": "CPU", "deterministic": "ON"}
    assert ms.get_context("device_target") == "CPU"
    assert ms.get_context("deterministic") == "ON"


def test_context_deterministic_contradiction():
    with pytest.raises(ConfigError, match=r"^context\.deterministic: 'OFF' contradicts "
                                          r"training\.deterministic: True"):
        cfg_with(training={"steps": 2, "local_batch_size": 2, "global_batch_size": 4,
                           "deterministic": True}, context={"deterministic": "OFF"})
