"""Sharded checkpoints to one file and back.

    python -m mindformers_core.tools.convert_checkpoint merge --input CKPT --output one.safetensors
    python -m mindformers_core.tools.convert_checkpoint merge --input CKPT --output w.safetensors \\
        --weights-only
    python -m mindformers_core.tools.convert_checkpoint split --input one.safetensors \\
        --layout layout.json --output DIR

``CKPT`` is a checkpoint file (the index of a sharded one, or a single-process one) or a
directory (its newest complete checkpoint). ``merge`` writes a single-process checkpoint
(``checkpoint/store.py``: resumable on one process) or, with ``--weights-only``, the model
weights under their parameter names as ``tools/convert_weights.py`` reads them. ``split``
writes the sharded checkpoint (``checkpoint/sharded.py``) of the layout in
``layout.json``::

    {"world": 2,
     "mesh": {"tp": 2},                      # make_mesh(world, tp, cp, pp, ep) gives each
                                             # rank's index along every group ...
     "coords": [{"tp": 0}, {"tp": 1}],       # ... or give them per rank
     "specs": {"layers.0.w": {"full_shape": [64, 32], "split_dim": 0, "group": "tp",
                              "num_shards": 2}},  # optional "blocks": [48, 8, 8],
                                             # the q | k | v rows of a fused weight
     "names": [[...], [...]],                # optional: the parameters each rank holds (pp)
     "zero_shards": 1,                       # optional: ZeRO-1 shards of the optimizer state
     "fsdp_rows": {"num_shards": 2},         # optional: tp x FSDP, the weights kept as dp
                                             # rows of each tp slice ("group": "dp" or
                                             # "dp_cp"; "names": which, default the trained)
     "remove_redundancy": false}             # optional: true writes each piece once
                                             # (checkpoint.remove_redundancy)

An existing output file is never replaced unless ``--overwrite`` is given, and a file of the
input checkpoint (its index or one of its rank files) is never written, even with it.

Exit codes: 0 done, 1 unusable checkpoint (``CheckpointError``), 2 bad arguments or layout
(an existing output without ``--overwrite``, an output that is one of the input's files).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import List, Optional

import numpy as np

__all__ = ["parse_layout", "parse_fsdp_rows", "layout_remove_redundancy", "merge", "split", "main",
           "OutputRefused"]


class OutputRefused(ValueError):
    """An output path the converter will not write (exit 2)."""


def _input_files(data) -> List[str]:
    """The files a loaded checkpoint was read from (an index: with its rank files)."""
    from ..checkpoint.sharded import shard_files_of
    return [data.path] + shard_files_of(data.path)


def _check_outputs(outputs: List[str], inputs: List[str], overwrite: bool, flag: str) -> None:
    """Refuse to write over an input file ever, or over an existing file without
    ``overwrite`` (:class:`OutputRefused` naming the file)."""
    ins = {os.path.realpath(p) for p in inputs}
    for out in outputs:
        if os.path.realpath(out) in ins:
            raise OutputRefused(f"{flag} {out} is a file of the input checkpoint; refusing to "
                                "write over it (choose another output path)")
    existing = [out for out in outputs if os.path.exists(out)]
    if existing and not overwrite:
        raise OutputRefused(f"{flag}: {existing[0]} already exists"
                            + (f" (and {len(existing) - 1} more output file(s))"
                               if len(existing) > 1 else "")
                            + "; refusing to replace it. Choose another output path or pass "
                            "--overwrite")


def parse_layout(spec: dict):
    """``(specs, [RankLayout])`` of a layout.json object (``ValueError`` naming the field)."""
    from ..core.parallel_dims import make_mesh
    from ..distributed.shard_spec import ShardSpec
    from ..checkpoint.sharded import RankLayout
    if not isinstance(spec, dict) or not isinstance(spec.get("world"), int) or spec["world"] < 1:
        raise ValueError("layout: 'world' must be a positive integer")
    world = spec["world"]
    if "coords" in spec:
        coords = spec["coords"]
        if not isinstance(coords, list) or len(coords) != world:
            raise ValueError(f"layout: 'coords' must list {world} objects, one per rank")
    else:
        mesh = make_mesh(world, **spec.get("mesh", {}))
        coords = [mesh.coords(r) for r in range(world)]
    names = spec.get("names")
    if names is not None and (not isinstance(names, list) or len(names) != world):
        raise ValueError(f"layout: 'names' must list {world} lists of parameter names")
    specs = {}
    for name, s in spec.get("specs", {}).items():
        try:
            specs[name] = ShardSpec(tuple(s["full_shape"]), s.get("split_dim"), s.get("group"),
                                    int(s.get("num_shards", 1)), s.get("blocks"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"layout: specs.{name}: {exc}") from None
    zero = int(spec.get("zero_shards", 1))
    rows = parse_fsdp_rows(spec.get("fsdp_rows"))
    return specs, [RankLayout(dict(c), names[r] if names else None, zero, rows)
                   for r, c in enumerate(coords)]


def parse_fsdp_rows(value):
    """The layout's ``fsdp_rows`` (``checkpoint.sharded.RowLayout``; None when absent)."""
    from ..checkpoint.sharded import RowLayout
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"num_shards", "group", "names"}:
        raise ValueError("layout: 'fsdp_rows' must be an object with 'num_shards' and "
                         f"optional 'group', 'names', got {value!r}")
    shards = value.get("num_shards")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ValueError(f"layout: fsdp_rows.num_shards must be a positive integer, "
                         f"got {shards!r}")
    group = value.get("group", "dp")
    if group not in ("dp", "dp_cp"):
        raise ValueError(f"layout: fsdp_rows.group must be 'dp' or 'dp_cp', got {group!r}")
    names = value.get("names")
    if names is not None and (not isinstance(names, list)
                              or not all(isinstance(n, str) for n in names)):
        raise ValueError("layout: fsdp_rows.names must be a list of parameter names")
    return RowLayout(shards, group, None if names is None else tuple(names))


