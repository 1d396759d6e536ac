"""tools/plot_lr: text table at key steps, PNG with boundaries, CLI with --set overrides."""
import os

import pytest

from mindformers_core.core.lr import build_lr_scheduler
from mindformers_core.tools import plot_lr as P

YAML = """
training:
  steps: 200
optimizer:
  type: AdamW
lr_scheduler:
  type: WarmUpStableDecayLR
  learning_rate: 1e-3
  warmup_steps: 20
  decay_start_ratio: 0.8
  lr_end: 1e-5
"""


def _sched():
    return build_lr_scheduler({"type": "WarmUpStableDecayLR", "learning_rate": 1e-3,
                               "warmup_steps": 20, "decay_start_ratio": 0.8, "lr_end": 1e-5}, 200)


def test_key_steps_cover_boundaries():
    steps = P.key_steps(_sched(), 200)
    for s in (0, 19, 20, 159, 160, 180, 199, 200):
        assert s in steps
    assert steps == sorted(set(steps)) and max(steps) == 200


def test_text_table_rows():
    table = P.lr_table(_sched(), 200)
    lines = table.splitlines()
    assert lines[0] == "WarmUpStableDecayLR  total_steps=200  peak_lr=0.001"
    row20 = next(l for l in lines if l.split()[:1] == ["20"])
    assert row20.split() == ["20", "1.000000e-03", "warmup_end"]
    row180 = next(l for l in lines if l.split()[:1] == ["180"])
    assert float(row180.split()[1]) == pytest.approx(1e-3 - (1e-3 - 1e-5) * 0.5)
    assert next(l for l in lines if l.split()[:1] == ["200"]).split()[1:] == ["1.000000e-05",
                                                                             "decay_end"]


def test_png_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    out = P.plot_lr(_sched(), 200, str(tmp_path / "lr.png"))
    assert out.endswith("lr.png")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_text_fallback_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "_have_matplotlib", lambda: False)
    with pytest.warns(UserWarning, match=r"matplotlib is not installed.*pip install -e '\.\[plot\]'"):
        out = P.plot_lr({"type": "cosine", "learning_rate": 1e-3, "warmup_steps": 5}, 50,
                        str(tmp_path / "lr.png"))
    assert out == str(tmp_path / "lr.txt")
    assert open(out).read().startswith("CosineWithWarmUpLR  total_steps=50")


def test_bare_section_needs_total_steps():
    with pytest.raises(Exception, match=r"^training\.steps: total_steps is required"):
        P.schedule_from({"type": "cosine"}, None)


def test_full_config_dict_supplies_total_steps():
    sched, steps = P.schedule_from({"training": {"steps": 40},
                                    "lr_scheduler": {"type": "linear", "warmup_steps": 4}})
    assert steps == 40 and sched.lr_at(40) == 0.0


def test_run_config_with_overrides_supplies_the_schedule(tmp_path):
    from mindformers_core.config import load_config
    cfg = tmp_path / "x.yaml"
    cfg.write_text(YAML)
    data = load_config(str(cfg), overrides=["training.steps=400", "lr_scheduler.decay_style=cosine"])
    sched, steps = P.schedule_from(data)
    assert steps == 400 and sched.boundaries()["decay_start"] == 320
    assert sched.to_dict()["decay_style"] == "cosine"


def test_cli_text_and_error_exit(tmp_path, capsys):
    cfg = tmp_path / "x.yaml"
    cfg.write_text(YAML)
    out = tmp_path / "lr.txt"
    assert P.main(["--config", str(cfg), "--out", str(out), "--text",
                   "--set", "training.steps=100"]) == 0
    printed = capsys.readouterr().out
    assert "WarmUpStableDecayLR  total_steps=100" in printed and os.path.exists(out)
    assert P.main(["--config", str(cfg), "--out", str(out),
                   "--set", "lr_scheduler.warmup_steps=-1"]) == 2
    assert "lr_scheduler.warmup_steps: must be an int >= 0, got -1" in capsys.readouterr().err


def test_missing_matplotlib_says_how_to_install_the_plot_extra(tmp_path):
    """Without matplotlib --plot-lr writes a .txt; it says so and names the extra."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys; sys.modules['matplotlib'] = None; "   # import matplotlib -> ImportError
            "sys.argv = ['run_mindformer.py', '--config', 'configs/quickstart.yaml', '--mode', "
            f"'1', '--plot-lr', {str(tmp_path / 'lr.png')!r}]; "
            "import runpy; runpy.run_path('run_mindformer.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=root))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "lr.txt").exists() and not (tmp_path / "lr.png").exists()
    assert "warning: matplotlib is not installed, so" in r.stderr
    assert "pip install -e '.[plot]'" in r.stderr
