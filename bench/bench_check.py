"""Start-up time of ``run_mindformer.py --check`` (a fresh interpreter per run, as a user runs it).

For each config: the median wall time of ``--repeats`` runs of
``python run_mindformer.py --config X --mode 1 --check``, next to a bare ``python -c pass`` run
side by side in the same loop (the interpreter's own start-up) and the in-process
``load_config`` time. Also records whether ``--check`` imported MindSpore (it must not: a
``--check`` is meant to be instant on a login node).

    python bench/bench_check.py [--repeats 7] [--quick]

Prints a table; writes output/bench/check.json (untracked;
bench/results/check.json with ``--save``, or ``--out PATH``).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.output import add_output_args, output_path, write_json  # noqa: E402

CONFIGS = ["configs/quickstart.yaml", "configs/muon_deepseek_v3_tiny.yaml",
           "configs/npu/deepseek_v3_muon.yaml"]
_PROBE = ("import sys, run_mindformer; code = run_mindformer.main(sys.argv[1:]); "
          "print('MINDSPORE_IMPORTED=' + str('mindspore' in sys.modules)); sys.exit(code)")


def _check_args(path: str) -> list:
    """--check of ``path``; the NPU recipe's dataset is not on a development machine, so it is
    measured with the built-in corpus."""
    from mindformers_core.tools.data_check import missing_data_overrides
    return (["--config", path, "--mode", "1", "--check"]
            + missing_data_overrides(os.path.join(ROOT, path), ROOT))


def _wall(cmd, ok=(0,)) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return dt


def bench_config(path: str, repeats: int) -> dict:
    check = [sys.executable, "run_mindformer.py"] + _check_args(path)
    bare = [sys.executable, "-c", "pass"]
    t_check, t_bare = [], []
    for _ in range(repeats):          # interleaved: both see the same machine load
        # exit 1: the memory planner's FAIL (a full-size config on one process) is a result
        t_check.append(_wall(check, ok=(0, 1)))
        t_bare.append(_wall(bare))
    probe = subprocess.run([sys.executable, "-c", _PROBE] + _check_args(path), cwd=ROOT,
                           capture_output=True, text=True)
    from mindformers_core.config import load_config
    loads = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        load_config(os.path.join(ROOT, path)).plan()
        loads.append(time.perf_counter() - t0)
    return {"config": path, "check_s": statistics.median(t_check),
            "python_startup_s": statistics.median(t_bare),
            "check_minus_startup_s": statistics.median(c - b for c, b in zip(t_check, t_bare)),
            "load_config_ms": 1e3 * statistics.median(loads),
            "imports_mindspore": "MINDSPORE_IMPORTED=True" in probe.stdout}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    add_output_args(ap, "check")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    rows = [bench_config(c, repeats) for c in CONFIGS if os.path.exists(os.path.join(ROOT, c))]
    print(f"{'config':<38} {'--check s':>9} {'python s':>8} {'extra s':>7} {'load ms':>7} mindspore")
    for r in rows:
        print(f"{r['config']:<38} {r['check_s']:>9.3f} {r['python_startup_s']:>8.3f} "
              f"{r['check_minus_startup_s']:>7.3f} {r['load_config_ms']:>7.1f} "
              f"{'imported' if r['imports_mindspore'] else 'not imported'}")
    path = write_json(output_path(args, "check"),
                      {"benchmark": "check", "repeats": repeats,
                       "python": platform.python_version(), "machine": platform.machine(),
                       "cpus": os.cpu_count(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "results": rows})
    print(f"wrote {path}")
    return 1 if any(r["imports_mindspore"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
