"""SGD with momentum on fp32 masters (torch.optim.SGD / Megatron semantics, dampening 0).

    g <- g + wd * p                          (coupled L2, as torch SGD's weight_decay)
    b <- g                     at the first step of a parameter
    b <- momentum * b + g      afterwards    (state ``momentum_buffer.{name}``)
    g <- g + momentum * b      if nesterov, else g <- b
    p <- p - lr * g
"""
from __future__ import annotations

import math
from typing import Optional

from mindspore import Tensor

from ..core.optimizer_defaults import SGD_DEFAULTS as D
from ..core.optimizer_rules import check_weight_decay
from .optimizer import Optimizer, StateShapes

__all__ = ["SGD"]


class SGD(Optimizer):
    optimizer_name = "SGD"

    def __init__(self, params_or_groups, lr: float = D["lr"], momentum: float = D["momentum"],
                 weight_decay: float = D["weight_decay"], nesterov: bool = D["nesterov"], *,
                 store_param_remainders: bool = False, embedding_min_norm=None,
                 state_shapes: Optional[StateShapes] = None):
        if not (isinstance(momentum, (int, float)) and math.isfinite(momentum)
                and 0.0 <= momentum < 1.0):
            raise ValueError(f"Invalid momentum value: {momentum}, should be >= 0 and < 1.")
        check_weight_decay(weight_decay)
        if nesterov and momentum == 0.0:
            raise ValueError("Nesterov momentum requires a momentum > 0")
        super().__init__(params_or_groups, {"lr": float(lr), "momentum": float(momentum),
                                            "weight_decay": float(weight_decay)},
                         store_param_remainders=store_param_remainders,
                         embedding_min_norm=embedding_min_norm, state_shapes=state_shapes)
        self.nesterov = bool(nesterov)
        self._started = [False] * len(self.parameters)

    def state_prefixes(self) -> tuple:
        return ("momentum_buffer",)

    def load_state_dict(self, sd) -> None:
        super().load_state_dict(sd)
        for i, p in enumerate(self.parameters):
            if f"momentum_buffer.{p.name}" in sd:
                self._started[i] = True

    def _update(self, group, i, master, grad: Tensor) -> None:
        lr, mom, wd = float(group["lr"]), float(group["momentum"]), self.group_weight_decay(group)
        g = grad + wd * master if wd != 0.0 else grad
        if mom != 0.0:
            buf = self._get_state("momentum_buffer", i)
            new_buf = g * 1.0 if not self._started[i] else mom * buf + g
            self._started[i] = True
            buf.set_data(new_buf)
            g = g + mom * new_buf if self.nesterov else new_buf
        master.set_data(master - lr * g)
