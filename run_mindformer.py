#!/usr/bin/env python
"""Command line entry point: validate a config (``--check``) or train.

    python run_mindformer.py --config run.yaml --mode 1 [--set training.steps=20 ...]
                             [--output_dir ./output] [--check [--json] [--strict]]
                             [--groups [--groups-out FILE]] [--plot-lr OUT.png]

Exit codes (:data:`CHECK_EXIT_CODES`, also in ``--help`` and the README): 0 valid, and it fits
(warnings allowed); 1 valid, but it will not fit or will not work (the memory planner's FAIL or a
launch-doctor FAIL; a WARN too with ``--strict``), or the run failed (``ERROR: ...`` on stderr);
2 invalid configuration or missing data file (one line ``error: field.path: message`` on stderr,
no traceback); otherwise the trainer's code. Only PyNative (``--mode 1``) is supported.
``--check`` never imports MindSpore.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from typing import List, Optional

EXIT_OK, EXIT_VERDICT, EXIT_CONFIG = 0, 1, 2
EXIT_SIGPIPE = 128 + 13   # what a process killed by SIGPIPE reports
#: what ``--check`` exits with (``--help`` prints it)
CHECK_EXIT_CODES = (
    f"--check exit codes: {EXIT_OK} valid, and it fits (warnings allowed); {EXIT_VERDICT} valid, "
    "but it will not fit or will not work (the memory planner's FAIL or a launch-doctor FAIL; "
    f"a WARN too with --strict); {EXIT_CONFIG} invalid (config error or missing data file)")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage errors use exit code 2 as well
        self.print_usage(sys.stderr)
        self.exit(EXIT_CONFIG, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="run_mindformer.py",
                description="MindSpore PyNative LLM pretraining (mindformers_core).",
                epilog=CHECK_EXIT_CODES)
    p.add_argument("--config", required=True, help="YAML run config")
    p.add_argument("--mode", required=True, type=int,
                   help="execution mode; 1 = PyNative (the only mode this trainer supports)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, value parsed as YAML (repeatable), "
                        "e.g. --set training.steps=20 --set optimizer.betas=[0.9,0.99]")
    p.add_argument("--output_dir", default="./output", help="run directory (metrics, checkpoints)")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in a directory holding another run's files: move them "
                        "into superseded/ (nothing is deleted)")
    p.add_argument("--check", action="store_true",
                   help="validate the config, print the resolved plan and the launch doctor's "
                        "verdicts and exit (exit codes below)")
    p.add_argument("--json", action="store_true", help="with --check: print the plan as JSON")
    p.add_argument("--strict", action="store_true",
                   help="with --check: also build the model for the doctor's group checks, and "
                        "exit 1 on WARN verdicts too (FAIL always exits 1)")
    p.add_argument("--groups", action="store_true",
                   help="with --check: build the model and print the parameter-group table")
    p.add_argument("--groups-out", dest="groups_out", default=None, metavar="FILE",
                   help="also write the parameter-group table to FILE")
    p.add_argument("--plot-lr", dest="plot_lr", default=None, metavar="OUT",
                   help="plot the learning-rate schedule to OUT and exit")
    from mindformers_core.tools.doctor import add_doctor_arguments
    add_doctor_arguments(p)
    return p


def _optional(module: str, name: str):
    """``module.name`` if that module exists, else None (tools land in other packages)."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise
    return getattr(mod, name, None)


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _check(cfg, args) -> int:
    """Validate, print the plan and the launch doctor's verdicts. The doctor's verdicts only
    change the exit code with ``--strict``; the model is built (MindSpore imported) only for
    ``--strict``/``--groups``, so a plain ``--check`` stays fast."""
    from mindformers_core.tools.doctor import (doctor_from_args, format_doctor_report,
                                               verdicts_to_json)
    from mindformers_core.core.memory_plan import plan_memory
    from mindformers_core.core.memory_verdict import format_memory_plan, memory_verdict
    from mindformers_core.tools.data_check import describe_data, describe_tokenizer
    from mindformers_core.config import ConfigError
    plan = cfg.plan()
    memory = plan_memory(cfg, plan.world_size)
    try:
        data = describe_data(cfg.train_dataset, cfg.model)
        if cfg.eval_dataset is not None:
            data += "\n" + describe_data(cfg.eval_dataset, cfg.model, "eval_dataset")
        tokenizer = describe_tokenizer(cfg)
        if tokenizer:
            data += "\n" + tokenizer
    except ConfigError as exc:
        # a missing or unusable data file is a config error (exit 2), unless the layout does
        # not fit the device at all: then the memory FAIL (exit 1) is the verdict to act on
        # first (a cluster recipe checked on a development machine), and the data error is
        # reported with it
        if memory_verdict(memory, cfg)[0] != "FAIL":
            raise
        data = f"data             : ERROR {exc}"
    verdicts = doctor_from_args(cfg, args, inspect_model=args.strict or args.groups)
    if args.json:
        out = {"plan": plan.to_dict(), "memory": memory.to_dict(), "config": cfg.to_dict(),
               "defaulted_sections": list(cfg.defaulted_sections()), "data": data,
               "verdicts": verdicts_to_json(verdicts)}
        print(json.dumps(out, indent=2, default=str))
    else:
        print(f"config OK: {args.config}")
        if cfg.defaulted_sections():
            print(cfg.format_defaulted_sections())
        print(plan.format())
        print(data)
        print(format_memory_plan(memory))
        if memory_verdict(memory, cfg)[0] == "FAIL" and memory.limit is not None:
            from mindformers_core.tools.plan_layout import fitting_summary
            print(fitting_summary(cfg, plan.world_size, memory.limit,   # the layout advisor
                                  source=args.config, overrides=args.overrides))
        print()
        print(format_doctor_report(cfg, verdicts))
    if args.groups:
        _print_groups(cfg, args.groups_out)
    failing = ("WARN", "FAIL") if args.strict else ("FAIL",)
    if any(v.status in failing for v in verdicts):
        return EXIT_VERDICT
    return EXIT_OK


