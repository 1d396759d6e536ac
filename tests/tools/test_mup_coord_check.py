"""muP coordinate check: flat under muP, drifting under SP (the muP claim), and the CLI."""
import pytest

from mindformers_core.config import load_config
from mindformers_core.tools.mup_coord_check import (format_coord_table, main,
                                                    plot_coord_check, run_coord_check,
                                                    train_and_measure, width_model_config)

CFG = {
    "training": {"steps": 10, "local_batch_size": 4, "global_batch_size": 4, "seed": 0},
    "optimizer": {"type": "AdamW", "weight_decay": 0.0},
    "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-2},
    "model": {"vocab_size": 32, "hidden_size": 16, "num_layers": 2, "num_attention_heads": 1,
              "seq_length": 16},
    "train_dataset": {"type": "SyntheticMarkov", "markov_order": 1},
}


@pytest.fixture(scope="module")
def sweep():
    return run_coord_check(load_config(CFG), widths=[16, 32, 64, 128], steps=4)


@pytest.mark.slow
def test_mup_is_flat_and_sp_drifts_over_an_8x_width_sweep(sweep):
    """Seed 003: muP curves within 2x across 8x width, SP drifts several-fold (> 4x)."""
    assert sweep.widths[-1] / sweep.widths[0] == 8
    assert sweep.layers == ["embedding", "layer0", "layer1", "logits"]
    assert sweep.max_drift("mup") < 2.0, format_coord_table(sweep)
    assert sweep.max_drift("sp") > 4.0, format_coord_table(sweep)
    # the SP drift is growth with width in the residual stream (Adam update ~ lr * fan_in)
    sp = [sweep.acts["sp"][w]["layer1"] for w in sweep.widths]
    assert sp == sorted(sp)
    # at the base width the two parameterisations are the same model and the same run
    assert sweep.acts["sp"][16] == sweep.acts["mup"][16]


@pytest.mark.slow
def test_table_and_text_fallback(sweep, tmp_path):
    table = format_coord_table(sweep)
    assert "max/min" in table and "largest drift over the 8x width sweep" in table
    path = plot_coord_check(sweep, str(tmp_path / "coord.txt"))
    assert path.endswith("coord.txt")
    assert (tmp_path / "coord.txt").read_text() == table


@pytest.mark.slow
def test_png_plot(sweep, tmp_path):
    pytest.importorskip("matplotlib")
    path = plot_coord_check(sweep, str(tmp_path / "coord.png"))
    assert (tmp_path / "coord.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.endswith(".png")


def test_mup_arm_is_the_path_of_a_run_with_optimizer_mup():
    """The muP arm = build_model(mup_width_mult=w) (readout 1/w, hidden init / sqrt(w)) +
    build_optimizer on a config with optimizer.mup, i.e. what the trainer does; no rescaled
    output layer on the side."""
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.data import build_dataset
    from mindformers_core.models import build_model
    from mindformers_core.optim import build_optimizer

    cfg = load_config(CFG)
    ds = build_dataset(cfg.train_dataset, cfg.model, seed=0)
    batches = [ds.next_batch(4) for _ in range(2)]
    acts, loss = train_and_measure(cfg, 64, 16, "mup", batches, 1e-2, 0)

    run_cfg = load_config({**CFG, "model": {**CFG["model"], "hidden_size": 64,
                                            "num_attention_heads": 4},
                           "optimizer": {**CFG["optimizer"], "mup": {"base_hidden_size": 16}}})
    model = build_model(run_cfg.model, seed=0, mup_width_mult=4.0)
    assert model.readout_multiplier == 0.25
    opt = build_optimizer(run_cfg.optimizer, model)
    grad_fn = ms.value_and_grad(lambda i, l, m: (lambda s, n, a: s / n + a)(*model(i, l, m)),
                                grad_position=None, weights=list(opt.parameters))
    for b in batches:
        value, grads = grad_fn(Tensor(b["input_ids"]), Tensor(b["labels"]), Tensor(b["loss_mask"]))
        opt.set_lr(1e-2)
        opt.step(grads)
    assert loss == pytest.approx(float(value.asnumpy()), rel=1e-6)
    logits = model.logits(Tensor(batches[0]["input_ids"])).asnumpy()
    assert acts["logits"] == pytest.approx(float(abs(logits.astype("float64")).mean()), rel=1e-5)


def test_width_model_config_keeps_head_dim_and_scales_ffn():
    cfg = load_config({**CFG, "model": {**CFG["model"], "ffn_hidden_size": 48,
                                        "tie_word_embeddings": True}}).model
    wide = width_model_config(cfg, 128)
    assert (wide.hidden_size, wide.num_attention_heads, wide.ffn_hidden_size) == (128, 8, 384)
    assert wide.tie_word_embeddings is False
    mla = width_model_config(load_config({**CFG, "model": {"model_type": "deepseek_v3"}}).model,
                             128)
    assert (mla.num_attention_heads, mla.kv_lora_rank, mla.q_lora_rank) == (8, 64, 64)
    with pytest.raises(ValueError, match="cannot keep its head dim"):
        width_model_config(cfg, 24)


def test_errors():
    cfg = load_config(CFG)
    with pytest.raises(ValueError, match="need at least two widths"):
        run_coord_check(cfg, [32])
    with pytest.raises(ValueError, match="steps must be >= 1"):
        run_coord_check(cfg, [32, 64], steps=0)


def test_cli_writes_table_and_plot(tmp_path, capsys):
    import yaml
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(CFG))
    out = tmp_path / "coord.txt"
    assert main(["--config", str(path), "--widths", "16", "32", "--steps", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mean |activation| after training" in text and f"wrote {out}" in text
    assert main(["--config", str(path), "--widths", "32", "40", "--out", str(out)]) == 2
    assert "cannot keep its head dim" in capsys.readouterr().err
