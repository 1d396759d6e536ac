"""tools/plot_metrics: the curve data of a metrics.jsonl and the PNG."""
import json

import pytest

from mindformers_core.tools import plot_metrics as P


def _write(path):
    rows = [{"step": 1, "loss": 5.0, "lr": 0.0}, {"step": 2, "loss": 4.0, "lr": 1e-3,
                                                  "eval_loss": 4.5, "eval_ppl": 90.0,
                                                  "eval_tokens": 64},
            {"step": 3, "loss": 3.0, "lr": 1e-3, "eval_loss": 4.5}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"step\": 4, \"lo",
                    encoding="utf-8")


def test_read_metrics_separates_training_and_evaluation_rows(tmp_path):
    _write(tmp_path / "m.jsonl")
    d = P.read_metrics(str(tmp_path / "m.jsonl"))
    assert d["step"] == [1, 2, 3] and d["loss"] == [5.0, 4.0, 3.0]
    assert d["eval_step"] == [2] and d["eval_loss"] == [4.5]     # carried values are not evals
    assert P.moving_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_png_is_written_and_errors_exit_2(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _write(tmp_path / "m.jsonl")
    out = tmp_path / "c.png"
    assert P.main([str(tmp_path / "m.jsonl"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "e.jsonl").write_text("", encoding="utf-8")
    assert P.main([str(tmp_path / "e.jsonl"), "--out", str(out)]) == 2
    assert "has no training rows" in capsys.readouterr().err
    assert P.main([str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