def _print_groups(cfg, out_path: Optional[str]) -> None:
    from mindformers_core.models import build_model
    from mindformers_core.optim.param_groups import format_param_group_table, get_param_groups
    model = build_model(cfg.model)
    groups = get_param_groups(model, cfg.optimizer)
    table = format_param_group_table(groups)
    print(table)
    if out_path:
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(table + "\n")


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def main(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` and run; returns the exit code (see the module docstring)."""
    args = build_parser().parse_args(argv)
    previous = warnings.formatwarning
    warnings.formatwarning = _one_line_warning  # warnings reach the user as one line too
    try:
        return _run(args)
    except BrokenPipeError:
        # the reader went away (`--check | head`): stop quietly, as Unix tools do on SIGPIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_SIGPIPE
    finally:
        warnings.formatwarning = previous


def _run(args) -> int:
    if args.mode == 0:
        return _fail("--mode 0: graph mode is not supported by this trainer; "
                     "use --mode 1 (PyNative)", EXIT_CONFIG)
    if args.mode != 1:
        return _fail(f"--mode {args.mode}: unknown mode; use --mode 1 (PyNative)", EXIT_CONFIG)
    from mindformers_core.config import ConfigError, load_config
    try:
        cfg = load_config(args.config, overrides=args.overrides)
        if args.plot_lr:
            plot_lr = _optional("mindformers_core.tools.plot_lr", "plot_lr")
            if plot_lr is None:
                return _fail("--plot-lr needs mindformers_core.tools.plot_lr, which is not "
                             "installed", EXIT_VERDICT)
            written = plot_lr(cfg, cfg.training.steps, args.plot_lr)
            print(f"lr schedule written to {written or args.plot_lr}")
            return EXIT_OK
        if args.check:
            return _check(cfg, args)
        if args.groups:
            _print_groups(cfg, args.groups_out)
        from mindformers_core.trainer import run_training
        return int(run_training(cfg, args.output_dir, overwrite=args.overwrite) or 0)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_CONFIG)
    except ValueError as exc:
        # construction-time checks of other packages (e.g. Muon's model checks) are ValueErrors
        # that describe the user's setup: one line, no traceback
        return _fail(f"{type(exc).__name__}: {exc}", EXIT_VERDICT)


def cli() -> int:
    """The command line (``python run_mindformer.py``, ``mindformers-run``): Ctrl-C goes to a
    watcher thread first, before numpy's and MindSpore's threads exist (MindSpore's runtime
    would re-send it as SIGTERM: trainer/signals.py), then :func:`main`. The routing is
    process-wide (it blocks SIGINT in every thread), so it belongs to the process's entry
    point, never to :func:`main` called from Python."""
    from mindformers_core.trainer.signals import route_sigint_to_a_thread
    route_sigint_to_a_thread()
    return main()


if __name__ == "__main__":
    sys.exit(cli())
