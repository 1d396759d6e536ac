"""The tiny DeepSeek-V3 preset as pretrained upstream: multi-token prediction, YaRN RoPE
scaling and recompute of all layers, 20 steps with Muon + QK-Clip. The loss falls, ``mtp_loss`` is logged (metrics.jsonl and
the step line), and a run stopped at step 10 and resumed is bit-exact."""
import io
import os

import numpy as np
import pytest

from mindformers_core.config import load_config
from mindformers_core.config.yaml_io import load_yaml_text
from mindformers_core.trainer import Trainer

from test_trainer import final_tensors, rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cfg(out, **training):
    with open(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")) as fh:
        data = load_yaml_text(fh.read())
    data["training"].update({"steps": 20, "deterministic": True, **training})
    data["model"].update({"num_nextn_predict_layers": 1, "mtp_loss_scaling_factor": 0.3,
                          "position_embedding_type": "yarn", "rotary_scaling_factor": 4.0,
                          "max_position_embeddings": 8, "mscale": 1.0, "mscale_all_dim": 1.0})
    data["recompute"] = {"mode": "full", "full_recompute_layer": "[0-1]"}   # every layer
    data["checkpoint"].update({"save_interleaved_steps": 10,
                               "save_path": os.path.join(str(out), "ckpt")})
    return load_config(data)


def _run(cfg, out):
    stream = io.StringIO()
    t = Trainer(cfg, str(out), stream=stream)
    # recompute of every decoder layer (and the MTP depth): the layers run as Cells
    assert cfg.recompute_layers() == list(range(cfg.model.num_layers)) == [0, 1]
    assert t.model.jit_mode == "none"
    t.train()
    return t, stream.getvalue()


@pytest.mark.slow
def test_mtp_yarn_trains_logs_mtp_loss_and_resumes_bit_exact(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    ta, log = _run(_cfg(a), a)
    ra = rows(a)
    assert len(ra) == 20
    assert np.mean([r["loss"] for r in ra[-5:]]) < np.mean([r["loss"] for r in ra[:3]]) - 0.2
    assert all(r["mtp_loss"] > 0 for r in ra) and all(r["aux_loss"] > 0 for r in ra)
    assert ra[-1]["mtp_loss"] < ra[0]["mtp_loss"]
    assert "mtp_loss: " in log
    assert any(k.startswith("model.mtp.layers.0.eh_proj") for k in final_tensors(ta))
    _run(_cfg(b, stop_at_step=10), b)
    cfg = _cfg(b)
    cfg.checkpoint.load_path = str(b / "ckpt")
    tc, _ = _run(cfg, b)
    rb = rows(b)
    # bit for bit, though the three runs share one process (the global norm's summation order
    # is fixed: optim/ordered_sum.py)
    assert [(r["loss"], r["mtp_loss"], r["grad_norm"]) for r in ra] == \
        [(r["loss"], r["mtp_loss"], r["grad_norm"]) for r in rb]
    fa, fc = final_tensors(ta), final_tensors(tc)
    assert sorted(fa) == sorted(fc)
    for k in fa:
        np.testing.assert_array_equal(fa[k], fc[k], err_msg=k)
