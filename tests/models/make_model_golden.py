"""Writes ``tests/fixtures/model_golden.npz``: logits, loss, aux loss, max attention logits and
the gradient of every parameter of the tiny test models, computed by the model implementation
of commit a990ae6 (before the hot-path rewrite of issue 22: interleaved SwiGLU views, swapaxes
scores, broadcast masks / RoPE / RMSNorm). ``test_model_golden.py`` holds every later
implementation to those numbers (rel 1e-6, float32).

    PYTHONPATH=$PWD python tests/models/make_model_golden.py   # only to regenerate on purpose
"""
import os
import sys

import numpy as np
import mindspore as ms

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mindformers_core.models import build_model  # noqa: E402
from model_test_utils import CONFIGS, T, batch  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(HERE), "fixtures", "model_golden.npz")


def compute(name: str, jit: str = "none") -> dict:
    """The golden quantities of config ``name`` (seed 7, batch 3 x 8) as float32 arrays, with
    the model run under ``training.jit`` mode ``jit``."""
    cfg = CONFIGS[name]()
    model = build_model(cfg, seed=7)
    model.set_jit(jit)
    ids, labels, mask = batch(cfg, b=3, s=8, seed=7)
    out = {"logits": model.logits(T(ids)).asnumpy()}
    model.reset_max_attention_logits()

    def fn(a, b, c):
        loss, n, aux = model(a, b, c)
        return loss / n + aux, loss, aux

    params = model.trainable_params()
    (_, loss, aux), grads = ms.value_and_grad(fn, None, params, has_aux=True)(
        T(ids), T(labels), T(mask))
    out["loss"] = loss.asnumpy()
    out["aux"] = aux.asnumpy()
    out["max_logits"] = model.get_max_attention_logits()
    for p, g in zip(params, grads):
        out[f"grad.{p.name}"] = g.asnumpy()
    return out


def main():
    arrays = {}
    for name in CONFIGS:
        arrays.update({f"{name}/{k}": v for k, v in compute(name).items()})
    np.savez_compressed(GOLDEN, **arrays)
    print(f"wrote {GOLDEN} ({len(arrays)} arrays)")


if __name__ == "__main__":
    main()
