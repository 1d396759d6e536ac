"""Model weights between this project's parameter names and upstream checkpoint layouts.

    python -m mindformers_core.tools.convert_weights --config run.yaml --from hf \\
        --input model.safetensors --output native.safetensors        # or --to hf / mindformers

``--input``: a safetensors file, a directory with ``model.safetensors.index.json``, a
MindFormers ``.ckpt`` or (``--from native``) a training checkpoint, file or directory: its model
weights are converted and its optimizer and RNG state dropped. The formats and their name
tables are ``checkpoint/weight_names.py``'s (one table per format, read in both directions).
The converted weights must fit the model ``--config`` builds: a missing or unexpected tensor,
or one whose shape differs, is refused (exit 2) naming the tensor and both shapes.

Exit codes: 0 written, 1 an unusable input file, 2 bad arguments, config or sizes.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

import numpy as np

from ..checkpoint.weight_names import FORMATS, from_native, to_native

__all__ = ["load_into_model", "model_tensors", "main"]

Weights = Dict[str, np.ndarray]


def model_tensors(model) -> Weights:
    """``{parameter name: float32 ndarray}`` of a model."""
    return {name: p.asnumpy() for name, p in model.parameters_and_names()}


def load_into_model(model, w: Weights) -> None:
    """Copy native-named tensors into ``model``; names and shapes must match exactly."""
    import mindspore as ms
    params = dict(model.parameters_and_names())
    missing, extra = sorted(set(params) - set(w)), sorted(set(w) - set(params))
    if missing or extra:
        raise KeyError(f"tensor names do not match the model: missing {missing[:5]}, "
                       f"unexpected {extra[:5]}")
    for name, p in params.items():
        if tuple(w[name].shape) != tuple(p.shape):
            raise ValueError(f"{name}: shape {tuple(w[name].shape)} != model {tuple(p.shape)}")
        p.set_data(ms.Tensor(np.asarray(w[name])).astype(p.dtype))


def _model_shapes(model_cfg) -> Dict[str, tuple]:
    """``{parameter name: shape}`` of the model ``model_cfg`` builds."""
    from ..models import build_model
    return {name: tuple(p.shape) for name, p in build_model(model_cfg).parameters_and_names()}


def weight_mismatch(w: Weights, shapes: Dict[str, tuple], source: str) -> Optional[str]:
    """Why native-named ``w`` (read from ``source``) does not fit a model of ``shapes``, or
    None: missing / unexpected names, or the first tensor whose shape differs."""
    missing, extra = sorted(set(shapes) - set(w)), sorted(set(w) - set(shapes))
    if missing or extra:
        return (f"{source} does not match the model of --config: missing {missing[:5]}, "
                f"unexpected {extra[:5]}")
    for name in sorted(shapes):
        if tuple(w[name].shape) != shapes[name]:
            return (f"tensor {name}: {source} has shape {tuple(w[name].shape)}, the model of "
                    f"--config has {shapes[name]}")
    return None


def read_native(path: str, src: str, model_cfg) -> Weights:
    """The model weights at ``path`` with this project's names: a training checkpoint's
    ``model.*`` tensors (its optimizer and RNG state dropped), or a weight file of format
    ``src`` (``checkpoint/foreign.py``). :class:`CheckpointError` for an unusable input,
    ``ValueError`` for a training checkpoint given with another ``--from``."""
    from ..checkpoint.foreign import detect_format, foreign_weights
    from ..checkpoint.store import resolve_checkpoint
    training = os.path.isdir(path) and detect_format(path) == "native" or \
        os.path.isfile(path) and is_training_checkpoint(path)
    if training:
        if src != "native":
            raise ValueError(f"--from {src}: {path} is a mindformers_core training checkpoint "
                             "(this project's names); use --from native")
        data = resolve_checkpoint(path)
    else:
        data = foreign_weights(path, src, model_cfg)
    return {k[len("model."):]: v for k, v in data.tensors.items() if k.startswith("model.")}


def is_training_checkpoint(path: str) -> bool:
    """A file with this project's training-checkpoint (or sharded index) format."""
    from ..checkpoint.file_io import read_header
    from ..checkpoint.sharded import INDEX_FORMAT
    from ..checkpoint.store import FORMAT
    try:
        fmt = read_header(path, os.path.getsize(path))["__metadata__"].get("format")
    except Exception:   # not safetensors at all (a .ckpt): not ours
        return False
    return fmt in (FORMAT, INDEX_FORMAT)


def main(argv: Optional[List[str]] = None) -> int:
    from safetensors.numpy import save_file
    from .cli import add_run_config_arguments, load_run_config
    from ..checkpoint.foreign import WEIGHTS_FORMAT
    from ..checkpoint.store import CheckpointError
    parser = argparse.ArgumentParser(prog="convert_weights", description=__doc__.split("\n")[0])
    add_run_config_arguments(parser)
    parser.add_argument("--from", dest="src", choices=FORMATS, default="native")
    parser.add_argument("--to", dest="dst", choices=FORMATS, default="native")
    parser.add_argument("--input", required=True,
                        help="safetensors file, a directory with model.safetensors.index.json, "
                             "a MindFormers .ckpt, or a training checkpoint (file or directory)")
    parser.add_argument("--output", required=True, help="safetensors file")
    parser.add_argument("--mindformers-unfused", action="store_true",
                        help="MindFormers mcore layout (separate MLA down projections)")
    args = parser.parse_args(argv)
    from ..config import ConfigError
    try:
        cfg = load_run_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    concat = not args.mindformers_unfused
    try:
        native = read_native(args.input, args.src, cfg.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if "cannot read it as" in str(exc) else 1
    problem = weight_mismatch(native, _model_shapes(cfg.model), args.input)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    meta = {"format": WEIGHTS_FORMAT} if args.dst == "native" else {"format": "pt"}
    save_file({k: np.ascontiguousarray(v) for k, v in
               from_native(native, args.dst, cfg.model, concat).items()}, args.output,
              metadata=meta)
    print(f"wrote {args.output} ({args.src} -> {args.dst}, {len(native)} model tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
