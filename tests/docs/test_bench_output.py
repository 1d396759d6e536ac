"""Where the bench scripts write their JSON (bench/output.py): untracked output/bench/ by
default, the tracked bench/results/ with --save, --out wins over both."""
import argparse
import glob
import json
import os

from bench import output, run_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse(argv):
    ap = argparse.ArgumentParser()
    output.add_output_args(ap, "lr")
    return ap.parse_args(argv)


def test_default_is_untracked_save_is_tracked_out_wins(tmp_path):
    assert output.output_path(_parse([]), "lr") == os.path.join(ROOT, "output", "bench", "lr.json")
    assert output.output_path(_parse(["--save"]), "lr") == \
        os.path.join(ROOT, "bench", "results", "lr.json")
    target = str(tmp_path / "x.json")
    assert output.output_path(_parse(["--out", target]), "lr") == target
    assert output.output_path(_parse(["--save", "--out", target]), "lr") == target
    # python -m bench routes every script into the same two directories
    assert (run_all.SCRATCH_RESULTS, run_all.SAVED_RESULTS) == (output.SCRATCH_DIR, output.SAVED_DIR)


def test_write_json_creates_the_directory(tmp_path):
    path = str(tmp_path / "a" / "b.json")
    assert output.write_json(path, {"x": [1, 2]}) == path
    with open(path, encoding="utf-8") as fh:
        assert json.load(fh) == {"x": [1, 2]}


def test_every_bench_script_writes_through_the_helper():
    for script in glob.glob(os.path.join(ROOT, "bench", "bench_*.py")):
        with open(script, encoding="utf-8") as fh:
            src = fh.read()
        name = os.path.basename(script)[len("bench_"):-3]
        assert "add_output_args(" in src and "output_path(" in src, script
        assert f'"{name}")' in src, script   # the result is named after the script
        assert "json.dump(" not in src, script   # every JSON file goes through the helper
