"""Every rewrite of the model's hot paths keeps the numerics of the original implementation:
logits, loss, aux loss, max attention logits and every parameter gradient of the tiny models
against ``tests/fixtures/model_golden.npz`` (written by ``make_model_golden.py`` from the
implementation before the rewrite), within rel 1e-6 of each tensor's largest magnitude."""
import numpy as np
import pytest

from make_model_golden import CONFIGS, GOLDEN, compute


def _close(got, want, what):
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    assert err <= 1e-6 * scale, f"{what}: max |diff| {err:.3g} > 1e-6 * {scale:.3g}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_original_implementation(name):
    golden = np.load(GOLDEN)
    want = {k.split("/", 1)[1]: golden[k] for k in golden.files if k.startswith(name + "/")}
    got = compute(name)
    assert sorted(got) == sorted(want)
    for key in sorted(want):
        assert got[key].shape == want[key].shape, key
        _close(got[key], want[key], f"{name} {key}")
