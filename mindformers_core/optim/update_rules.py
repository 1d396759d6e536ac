"""The element-wise update rules, as functions of tensors, shared by every optimizer class.

* :func:`apply_decoupled_decay` ``p * (1 - lr * wd)`` (AdamW, Lion and Muon decay the old value);
* :class:`AdamRule` Adam moments and step, fused (``ops.Adam``) or composed ops
  (``adam.py`` documents the math and why the fused scalars are exact);
* :func:`lion_step` Lion's sign update and momentum;
* :func:`muon_momentum` Muon's momentum and the (Nesterov) matrix that Newton-Schulz
  orthogonalises; :func:`apply_muon_delta` the decayed master minus the scaled update.

``AdamW`` and ``Lion`` use them for their own parameters, ``Muon`` for its matrices and for its
scalar branch (an ``AdamRule`` or Lion), and ``distributed.zero`` through ``Muon``, so each
rule has one implementation.
"""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, ops

from .host.seam import host_kernels
from .host.views import scale_in_place

__all__ = ["apply_decoupled_decay", "AdamRule", "LionRule", "lion_step", "muon_momentum",
           "apply_muon_delta"]


def apply_decoupled_decay(p: Tensor, lr: float, wd: float) -> Tensor:
    """``p * (1 - lr * wd)`` (``p`` itself when there is no decay)."""
    return p * (1.0 - lr * wd) if wd != 0.0 else p


class AdamRule:
    """Adam's update of one fp32 master with its moments ``m``, ``v`` (updated in place).

    ``impl`` 'fused': MindSpore's ``ops.Adam`` with the bias correction folded into the
    scalars (:meth:`scalars`); 'reference': composed ops in fp32, moments stored in their own
    dtype. ``decoupled``: decoupled weight decay (AdamW) or coupled L2 (``g + wd * p``).
    """

    #: the state tensors of a parameter this rule updates, in :meth:`branch_update` order
    state_prefixes = ("adam_m", "adam_v")

    def __init__(self, impl: str = "fused", decoupled: bool = True, host_kernel: bool = True):
        self.impl = impl
        self.decoupled = bool(decoupled)
        self.kernel = ops.Adam()
        self.zero = Tensor(0.0, ms.float32)
        #: on CPU, many tensors' fused step in one host call (``host_adam``, as chosen at
        #: optimizer build: ``optim/host/seam.py``); None elsewhere
        self.host = host_kernels().adam if (host_kernel and impl == "fused") else None

    @staticmethod
    def scalars(lr: float, b1: float, b2: float, eps: float, step: int):
        """(lr_t, b1, b2, eps_t) Tensors for ``ops.Adam`` at step ``step``.

        The kernel's EMAs run with the fp32-rounded betas b1', b2' (for b2 = 0.999 the fp32
        1 - b2' is 1.3e-5 off 1 - b2). Bias correction uses the same b1', b2', so m/bc1 and
        v/bc2 are normalised weighted averages of the gradients exactly as in torch (weights
        summing to 1); the bias-corrected update then matches torch to ~1e-7 relative even
        though the raw v differs by that 1.3e-5 factor.
        """
        return tuple(Tensor(x, ms.float32) for x in AdamRule.scalar_values(lr, b1, b2, eps, step))

    @staticmethod
    def scalar_values(lr: float, b1: float, b2: float, eps: float, step: int):
        """:meth:`scalars` as Python floats (fp32 rounding happens where they are used)."""
        b1f, b2f = float(np.float32(b1)), float(np.float32(b2))
        bc1, bc2 = 1.0 - b1f ** step, 1.0 - b2f ** step
        sq = math.sqrt(bc2)
        return lr * sq / bc1, b1f, b2f, eps * sq

    def fused_many(self, masters, exp_avg, exp_avg_sq, grads, lr: float, b1: float, b2: float,
                   eps: float, wd: float, step: int) -> bool:
        """The fused step of many fp32 masters as one host call (``host_adam``), the decay
        included: the update of :meth:`fused` per tensor, within fp32 rounding (the
        ``ops.Adam`` kernel computes its tail elements in double). False, with nothing
        touched, where the host kernel is unavailable or does not take the tensors."""
        if self.host is None:
            return False
        decay = 1.0 - lr * wd if (wd != 0.0 and self.decoupled) else 1.0
        # the decay after the update, c*p - lr_t*u == c*(p - (lr_t/c)*u), unless lr*wd ~ 1
        decay_first = abs(decay) < 1e-3
        lr_t, b1f, b2f, eps_t = self.scalar_values(lr if decay_first else lr / decay,
                                                   b1, b2, eps, step)
        return self.host.step(masters, exp_avg, exp_avg_sq, grads, lr_t, b1f, b2f, eps_t,
                              decay, decay_first, wd if (wd != 0.0 and not self.decoupled)
                              else 0.0)

    def fused(self, master: Parameter, m: Parameter, v: Parameter, g: Tensor, lr: float,
              wd: float, scalars) -> None:
        """One ``ops.Adam`` launch (decay first, on the old value)."""
        lr_t, b1, b2, eps_t = scalars
        if wd != 0.0:
            if self.decoupled:
                scale_in_place(master, 1.0 - lr * wd)
            else:
                g = g + wd * master
        # beta powers 0: the kernel's own bias correction is the identity; it is in lr_t.
        self.kernel(master, m, v, self.zero, self.zero, lr_t, b1, b2, eps_t, g)

    def reference(self, master, m, v, g, lr, b1, b2, eps, wd, step: int) -> None:
        """Plain composed ops, fp32 arithmetic; m/v stored in their own dtype."""
        bc1, bc2 = 1.0 - b1 ** step, 1.0 - b2 ** step
        p = master * 1.0
        if wd != 0.0:
            if self.decoupled:
                p = apply_decoupled_decay(p, lr, wd)
            else:
                g = g + wd * p
        m32 = m.astype(ms.float32) if m.dtype != ms.float32 else m
        v32 = v.astype(ms.float32) if v.dtype != ms.float32 else v
        m_new = b1 * m32 + (1.0 - b1) * g
        v_new = b2 * v32 + (1.0 - b2) * (g * g)
        denom = ops.sqrt(v_new) / math.sqrt(bc2) + eps
        p = p - (lr / bc1) * (m_new / denom)
        master.set_data(p)
        m.set_data(m_new if m.dtype == ms.float32 else m_new.astype(m.dtype))
        v.set_data(v_new if v.dtype == ms.float32 else v_new.astype(v.dtype))

    def update(self, master, m, v, g, lr: float, betas, eps: float, wd: float,
               step: int) -> None:
        """One parameter's step with the configured ``impl``."""
        b1, b2 = float(betas[0]), float(betas[1])
        if self.impl == "fused":
            self.fused(master, m, v, g, lr, wd, self.scalars(lr, b1, b2, eps, step))
        else:
            self.reference(master, m, v, g, lr, b1, b2, eps, wd, step)


    def branch_update(self, master, states, g, lr: float, group, wd: float, step: int) -> None:
        """As Muon's scalar branch: betas and eps from the parameter's group."""
        self.update(master, states[0], states[1], g, lr, group["betas"], float(group["eps"]),
                    wd, step)

    def branch_update_many(self, masters, states, grads, lr: float, group, wd: float,
                           step: int) -> bool:
        """:meth:`branch_update` of many parameters at once (``states``: one list per state
        prefix) where :meth:`fused_many` takes them; False, nothing touched, otherwise."""
        b1, b2 = group["betas"]
        return self.impl == "fused" and self.fused_many(
            masters, states[0], states[1], grads, lr, float(b1), float(b2),
            float(group["eps"]), wd, step)


