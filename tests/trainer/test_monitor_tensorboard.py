"""Upstream's ``monitor.tensorboard`` keys (both spellings) write the same TensorBoard event
files as ``logging.tensorboard: True`` (read back with tb_events, independently of the writer)."""
import io
import os

import numpy as np
import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.trainer import Trainer
from tb_events import read_events

pytest.importorskip("tensorboardX", reason="the tensorboard extra (tensorboardX) is absent")


def cfg(**sections):
    data = {"training": {"steps": 4, "local_batch_size": 2, "global_batch_size": 2, "seed": 5},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 3e-3,
                             "warmup_steps": 1},
            "model": {"vocab_size": 32, "hidden_size": 16, "num_layers": 1,
                      "num_attention_heads": 2, "seq_length": 8},
            "checkpoint": {"enable_save": False}}
    data.update(sections)
    return load_config(data)


def train(config, out):
    Trainer(config, str(out), stream=io.StringIO()).train()


@pytest.fixture(scope="module")
def logging_events(tmp_path_factory):
    out = tmp_path_factory.mktemp("logging")
    train(cfg(logging={"tensorboard": True}), out)
    return read_events(os.path.join(str(out), "tensorboard"))


#: scalars that are timings or process readings: they differ run to run, only their steps match
TIMINGS = ("tokens_per_s", "step_time_s", "mfu", "rss_mb", "eta_s", "device_mem_mb")


def _assert_same(got, want, steps=None):
    """The same tags; each at the same steps (those in ``steps`` only, when given) and, but
    for the timings, with the same values."""
    assert sorted(got) == sorted(want)
    for tag, series in want.items():
        kept = [(s, v) for s, v in series if steps is None or s in steps]
        assert [s for s, _ in got[tag]] == [s for s, _ in kept], tag
        if tag not in TIMINGS:
            np.testing.assert_allclose([v for _, v in got[tag]], [v for _, v in kept],
                                       rtol=1e-6, err_msg=tag)


@pytest.mark.parametrize("spelling", [{"output_dir": "tb_monitor"},
                                      {"tensorboard_dir": "tb_monitor"}],
                         ids=["master", "r1.9"])
def test_monitor_tensorboard_writes_the_logging_events(tmp_path, logging_events, spelling):
    train(cfg(monitor={"tensorboard": spelling}), tmp_path)
    events = read_events(os.path.join(str(tmp_path), "tb_monitor"))
    assert {"loss", "lr", "grad_norm"} <= set(events)
    _assert_same(events, logging_events)
    assert not os.path.exists(os.path.join(str(tmp_path), "tensorboard"))


def test_monitor_tensorboard_log_interval_and_absolute_dir(tmp_path, logging_events):
    logdir = str(tmp_path / "abs_tb")
    train(cfg(monitor={"tensorboard": {"tensorboard_dir": logdir, "tensorboard_log_interval": 2,
                                       "tensorboard_queue_size": 3}}), tmp_path / "run")
    _assert_same(read_events(logdir), logging_events, steps={2, 4})


def test_both_spellings_of_tensorboard_output_must_agree():
    assert cfg(logging={"tensorboard": True},
               monitor={"tensorboard": {"output_dir": "tensorboard"}}).tensorboard_target() \
        .logdir == "tensorboard"
    with pytest.raises(ConfigError, match=r"^logging\.tensorboard: True writes "
                                          r"<output_dir>/tensorboard, but monitor\.tensorboard\."
                                          r"output_dir asks for 'elsewhere': write one of the two"):
        cfg(logging={"tensorboard": True}, monitor={"tensorboard": {"output_dir": "elsewhere"}})
    assert cfg().tensorboard_target() is None
