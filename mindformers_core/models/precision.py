"""Parameter and compute dtypes of a model, resolved for the device it runs on.

MindSpore 2.10 on CPU has no bfloat16 matmul kernel, so a ``compute_dtype: bfloat16`` config
computes in float32 on CPU while the parameters stay in their ``params_dtype`` storage; on
Ascend (or GPU) the same config computes in bfloat16. Softmax, norms and the loss always run
in float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms

DTYPES = {"float32": ms.float32, "bfloat16": ms.bfloat16, "float16": ms.float16}


@dataclass(frozen=True)
class Precision:
    """``param``: storage dtype of the weights; ``compute``: dtype of matmul inputs."""
    param: "ms.dtype"
    compute: "ms.dtype"

    def cast(self, x):
        """``x`` in the compute dtype (no-op when it already is)."""
        return x if x.dtype == self.compute else x.astype(self.compute)


def resolve_precision(params_dtype: str, compute_dtype: str, device_target: str = None) -> Precision:
    """Map config dtype names to MindSpore dtypes; bf16 compute becomes fp32 on CPU."""
    if device_target is None:
        device_target = ms.get_context("device_target")
    compute = DTYPES[compute_dtype]
    if device_target == "CPU" and compute == ms.bfloat16:
        compute = ms.float32  # no CPU bf16 matmul kernel
    return Precision(param=DTYPES[params_dtype], compute=compute)
