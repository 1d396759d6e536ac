"""Gradient noise scale: the estimator against a closed form, and a smoke run on the model."""
import math

import numpy as np
import pytest

from mindformers_core.tools.noise_scale import (critical_batch_advice, estimate_noise_scale)


def linear_regression_grad_sq_norms(rng, w_minus_wstar, sigma, batch, draws):
    """|g_B|^2 for ``draws`` fresh batches of linear regression with Gaussian noise.

    Model y = x . w* + eps, x ~ N(0, I_d), eps ~ N(0, sigma^2); per-example loss
    l = (x . w - y)^2 / 2, gradient g = x (x . delta - eps) with delta = w - w*.
    """
    d = w_minus_wstar.size
    x = rng.standard_normal((draws, batch, d))
    eps = rng.standard_normal((draws, batch)) * sigma
    resid = x @ w_minus_wstar - eps                       # [draws, batch]
    g = (x * resid[..., None]).mean(axis=1)               # batch-mean gradient [draws, d]
    return (g * g).sum(axis=1)


def test_linear_regression_noise_scale_within_20_percent_of_closed_form():
    """Closed form. With delta = w - w*, x ~ N(0, I_d) and eps ~ N(0, sigma^2):

        G = E[x x^T] delta = delta                         -> |G|^2 = |delta|^2
        E[g g^T] = E[x x^T (x.delta)^2] + sigma^2 I = |delta|^2 I + 2 delta delta^T + sigma^2 I
                   (Isserlis: E[x_i x_j x_k x_l] = d_ij d_kl + d_ik d_jl + d_il d_jk)
        Sigma = E[g g^T] - G G^T = (|delta|^2 + sigma^2) I + delta delta^T
        tr(Sigma) = d (|delta|^2 + sigma^2) + |delta|^2
        B_noise = tr(Sigma) / |G|^2 = d (1 + sigma^2 / |delta|^2) + 1

    d = 8, |delta| = 1, sigma = 1.5: B_noise = 8 * 3.25 + 1 = 27.
    """
    rng = np.random.default_rng(1234)
    d, sigma = 8, 1.5
    delta = rng.standard_normal(d)
    delta /= np.linalg.norm(delta)
    truth = d * (1 + sigma ** 2 / (delta @ delta)) + 1
    assert truth == pytest.approx(27.0)
    b_small, b_big, draws = 4, 64, 4000
    small = linear_regression_grad_sq_norms(rng, delta, sigma, b_small, draws)
    big = linear_regression_grad_sq_norms(rng, delta, sigma, b_big, draws)
    est = estimate_noise_scale(small, big, b_small, b_big)
    assert est.b_simple == pytest.approx(truth, rel=0.2)
    assert est.grad_sq_norm == pytest.approx(1.0, rel=0.2)
    assert est.trace_sigma == pytest.approx(d * (1 + sigma ** 2) + 1, rel=0.2)
    assert est.n_small == est.n_big == draws


def test_estimator_is_exact_on_exact_moments():
    # E|g_B|^2 = |G|^2 + tr/B with |G|^2 = 2, tr = 50: the solve must return them exactly
    est = estimate_noise_scale([2 + 50 / 5], [2 + 50 / 25, 2 + 50 / 25], 5, 25)
    assert est.grad_sq_norm == pytest.approx(2.0)
    assert est.trace_sigma == pytest.approx(50.0)
    assert est.b_simple == pytest.approx(25.0)


def test_moments_are_averaged_before_dividing():
    # mean of per-draw ratios would differ from the ratio of the averaged moments
    # per draw: (|G|^2, tr) = (2, 16) -> 8 and (2/3, 80/3) -> 40; mean of ratios 24
    est = estimate_noise_scale([10.0, 14.0], [4.0, 4.0], 2, 8)
    g, tr = (8 * 4.0 - 2 * 12.0) / 6, (12.0 - 4.0) / (1 / 2 - 1 / 8)
    assert est.grad_sq_norm == pytest.approx(g)
    assert est.b_simple == pytest.approx(tr / g) == pytest.approx(16.0)


@pytest.mark.parametrize("small,big,bs,bb,match", [
    ([1.0], [1.0], 8, 8, "0 < small < big"),
    ([1.0], [1.0], 0, 8, "0 < small < big"),
    ([], [1.0], 2, 8, "small_sq_norms: need at least one"),
    ([1.0], [float("nan")], 2, 8, "big_sq_norms: squared norms must be finite"),
    ([-1.0], [1.0], 2, 8, "small_sq_norms: squared norms must be finite and >= 0"),
])
def test_estimator_errors(small, big, bs, bb, match):
    with pytest.raises(ValueError, match=match):
        estimate_noise_scale(small, big, bs, bb)


def test_unresolved_gradient_gives_inf_and_says_so():
    est = estimate_noise_scale([10.0], [1.0], 2, 8)  # G^2 = (8 - 20)/6 < 0
    assert math.isinf(est.b_simple)
    assert "not resolved" in critical_batch_advice(est, 16)


@pytest.mark.parametrize("batch,phrase", [(4, "well below B_noise"), (400, "well above"),
                                          (100, "near B_noise")])
def test_critical_batch_advice(batch, phrase):
    est = estimate_noise_scale([2 + 200 / 5], [2 + 200 / 25], 5, 25)   # B_noise = 100
    text = critical_batch_advice(est, batch, seq_length=32)
    assert phrase in text
    assert f"steps x{1 + 100 / batch:.2f}" in text
    assert "3,200 tokens" in text


