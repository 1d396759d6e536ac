"""Pure parts of the trainer: batch ramp, config diff, metrics rows/lines, train state."""
import io
import json
import math

import pytest

from mindformers_core.trainer.config_diff import config_changes, flatten_config
from mindformers_core.trainer.metrics import (MetricsWriter, StepMetrics, format_step_line,
                                              truncate_jsonl)
from mindformers_core.trainer.rampup import build_batch_ramp
from mindformers_core.checkpoint.train_state import TrainState


def test_batch_ramp_follows_megatron_rule():
    # start 4, +4 every 96/((16-4)/4) = 32 samples, up to 16
    ramp = build_batch_ramp([4, 4, 96], global_batch_size=16, local_batch_size=2, data_parallel=1)
    assert ramp.samples_per_increment == 32
    assert [ramp.global_batch(c) for c in (0, 31, 32, 63, 64, 95, 96, 97, 1000)] == \
        [4, 4, 8, 8, 12, 12, 16, 16, 16]
    assert ramp.num_micro_batches(0) == 2 and ramp.num_micro_batches(64) == 6
    # walk the ramp as the trainer does: consumed += batch each step
    consumed, sizes = 0, []
    for _ in range(12):
        b = ramp.global_batch(consumed)
        sizes.append(b)
        consumed += b
    assert sizes == [4] * 8 + [8] * 4   # 8 steps of 4 = 32 samples, then batch 8
    assert build_batch_ramp(None, 16, 2, 1) is None


def test_batch_ramp_errors():
    with pytest.raises(ValueError, match=r"expected global batch size \(8\) to be greater than "
                                         r"or equal to start batch size \(16\)"):
        build_batch_ramp([16, 4, 10], 8, 2, 1)
    with pytest.raises(ValueError, match=r"global batch size interval \(12\) to be divisible by "
                                         r"global batch size increment \(5\)"):
        build_batch_ramp([4, 5, 10], 16, 2, 1)
    with pytest.raises(ValueError, match=r"current global batch size \(6\) is not divisible by "
                                         r"micro-batch-size \(4\) times data parallel size \(1\)"):
        build_batch_ramp([4, 2, 10], 8, 4, 1)


def test_config_changes_field_by_field():
    saved = {"training": {"steps": 20, "seed": 1}, "optimizer": {"betas": [0.9, 0.95]},
             "checkpoint": {"load_path": None}}
    now = {"training": {"steps": 40, "seed": 1, "stop_at_step": 5},
           "optimizer": {"betas": [0.9, 0.99], "eps": 1e-8}, "checkpoint": {"load_path": "x"}}
    assert config_changes(saved, now) == [
        "optimizer.betas: [0.9, 0.95] -> [0.9, 0.99]",
        "optimizer.eps: (absent) -> 1e-08",
        "training.steps: 20 -> 40",
    ]
    assert flatten_config({"a": {"b": {"c": 1}}}) == {"a.b.c": 1}


def _m(step, **kw):
    base = dict(step=step, total_steps=20, loss=2.5, lr=1e-3, lrs=[1e-3, 2e-3], grad_norm=0.5,
                tokens_per_s=1000.0, step_time_s=0.25, consumed_samples=8 * step,
                global_batch_size=8)
    base.update(kw)
    return StepMetrics(**base)


def test_metrics_row_and_line():
    row = _m(3, excess_loss=0.5, clipped=True).row()
    assert row["step"] == 3 and isinstance(row["step"], int)
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "excess_loss"):
        assert key in row
    assert row["lrs"] == [1e-3, 2e-3] and row["clipped"] is True
    nan_row = _m(4, grad_norm=math.nan, skipped=True).row()
    assert nan_row["grad_norm"] is None and "excess_loss" not in nan_row
    json.dumps(nan_row, allow_nan=False)
    line = format_step_line(_m(3, clipped=True, excess_loss=0.5))
    assert line.startswith("{ step: [ 3/20], loss: 2.500000, excess: 0.5000, lr: 1.000000e-03, "
                           "grad_norm: 0.500000 (clipped)")
    assert "(skipped)" in format_step_line(_m(3, skipped=True))


def test_metrics_writer_jsonl_resume_truncates(tmp_path):
    out = io.StringIO()
    w = MetricsWriter(str(tmp_path), stream=out)
    w.open()
    for s in range(1, 6):
        w.log(_m(s), 100)
    w.close()
    assert len(out.getvalue().splitlines()) == 5      # not a TTY: one line per step
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write('{"step": 6, "lo')                    # a row cut by a kill
    w2 = MetricsWriter(str(tmp_path), stream=io.StringIO())
    w2.open(resume_step=3)
    w2.log(_m(4, loss=1.0), 100)
    w2.close()
    rows = [json.loads(x) for x in open(path)]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["loss"] == 1.0
    truncate_jsonl(str(tmp_path / "missing.jsonl"), 1)   # no file: nothing to do


def test_progress_bar_on_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    w = MetricsWriter(None, stream=out, log_interval=2)
    w.log(_m(1), 10)
    w.log(_m(2), 10)
    text = out.getvalue()
    assert "\r[" in text and "1/20" in text
    assert text.count("\n") == 1 and "step: [ 2/20]" in text


def test_summary_and_state_round_trip():
    st = TrainState(step=5, applied_steps=4, consumed_samples=40, total_skipped=1)
    assert TrainState.from_dict(st.to_dict() | {"unknown": 3}) == st
    w = MetricsWriter(None, stream=io.StringIO())
    w.log(_m(1, loss=3.0), 10)
    w.log(_m(2, loss=2.0), 10)
    text = w.summary(st, entropy_floor=1.5, reason="finished")
    assert "training finished: 5 steps (4 applied, 1 skipped, 0 clipped)" in text
    assert "loss: first 3.0000 -> last 2.0000" in text
    assert "excess loss 1.5000 -> 0.5000" in text


def test_stop_request_turns_signals_into_a_flag_and_a_second_one_escapes():
    import os
    import signal
    from mindformers_core.trainer.signals import StopRequest
    before = signal.getsignal(signal.SIGINT)
    logged = []
    with StopRequest(log=logged.append) as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signum == signal.SIGINT
        assert "received SIGINT: finishing the current step" in logged[0]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)   # second Ctrl-C: default behaviour
    assert signal.getsignal(signal.SIGINT) is before
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is not stop._handle
