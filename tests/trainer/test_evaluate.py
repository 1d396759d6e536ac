"""Held-out evaluation: equal to a numpy reference, deterministic, without side effects on
training; its rows in metrics.jsonl, the step line and the summary; TensorBoard read back."""
import io
import json
import os

import numpy as np
import pytest

from mindformers_core.config import load_config
from mindformers_core.trainer import Trainer
from mindformers_core.trainer.evaluate import eval_positions, evaluate
from tb_events import read_events


def text_cfg(out, steps=4, **sections):
    data = {
        "training": {"steps": steps, "local_batch_size": 2, "global_batch_size": 4, "seed": 3,
                     "eval_interval": 2, "eval_steps": 3},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 3e-3, "warmup_steps": 0},
        "model": {"vocab_size": 256, "hidden_size": 16, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 16},
        "train_dataset": {"type": "PydocText", "validation_split": 0.02},
        "checkpoint": {"enable_save": False},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return load_config(data)


def rows(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return [json.loads(x) for x in fh]


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_eval_loss_equals_a_numpy_cross_entropy_of_the_same_samples(tmp_path):
    t = Trainer(text_cfg(tmp_path), str(tmp_path), stream=io.StringIO())
    held = t.progress.held_out
    res = evaluate(t.model, held, 3, 2, t.parallel)
    total, count = 0.0, 0.0
    import mindspore as ms
    for j in range(3):
        b = held.samples(held.sampler.sample_indices(eval_positions(j, 2, 0, 1)))
        logp = _log_softmax(t.model.logits(ms.Tensor(b["input_ids"])).asnumpy().astype(np.float64))
        nll = -np.take_along_axis(logp, b["labels"][..., None].astype(np.int64), -1)[..., 0]
        total += float((nll * b["loss_mask"]).sum())
        count += float(b["loss_mask"].sum())
    assert res.tokens == count == 3 * 2 * 16
    assert res.loss == pytest.approx(total / count, rel=1e-5)
    assert res.perplexity == pytest.approx(np.exp(total / count), rel=1e-5)
    assert evaluate(t.model, held, 3, 2, t.parallel).loss == res.loss  # same samples
    # positions: contiguous per rank, the ranks of one batch side by side
    assert eval_positions(1, 2, 1, 2).tolist() == [6, 7]


def test_evaluation_does_not_change_training_and_lands_in_rows_line_and_summary(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    out = io.StringIO()
    Trainer(text_cfg(a, steps=5), str(a), stream=out).train()
    # the same run with evaluation only at the end: identical training numbers
    Trainer(text_cfg(b, steps=5, training={"eval_interval": None}), str(b),
            stream=io.StringIO()).train()
    ra, rb = rows(a), rows(b)
    assert [(x["loss"], x["grad_norm"]) for x in ra] == [(x["loss"], x["grad_norm"]) for x in rb]
    evals = {x["step"]: x["eval_loss"] for x in ra if "eval_ppl" in x}
    assert sorted(evals) == [2, 4, 5] and sorted(x["step"] for x in rb if "eval_ppl" in x) == [5]
    assert rb[-1]["eval_loss"] == ra[-1]["eval_loss"]
    row = ra[3]
    assert row["eval_loss"] == evals[4] and row["eval_ppl"] == pytest.approx(np.exp(evals[4]))
    assert ra[2]["eval_loss"] == evals[2] and "eval_ppl" not in ra[2]   # latest value carried
    assert all(k in row for k in ("mfu", "rss_mb", "eta_s"))
    text = out.getvalue()
    assert f"eval at step 4: held-out loss {evals[4]:.4f}" in text
    assert f"eval_loss: {evals[5]:.4f}" in text.splitlines()[[i for i, l in enumerate(
        text.splitlines()) if l.startswith("{ step: [5/5]")][0]]
    assert f"held-out loss: first {evals[2]:.4f} (step 2) -> last {evals[5]:.4f} (step 5)" in text
    assert "parameters       : " in text and "non-embedding" in text
    assert text.count(os.path.join(str(a), "metrics.jsonl")) == 2   # listed at start and end


def test_log_interval_thins_the_step_lines_not_the_rows(tmp_path):
    out = io.StringIO()
    Trainer(text_cfg(tmp_path, steps=5, training={"log_interval": 2}), str(tmp_path),
            stream=out).train()
    lines = [l for l in out.getvalue().splitlines() if l.startswith("{ step:")]
    assert [l.split("]")[0] for l in lines] == ["{ step: [2/5", "{ step: [4/5", "{ step: [5/5"]
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4, 5]


def test_eval_dataset_section_is_evaluated(tmp_path):
    cfg = text_cfg(tmp_path, steps=2, train_dataset={"validation_split": 0.0},
                   eval_dataset={"type": "SyntheticMarkov"}, training={"eval_interval": 1})
    t = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    assert t.progress.held_out.kind == "SyntheticMarkov"
    t.train()
    # eval_steps 3 global batches of 4 samples of 16 tokens
    assert [r["eval_tokens"] for r in rows(tmp_path)] == [3 * 4 * 16] * 2


def test_eval_reads_global_batches_whatever_the_micro_batch_split(tmp_path):
    """eval_steps counts global batches: 2 micro-batches of 2 read the samples of 1 of 4."""
    t = Trainer(text_cfg(tmp_path), str(tmp_path), stream=io.StringIO())
    held = t.progress.held_out
    split = evaluate(t.model, held, 3, 2, t.parallel, micro_batches=2)
    whole = evaluate(t.model, held, 3, 4, t.parallel)
    assert split.tokens == whole.tokens == 3 * 4 * 16
    assert split.loss == pytest.approx(whole.loss, rel=1e-6)
    assert evaluate(t.model, held, 3, 2, t.parallel).loss != pytest.approx(whole.loss, rel=1e-6)


def test_greedy_sample_is_printed_at_the_end(tmp_path):
    out = io.StringIO()
    t = Trainer(text_cfg(tmp_path, steps=1, logging={"sample_prompt": "The with",
                                                     "sample_max_new_tokens": 5}),
                str(tmp_path), stream=out)
    t.train()
    from mindformers_core.models.generation import generate
    want = t.progress.tokenizer.decode(generate(t.model, t.progress.tokenizer.encode("The with"),
                                                5))
    assert f"sample (greedy, 5 tokens):\nThe with{want}\n" in out.getvalue()


def test_tensorboard_holds_the_same_scalars_as_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra (tensorboardX) is absent")
    Trainer(text_cfg(tmp_path, steps=3, logging={"tensorboard": True}), str(tmp_path),
            stream=io.StringIO()).train()
    events = read_events(os.path.join(str(tmp_path), "tensorboard"))
    r = rows(tmp_path)
    for key in ("loss", "lr", "grad_norm", "eval_loss", "tokens_per_s"):
        want = [(x["step"], x[key]) for x in r if key in x]
        got = events[key]
        assert [s for s, _ in got] == [s for s, _ in want], key
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6)
    assert [s for s, _ in events["eval_ppl"]] == [2, 3] and "lrs/0" in events


def test_held_out_batches_without_loss_tokens_are_an_error(tmp_path):
    """A held-out file of end-of-document ids only, under eod_mask_loss: nothing to count."""
    from mindformers_core.data.builder import TrainDataset
    from mindformers_core.data.token_file import TokenFile
    t = Trainer(text_cfg(tmp_path), str(tmp_path), stream=io.StringIO())
    np.zeros(200, np.uint16).tofile(tmp_path / "eod.bin")
    held = TrainDataset(TokenFile(str(tmp_path / "eod.bin"), 16, "uint16"), 16, 256, seed=0,
                        eod_mask_id=0)
    with pytest.raises(ValueError, match="the held-out batches have no loss tokens"):
        evaluate(t.model, held, 1, 2, t.parallel)
