"""Learning rate for a changed batch size (docs/batch_size_and_lr_scaling.md).

    lr_target = lr_base * (B_target / B_base)          rule "linear"  (SGD with momentum,
                                                                        well below B_crit; Goyal)
    lr_target = lr_base * sqrt(B_target / B_base)      rule "sqrt"    (AdamW / Muon / Lion: the
                                                                        SDE rule of Malladi et al.)

The batch sizes may be in any unit (samples or tokens) as long as both use the same one.
The LLM-pretraining default is ``sqrt``: linear over-scales near the critical batch size.

    python -m mindformers_core.tools.batch_scaling --base-lr 3e-4 --base-batch 1000000 \
        --target-batch 4000000 [--rule sqrt|linear | --optimizer AdamW]
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Optional, Sequence

__all__ = ["SCALING_RULES", "scale_lr_for_batch_size", "rule_for_optimizer", "main"]

#: rule name -> exponent of the batch ratio
SCALING_RULES = {"sqrt": 0.5, "linear": 1.0}

#: optimizer type -> batch-scaling rule (adaptive / normalized updates: sqrt; SGD: linear)
_OPTIMIZER_RULES = {"adamw": "sqrt", "adam": "sqrt", "muon": "sqrt", "lion": "sqrt",
                    "sgd": "linear"}


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def scale_lr_for_batch_size(base_lr: float, base_batch: float, target_batch: float,
                            rule: str = "sqrt") -> float:
    """The peak lr for ``target_batch`` given one tuned at ``base_batch`` (see module doc).

    ``rule``: ``"sqrt"`` or ``"linear"``; anything else is a ValueError listing the rules.
    """
    if rule not in SCALING_RULES:
        raise ValueError(f"unknown batch-size scaling rule {rule!r}; valid rules: "
                         f"{sorted(SCALING_RULES)} (sqrt for AdamW/Muon, linear for SGD)")
    if isinstance(base_lr, bool) or not isinstance(base_lr, (int, float)) \
            or not math.isfinite(base_lr) or base_lr < 0:
        raise ValueError(f"base_lr must be a finite number >= 0, got {base_lr!r}")
    ratio = _positive("target_batch", target_batch) / _positive("base_batch", base_batch)
    return float(base_lr) * ratio ** SCALING_RULES[rule]


def rule_for_optimizer(optimizer_type: str) -> str:
    """``sqrt`` for AdamW/Muon/Lion (adaptive or normalized updates), ``linear`` for SGD."""
    key = str(optimizer_type).lower()
    if key not in _OPTIMIZER_RULES:
        raise ValueError(f"no batch-scaling rule for optimizer {optimizer_type!r}; known: "
                         f"{sorted(_OPTIMIZER_RULES)}")
    return _OPTIMIZER_RULES[key]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindformers_core.tools.batch_scaling",
                                     description="Scale a peak learning rate to a new batch size.")
    parser.add_argument("--base-lr", type=float, required=True, help="peak lr of the reference run")
    parser.add_argument("--base-batch", type=float, required=True,
                        help="batch size of the reference run (samples or tokens)")
    parser.add_argument("--target-batch", type=float, required=True,
                        help="new batch size, same unit as --base-batch")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--rule", default=None, help=f"one of {sorted(SCALING_RULES)}")
    group.add_argument("--optimizer", default=None,
                       help="pick the rule from the optimizer (AdamW/Muon/Lion: sqrt, SGD: linear)")
    args = parser.parse_args(argv)
    try:
        rule = args.rule or (rule_for_optimizer(args.optimizer) if args.optimizer else "sqrt")
        lr = scale_lr_for_batch_size(args.base_lr, args.base_batch, args.target_batch, rule)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ratio = args.target_batch / args.base_batch
    print(f"batch {args.base_batch:g} -> {args.target_batch:g} (x{ratio:g}), rule {rule}: "
          f"lr {args.base_lr:.4g} -> {lr:.4g}")
    other = "linear" if rule == "sqrt" else "sqrt"
    print(f"(the {other} rule would give "
          f"{scale_lr_for_batch_size(args.base_lr, args.base_batch, args.target_batch, other):.4g})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
