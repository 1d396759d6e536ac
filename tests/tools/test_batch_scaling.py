"""LR vs batch size: the seed's worked numbers and the rule errors."""
import math

import pytest

from mindformers_core.tools.batch_scaling import main, rule_for_optimizer, scale_lr_for_batch_size


def test_worked_examples():
    # 1M -> 4M tokens/step under AdamW: sqrt 6e-4, linear 1.2e-3
    assert scale_lr_for_batch_size(3e-4, 1_000_000, 4_000_000, "sqrt") == pytest.approx(6e-4)
    assert scale_lr_for_batch_size(3e-4, 1_000_000, 4_000_000, "linear") == pytest.approx(1.2e-3)
    # capstone: 65,536 -> 524,288 tokens/step is x sqrt(8) ~ 2.83
    assert scale_lr_for_batch_size(1.0, 65_536, 524_288, "sqrt") == pytest.approx(math.sqrt(8))
    # exercise 3: 0.5M -> 4M from 3e-4
    assert scale_lr_for_batch_size(3e-4, 0.5e6, 4e6, "linear") == pytest.approx(2.4e-3)
    assert scale_lr_for_batch_size(3e-4, 0.5e6, 4e6, "sqrt") == pytest.approx(8.485e-4, rel=1e-3)
    # shrinking the batch lowers the lr; default rule is sqrt
    assert scale_lr_for_batch_size(4e-4, 64, 16) == pytest.approx(2e-4)


@pytest.mark.parametrize("args,match", [
    ((3e-4, 1, 4, "cubic"), r"unknown batch-size scaling rule 'cubic'; valid rules: "
                            r"\['linear', 'sqrt'\]"),
    ((3e-4, 0, 4, "sqrt"), "base_batch must be a finite number > 0"),
    ((3e-4, 1, -4, "sqrt"), "target_batch must be a finite number > 0"),
    ((-1.0, 1, 4, "sqrt"), "base_lr must be a finite number >= 0"),
    ((float("nan"), 1, 4, "sqrt"), "base_lr must be a finite number >= 0"),
])
def test_errors(args, match):
    with pytest.raises(ValueError, match=match):
        scale_lr_for_batch_size(*args)


def test_rule_for_optimizer():
    assert [rule_for_optimizer(t) for t in ("AdamW", "Muon", "Lion", "SGD")] == \
        ["sqrt", "sqrt", "sqrt", "linear"]
    with pytest.raises(ValueError, match="no batch-scaling rule for optimizer 'Adagrad'"):
        rule_for_optimizer("Adagrad")


def test_cli(capsys):
    assert main(["--base-lr", "3e-4", "--base-batch", "1e6", "--target-batch", "4e6"]) == 0
    out = capsys.readouterr().out
    assert "rule sqrt: lr 0.0003 -> 0.0006" in out and "linear rule would give 0.0012" in out
    assert main(["--base-lr", "3e-4", "--base-batch", "1", "--target-batch", "4",
                 "--optimizer", "SGD"]) == 0
    assert "rule linear: lr 0.0003 -> 0.0012" in capsys.readouterr().out
    assert main(["--base-lr", "3e-4", "--base-batch", "1", "--target-batch", "4",
                 "--rule", "cube"]) == 2
    assert "valid rules: ['linear', 'sqrt']" in capsys.readouterr().err
