"""The optimizer bench runs end to end on a tiny size and writes its JSON."""
import json

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