def test_noise_scale_cli_smoke_on_the_model(tmp_path, capsys):
    """Integration: the real model and dataset, a couple of draws, B_noise printed."""
    from mindformers_core.tools.noise_scale import main
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "training: {steps: 10, local_batch_size: 2, global_batch_size: 4}\n"
        "optimizer: {type: AdamW}\n"
        "lr_scheduler: {type: ConstantWarmUpLR, learning_rate: 1.e-3}\n"
        "model: {vocab_size: 32, hidden_size: 32, num_layers: 1, num_attention_heads: 2,"
        " seq_length: 16}\n"
        "train_dataset: {type: SyntheticMarkov, markov_order: 1}\n")
    assert main(["--config", str(cfg), "--mode", "1", "--small", "2", "--big", "8",
                 "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "B_simple = tr(Sigma)/|G|^2" in out
    assert "tokens at seq_length 16" in out


def test_noise_scale_cli_errors(tmp_path, capsys):
    from mindformers_core.tools.noise_scale import main
    cfg = tmp_path / "run.yaml"
    cfg.write_text("training: {steps: 10}\noptimizer: {type: AdamW}\n"
                   "lr_scheduler: {type: ConstantWarmUpLR}\n")
    assert main(["--config", str(cfg), "--small", "8", "--big", "4"]) == 2
    assert "need 0 < --small < --big" in capsys.readouterr().err
    assert main(["--config", str(cfg), "--small", "2", "--big", "8",
                 "--set", "training.stepz=3"]) == 2
    assert "training.stepz" in capsys.readouterr().err


def _numbers(text):
    """The four measured quantities of the CLI's report."""
    import re
    pat = (r"mean \|g_b\|\^2 = (\S+)\s+mean \|g_B\|\^2 = (\S+)\n\s+\|G\|\^2 ~ (\S+)\s+"
           r"tr\(Sigma\) ~ (\S+)")
    return [float(x) for x in re.search(pat, text).groups()]


@pytest.mark.multiproc
@pytest.mark.slow
def test_data_parallel_form_equals_one_process(tmp_path, capsys):
    """Under msrun with 2 ranks, per-rank norms (small) and the all-reduced gradient (big) give
    the same moments as one process playing both ranks: the ranks' shards of each draw are the
    samples one process reads in turn."""
    import os
    import socket
    import subprocess
    from mindformers_core.tools.noise_scale import main
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "training: {steps: 10, local_batch_size: 2, global_batch_size: 4}\n"
        "optimizer: {type: AdamW}\n"
        "lr_scheduler: {type: ConstantWarmUpLR, learning_rate: 1.e-3}\n"
        "model: {vocab_size: 32, hidden_size: 32, num_layers: 1, num_attention_heads: 2,"
        " seq_length: 16}\n"
        "train_dataset: {type: SyntheticMarkov, markov_order: 1}\n")
    args = ["--config", str(cfg), "--small", "2", "--big", "8", "--steps", "2"]
    assert main(args) == 0
    single = _numbers(capsys.readouterr().out)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = "python -m mindformers_core.tools.noise_scale " + " ".join(args)   # msrun form
    logs = tmp_path / "logs"
    proc = subprocess.run(["bash", os.path.join(root, "scripts", "msrun_launcher.sh"), cmd, "2",
                           str(port), str(logs), "True", "300"], cwd=root, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root})
    log = (logs / "worker_0.log").read_text()
    assert proc.returncode == 0, proc.stderr[-2000:] + log[-2000:]
    assert "data parallel=2" in log
    assert _numbers(log) == pytest.approx(single, rel=1e-4)


def test_load_model_weights_from_a_trainer_checkpoint(tmp_path, capsys):
    import yaml
    from mindformers_core.config import load_config
    from mindformers_core.models import build_model
    from mindformers_core.tools.noise_scale import load_model_weights, main
    from mindformers_core.checkpoint.store import CheckpointError, save_checkpoint
    text = ("training: {steps: 10, local_batch_size: 2, global_batch_size: 4}\n"
            "optimizer: {type: AdamW}\n"
            "lr_scheduler: {type: ConstantWarmUpLR, learning_rate: 1.e-3}\n"
            "model: {vocab_size: 32, hidden_size: 32, num_layers: 1, num_attention_heads: 2,"
            " seq_length: 16}\n")
    raw = yaml.safe_load(text)
    trained = build_model(load_config(raw).model, seed=7)
    tensors = {f"model.{p.name}": p.asnumpy() for p in trained.get_parameters()}
    save_checkpoint(str(tmp_path / "ck"), "run", 5, tensors, {}, {})
    model = build_model(load_config(raw).model, seed=0)
    assert load_model_weights(model, str(tmp_path / "ck")) == 5
    for a, b in zip(model.get_parameters(), trained.get_parameters()):
        assert (a.asnumpy() == b.asnumpy()).all()
    narrow = build_model(load_config({**raw, "model": {"hidden_size": 16,
                                                       "num_attention_heads": 1}}).model)
    with pytest.raises(CheckpointError, match="does not match the model"):
        load_model_weights(narrow, str(tmp_path / "ck"))
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert main(["--config", str(path), "--small", "2", "--big", "4", "--steps", "1",
                 "--load", str(tmp_path / "ck")]) == 0
    assert "at checkpoint step 5" in capsys.readouterr().out
    assert main(["--config", str(path), "--small", "2", "--big", "4", "--steps", "1",
                 "--load", str(tmp_path / "nothing")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