def layout_remove_redundancy(spec: dict) -> bool:
    """The layout's ``remove_redundancy`` (default False, as upstream's)."""
    value = spec.get("remove_redundancy", False)
    if not isinstance(value, bool):
        raise ValueError(f"layout: 'remove_redundancy' must be true or false, got {value!r}")
    return value


def merge(src: str, output: str, weights_only: bool = False, overwrite: bool = False) -> str:
    """One file from the checkpoint at ``src`` (module docstring)."""
    from ..checkpoint.store import FORMAT, resolve_checkpoint
    from ..checkpoint.file_io import encode, run_metadata, write_atomic
    data = resolve_checkpoint(src)
    _check_outputs([output], _input_files(data), overwrite, "--output")
    directory, name = os.path.split(os.path.abspath(output))
    if weights_only:
        from safetensors.numpy import save_file
        from ..checkpoint.foreign import WEIGHTS_FORMAT
        os.makedirs(directory, exist_ok=True)
        save_file({k[len("model."):]: np.ascontiguousarray(v) for k, v in data.tensors.items()
                   if k.startswith("model.")}, output, metadata={"format": WEIGHTS_FORMAT})
        return output
    meta = run_metadata(FORMAT, data.step, data.state, data.config, data.dtypes, data.run_id,
                        data.lineage)
    return write_atomic(directory, name, encode(data.tensors, meta))


def split(src: str, layout: dict, output_dir: str, prefix: Optional[str] = None,
          overwrite: bool = False) -> str:
    """The sharded checkpoint of ``layout`` from the checkpoint at ``src``; the index path."""
    from ..checkpoint.store import checkpoint_name, resolve_checkpoint
    from ..checkpoint.sharded import split_checkpoint
    specs, ranks = parse_layout(layout)
    remove_redundancy = layout_remove_redundancy(layout)
    data = resolve_checkpoint(src)
    if prefix is None:   # the input's own ({prefix}_stepNNNNNNNN.safetensors), else the config's
        match = re.match(r"^(.+)_step\d{8,}\.safetensors$", os.path.basename(data.path))
        prefix = match.group(1) if match else \
            (data.config.get("checkpoint") or {}).get("prefix") or "mindformers_core"
    from ..checkpoint.sharded import rank_file_name
    index = checkpoint_name(prefix, data.step)
    outputs = [os.path.join(output_dir, n) for n in
               [index] + [rank_file_name(index, r, len(ranks)) for r in range(len(ranks))]]
    _check_outputs(outputs, _input_files(data), overwrite, "--output")
    return split_checkpoint(data, output_dir, index, specs, ranks, remove_redundancy)


def main(argv: Optional[List[str]] = None) -> int:
    from ..checkpoint.store import CheckpointError
    parser = argparse.ArgumentParser(prog="convert_checkpoint", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="a (sharded) checkpoint into one safetensors file")
    m.add_argument("--input", required=True, help="checkpoint file or directory")
    m.add_argument("--output", required=True, help="safetensors file")
    m.add_argument("--weights-only", action="store_true",
                   help="only the model weights, named as tools/convert_weights.py reads them")
    m.add_argument("--overwrite", action="store_true",
                   help="replace an existing --output (never a file of the input)")
    s = sub.add_parser("split", help="a checkpoint into the rank files of a layout")
    s.add_argument("--input", required=True, help="checkpoint file or directory")
    s.add_argument("--layout", required=True, help="layout JSON file (see the module docstring)")
    s.add_argument("--output", required=True, help="directory for the rank files and index")
    s.add_argument("--prefix", default=None,
                   help="file prefix (default: the input file's)")
    s.add_argument("--overwrite", action="store_true",
                   help="replace existing output files (never a file of the input)")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            path = merge(args.input, args.output, args.weights_only, args.overwrite)
        else:
            try:
                with open(args.layout, encoding="utf-8") as fh:
                    layout = json.load(fh)
                path = split(args.input, layout, args.output, args.prefix, args.overwrite)
            except OutputRefused:
                raise
            except (OSError, ValueError) as exc:
                print(f"error: --layout {args.layout}: {exc}", file=sys.stderr)
                return 2
    except OutputRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
