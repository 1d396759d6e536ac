"""The memory of one rank's device, for the memory planner (core/memory_plan.py; pure, no
MindSpore import): which backend a config's ``context`` plans for, and that device's limit."""
from __future__ import annotations

import os
from typing import Optional, Tuple

__all__ = ["ASCEND_910B_BYTES", "plan_backend", "device_memory_limit"]

#: HBM of one Ascend 910B NPU (Atlas 800T A2 training server: 8 x 64 GB HBM2e, Huawei's
#: product specification); upstream MindFormers hands MindSpore 59GB of it by default
ASCEND_910B_BYTES = 64 * 1024 ** 3


def _host_ram_bytes() -> Optional[float]:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _npu_visible() -> bool:
    return any(name.startswith("davinci") and name[7:].isdigit()
               for name in (os.listdir("/dev") if os.path.isdir("/dev") else ()))


def plan_backend(context_cfg, npu_visible: Optional[bool] = None) -> str:
    """``"Ascend"``, ``"GPU"`` or ``"CPU"``: the backend whose memory :func:`device_memory_limit`
    reads (a null target with ``max_device_memory`` written or NPUs present is Ascend)."""
    target = context_cfg.device_target
    if target in ("Ascend", "GPU", "CPU"):
        return target
    if npu_visible is None:
        npu_visible = _npu_visible()
    return "Ascend" if "max_device_memory" in context_cfg.explicit_keys or npu_visible else "CPU"


def device_memory_limit(context_cfg, host_ram: Optional[float] = None,
                        npu_visible: Optional[bool] = None) -> Tuple[Optional[float], str]:
    """(bytes, where the number comes from) for one rank.

    ``device_target: CPU`` -> the host RAM (MindSpore ignores max_device_memory on CPU);
    ``Ascend`` / ``GPU``, or no target with ``max_device_memory`` written, or no target on a
    machine with NPUs (/dev/davinciN) -> ``context.max_device_memory`` (upstream's default
    59GB), capped at the 64 GB HBM of an Ascend 910B; otherwise the host RAM.
    """
    from .memory_size import parse_memory_size
    target = context_cfg.device_target
    if plan_backend(context_cfg, npu_visible) != "CPU":
        value = parse_memory_size(context_cfg.max_device_memory, "context.max_device_memory")
        if target != "GPU" and value > ASCEND_910B_BYTES:
            return float(ASCEND_910B_BYTES), ("Ascend 910B HBM (64 GB; context.max_device_memory "
                                              f"{context_cfg.max_device_memory} is above it)")
        return value, f"context.max_device_memory {context_cfg.max_device_memory}"
    ram = _host_ram_bytes() if host_ram is None else host_ram
    if ram is None:
        return None, "host RAM unknown"
    return float(ram), "host RAM (CPU)"
