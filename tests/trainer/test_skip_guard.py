"""Every kind of skipped update counts toward training.max_consecutive_skipped_steps."""
import io
import json
import os

import pytest

from mindformers_core.trainer import Trainer, run_training
from tests.trainer.tiny_run import tiny_run_cfg


def cfg(steps=4, training=None, optimizer=None, model=None):
    return tiny_run_cfg(steps, training=training, optimizer=optimizer, model=model)


GUARD = {"use_skip_step_on_nan": True, "max_consecutive_skipped_steps": 2}


def test_threshold_skips_reach_the_guard(tmp_path):
    """The reproducer: 0 of 4 updates applied and exit 0."""
    c = cfg(training=GUARD, optimizer={"grad_norm_skip_threshold": 1e-9})
    with pytest.raises(RuntimeError, match=r"^\[SkipStepOnNaN\] The global gradient norm has been "
                                           r"above optimizer.grad_norm_skip_threshold=1e-09 for 2 "
                                           r"consecutive steps, which reaches training.max_"
                                           r"consecutive_skipped_steps=2\."):
        Trainer(c, str(tmp_path / "a"), stream=io.StringIO()).train()
    out = io.StringIO()
    assert run_training(c, str(tmp_path / "b"), stream=out) == 1
    assert "ERROR: [SkipStepOnNaN]" in out.getvalue()
    with open(os.path.join(str(tmp_path / "b"), "metrics.jsonl")) as fh:
        assert len([json.loads(x) for x in fh]) == 1    # step 2 raised before its row


def test_overflow_skips_reach_the_guard(tmp_path):
    # fp16 grads overflow at a 2**60 scale; hysteresis keeps it there long enough
    c = cfg(training=GUARD, model={"params_dtype": "float16", "compute_dtype": "float16"},
            optimizer={"initial_loss_scale": 2.0 ** 60, "hysteresis": 1})
    with pytest.raises(RuntimeError, match=r"has been overflowing the loss scale for 2 "
                                           r"consecutive steps"):
        Trainer(c, str(tmp_path), stream=io.StringIO()).train()


# ------------------------------------------------------------------------------ loss scale bound
@pytest.mark.parametrize("opt,model,message", [
    ({"loss_scale": 1e38}, {}, r"^optimizer.loss_scale: must be <= 1.84467e\+19 for compute_dtype "
                              r"float32 .*1/scale is no longer a normal float32"),
    ({"initial_loss_scale": 1e30}, {"params_dtype": "float16", "compute_dtype": "float16"},
     r"^optimizer.initial_loss_scale: must be <= 1.84467e\+19"),
    ({"loss_scale": 131072.0}, {"params_dtype": "float16", "compute_dtype": "float16"},
     r"^optimizer.loss_scale: must be <= 65504 for compute_dtype float16 \(the largest finite "
     r"float16\), got 131072"),
])
def test_loss_scale_is_bounded_by_the_dtype(tmp_path, opt, model, message):
    from mindformers_core.config import ConfigError
    from mindformers_core.tools.doctor import check_loss_scale
    c = cfg(optimizer=opt, model=model)
    with pytest.raises(ConfigError, match=message):
        Trainer(c, str(tmp_path), stream=io.StringIO())
    assert check_loss_scale(c).status == "FAIL"


def test_loss_scale_bound_keeps_the_usual_scales():
    import numpy as np
    from mindformers_core.optim.loss_scale_bound import (MAX_FP16_SCALE, MAX_FP32_SCALE,
                                                         loss_scale_problem)
    assert MAX_FP16_SCALE == float(np.finfo(np.float16).max)
    # the inverse of the largest allowed scale is a normal float32, that of 1e38 is not
    assert np.float32(1.0 / MAX_FP32_SCALE) >= np.finfo(np.float32).tiny
    assert np.float32(1.0 / 1e38) < np.finfo(np.float32).tiny
    for opt, model in (({"loss_scale": 1024.0}, {}), ({}, {}),
                       ({"loss_scale": 4096.0}, {"params_dtype": "float16",
                                                 "compute_dtype": "float16"})):
        c = cfg(optimizer=opt, model=model)
        assert loss_scale_problem(c.optimizer, c.model) is None
