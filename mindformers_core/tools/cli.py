"""Command-line pieces shared by the tools that run on a user's config (``--config``,
``--mode``, ``--set``), so each tool parses and loads a run config the same way as
``run_mindformer.py`` (same override syntax, same errors)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

__all__ = ["add_run_config_arguments", "refuse_graph_mode", "load_run_config", "parse_tool_args"]


def add_run_config_arguments(parser: argparse.ArgumentParser, mode: bool = True) -> None:
    """``--config`` (required), ``--mode`` (1 = PyNative) and repeatable ``--set KEY=VALUE``
    (stored as ``args.overrides``)."""
    parser.add_argument("--config", required=True, help="run config YAML")
    if mode:
        parser.add_argument("--mode", type=int, default=1, help="1 = PyNative (the only mode)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override a config value (parsed as YAML), e.g. training.steps=2000")


def refuse_graph_mode(args) -> Optional[int]:
    """Exit code 2 (after printing why) unless ``--mode`` is 1; None when it is."""
    if getattr(args, "mode", 1) != 1:
        print(f"error: --mode {args.mode}: only PyNative (--mode 1) is supported", file=sys.stderr)
        return 2
    return None


def load_run_config(args):
    """``load_config(args.config, overrides=args.overrides)`` (raises ConfigError)."""
    from ..config import load_config
    return load_config(args.config, overrides=list(args.overrides))


def parse_tool_args(parser: argparse.ArgumentParser, argv=None):
    """``(args, None)``, or ``(args, 2)`` after printing why when ``--mode`` is not 1."""
    args = parser.parse_args(argv)
    return args, refuse_graph_mode(args)
