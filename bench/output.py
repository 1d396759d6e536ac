"""Where a bench script writes its JSON result, shared by every ``bench/bench_*.py``.

By default ``output/bench/<name>.json`` (untracked: running a benchmark leaves the repository
unchanged); ``--save`` writes the tracked record ``bench/results/<name>.json`` that the docs
quote; ``--out PATH`` writes PATH and wins over both. ``python -m bench`` (bench/run_all.py)
passes ``--out`` into its own results directory, which is one of the same two directories.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVED_DIR = os.path.join(ROOT, "bench", "results")      # tracked: written with --save only
SCRATCH_DIR = os.path.join(ROOT, "output", "bench")     # untracked (.gitignore: output/)


def add_output_args(parser: argparse.ArgumentParser, name: str) -> None:
    """Add ``--save`` and ``--out`` for the result file of bench ``name``."""
    parser.add_argument("--save", action="store_true",
                        help=f"write the tracked bench/results/{name}.json (default: "
                             f"output/bench/{name}.json, untracked)")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="write the JSON result here (overrides --save)")


def output_path(args: argparse.Namespace, name: str) -> str:
    """The result file: ``--out``, else bench/results/ with ``--save``, else output/bench/."""
    if args.out:
        return os.path.abspath(args.out)
    return os.path.join(SAVED_DIR if args.save else SCRATCH_DIR, f"{name}.json")


def write_json(path: str, data, indent: Optional[int] = 2) -> str:
    """Write ``data`` as JSON to ``path`` (creating its directory) and return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=indent)
    return path
