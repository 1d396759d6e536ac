"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") on fp32 masters.

    c <- b1 * m + (1 - b1) * g
    p <- p * (1 - lr * wd) - lr * sign(c)        (decoupled decay on the old value)
    m <- b2 * m + (1 - b2) * g                   (state ``lion_m.{name}``)

Defaults follow Megatron's ``lion_beta1 = 0.95``, ``lion_beta2 = 0.98``.
"""
from __future__ import annotations

from typing import Optional

from mindspore import Tensor

from ..core.optimizer_defaults import LION_DEFAULTS as D
from ..core.optimizer_rules import check_beta_count, check_beta_range, check_weight_decay
from .optimizer import Optimizer, StateShapes
from .update_rules import lion_step

__all__ = ["Lion"]


class Lion(Optimizer):
    optimizer_name = "Lion"

    def __init__(self, params_or_groups, lr: float = D["lr"], betas=D["betas"],
                 weight_decay: float = D["weight_decay"], *, store_param_remainders: bool = False,
                 embedding_min_norm=None, state_shapes: Optional[StateShapes] = None):
        betas = tuple(betas)
        check_beta_count(betas, self.optimizer_name)
        check_beta_range(betas, self.optimizer_name)
        check_weight_decay(weight_decay)
        super().__init__(params_or_groups, {"lr": float(lr), "betas": betas,
                                            "weight_decay": float(weight_decay)},
                         store_param_remainders=store_param_remainders,
                         embedding_min_norm=embedding_min_norm, state_shapes=state_shapes)

    def state_prefixes(self) -> tuple:
        return ("lion_m",)

    def _update(self, group, i, master, grad: Tensor) -> None:
        lion_step(master, self._get_state("lion_m", i), grad, float(group["lr"]),
                  group["betas"], self.group_weight_decay(group))