class LionRule:
    """Lion as a rule object (Muon's scalar branch under ``muon_scalar_optimizer: lion``)."""

    state_prefixes = ("lion_m",)

    def __init__(self, betas):
        self.betas = tuple(float(b) for b in betas)

    def branch_update(self, master, states, g, lr: float, group, wd: float,  # noqa: ARG002
                      step: int) -> None:  # noqa: ARG002 - Lion has no bias correction
        lion_step(master, states[0], g, lr, self.betas, wd)

    def branch_update_many(self, *args) -> bool:  # noqa: ARG002 - AdamRule's interface
        """Lion has no many-tensor kernel: the caller updates parameter by parameter."""
        return False


def lion_step(master: Parameter, m: Parameter, g: Tensor, lr: float, betas,
              wd: float) -> None:
    """Lion: ``p <- p * (1 - lr*wd) - lr * sign(b1*m + (1-b1)*g)``, ``m <- b2*m + (1-b2)*g``."""
    b1, b2 = float(betas[0]), float(betas[1])
    direction = ops.sign(b1 * m + (1.0 - b1) * g)
    master.set_data(apply_decoupled_decay(master, lr, wd) - lr * direction)
    m.set_data(b2 * m + (1.0 - b2) * g)


def muon_momentum(m: Tensor, g: Tensor, mu: float, nesterov: bool) -> Tuple[Tensor, Tensor]:
    """``(m_new, U)``: ``m_new = mu*m + g``; ``U = g + mu*m_new`` (Nesterov) or ``m_new``.
    Element-wise, so a rank holding some rows of ``m`` and ``g`` gets those rows of ``U``."""
    m_new = m * mu + g
    return m_new, (g + m_new * mu if nesterov else m_new)


def apply_muon_delta(master: Parameter, delta: Tensor, lr: float, wd: float) -> None:
    """``master <- master * (1 - lr*wd) - delta`` (``delta`` already scaled by lr)."""
    master.set_data(apply_decoupled_decay(master, lr, wd) - delta)
