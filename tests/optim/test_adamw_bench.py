"""The optimizer bench runs end to end on a tiny size and writes its JSON."""
import json

import numpy as np
import pytest

from bench import bench_optimizer


def test_bench_tiny(tmp_path):
    out = tmp_path / "optimizer.json"
    result = bench_optimizer.main(["--sizes", "16384", "--repeats", "1", "--bandwidth-mb", "16", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert {r["mode"] for r in saved["rows"]} == {"fp32", "bf16+master"}
    assert saved["bandwidth_GBps"] > 0 and result["rows"][0]["ours_ns_per_param"] > 0
    assert saved["state_bytes_per_param"] == {
        "fp32 params": 8.0, "bf16 params + fp32 masters": 12.0,
        "bf16 params + fp32 masters + bf16 m,v": 8.0, "bf16 params + remainders": 10.0,
        "bf16 params + remainders + bf16 m,v": 6.0}


def test_gpt_shapes_come_close_to_the_size():
    from bench.bench_adamw_torch import gpt_shapes
    for n in (1e7, 5e7):
        shapes = gpt_shapes(int(n))
        numel = sum(int(np.prod(s)) for s in shapes)
        assert abs(numel - n) / n < 0.1
        assert sum(1 for s in shapes if len(s) == 1) > 10   # norm vectors, as in a GPT


@pytest.mark.slow
def test_torch_comparison_runs_and_agrees(tmp_path):
    """Three worker processes (ours, torch fused, torch foreach) on a tiny GPT: the timed
    steps update the same values (so neither side times a no-op) and the JSON has the ratios."""
    pytest.importorskip("torch")
    from bench import bench_adamw_torch
    out = tmp_path / "adamw_torch.json"
    assert bench_adamw_torch.main(["--sizes", "2e5", "--rounds", "1", "--warmup", "1",
                                   "--out", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["threads"] == 1 and row["pynative_synchronize"]
    assert row["ratio_to_torch_fused"] > 0 and row["ratio_to_torch_foreach"] > 0
    assert row["max_rel_diff_to_torch_fused"] < 1e-5
    assert row["max_rel_diff_to_torch_foreach"] < 1e-5
