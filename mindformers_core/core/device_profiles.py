"""Device profiles of the layout advisor's cost model (pure): memory, compute rate and links.

A profile is what core/layout_cost.py needs about one kind of device: its memory, its peak
(the MFU denominator, core/flops.py) and sustained FLOP/s, how many devices share a node and
the two links (intra-node, inter-node) as bandwidth per rank plus a per-step latency, the
process baseline (memory a rank holds before the model: the runtime, the communicator's
buffers) and, for the CPU, the cores the workers share and the fixed cost of a PyNative layer.

Sources (docs/plan_layout.md):

* ``ascend910b``: Atlas 800T A2, 8 x 64 GB HBM per node (memory_plan.ASCEND_910B_BYTES), the
  trainer's Ascend peak; HCCS inside the node, 200 Gb/s RoCE per NPU between nodes.
* ``gpu80g``: an H100-class 80 GiB GPU (the trainer's GPU peak), NVLink inside an 8-GPU node,
  400 Gb/s InfiniBand per GPU between nodes.
* ``cpu``: this machine, one node; sustained matmul rate, op overhead and all-reduce measured
  by tools/calibrate_device.py (``plan_layout --calibration FILE`` reads a fresh measurement);
  the baseline is the peak RSS of an msrun worker training the smallest GPT (bench/
  plan_layout_check.py, docs/plan_layout.md).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Dict, Optional

from .flops import PEAK_FLOPS
from .memory_plan import ASCEND_910B_BYTES

__all__ = ["DeviceProfile", "PROFILES", "BACKEND_PROFILE", "get_profile", "calibrated"]

GIB = 1024 ** 3
#: peak RSS of a MindSpore CPU process training configs/data_parallel.yaml (3 steps, 547 MiB
#: measured) minus the planner's 7 MiB for that model: the runtime before any model
CPU_BASELINE_BYTES = 540.0 * 1024 ** 2
# op_overhead_s x ops_per_layer: the same run's 0.20-0.32 s per step is almost all dispatch
# (2 layers x 4 micro-batches of a 64-wide GPT): about 32 ms per layer and micro-batch


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    backend: str                  # CPU | Ascend | GPU (the MFU peak, the planner's backend)
    memory_bytes: float           # per device
    peak_flops: float             # per device, the MFU denominator
    matmul_flops: float           # sustained per device (CPU: per process running alone)
    devices_per_node: int
    intra_bandwidth_Bps: float    # per rank, inside a node
    intra_latency_s: float        # per collective step inside a node
    inter_bandwidth_Bps: float    # per rank, between nodes
    inter_latency_s: float
    baseline_bytes: float         # process baseline per rank
    cores: Optional[int] = None   # CPU: cores the workers share (None: one device each)
    op_overhead_s: float = 0.0    # fixed cost of one PyNative op (CPU)
    ops_per_layer: int = 0        # PyNative ops of one layer's forward + backward (CPU)

    def rate_per_worker(self, workers_per_node: int) -> float:
        """Sustained FLOP/s of one worker: the device's, or on a CPU the process rate scaled
        by the share of the cores a worker gets when ``workers_per_node`` run at once."""
        if self.cores is None:
            return self.matmul_flops
        return self.matmul_flops * min(1.0, self.cores / max(1, workers_per_node))

    def link(self, span: int):
        """(bandwidth, latency) of a group whose ranks span ``span`` consecutive ranks."""
        if span <= self.devices_per_node:
            return self.intra_bandwidth_Bps, self.intra_latency_s
        return self.inter_bandwidth_Bps, self.inter_latency_s


PROFILES: Dict[str, DeviceProfile] = {
    "ascend910b": DeviceProfile(
        "ascend910b", "Ascend", float(ASCEND_910B_BYTES), PEAK_FLOPS["Ascend"],
        0.5 * PEAK_FLOPS["Ascend"], 8, 56e9, 10e-6, 25e9, 20e-6, 2.0 * GIB),
    "gpu80g": DeviceProfile(
        "gpu80g", "GPU", 80.0 * GIB, PEAK_FLOPS["GPU"], 0.45 * PEAK_FLOPS["GPU"], 8, 300e9,
        5e-6, 50e9, 10e-6, 1.5 * GIB),
    # measured here (2 cores, six agents sharing them): tools/calibrate_device.py
    "cpu": DeviceProfile(
        "cpu", "CPU", 0.0, PEAK_FLOPS["CPU"], 8e9, 1 << 30, 1.0e9, 2e-3, 1.0e9, 2e-3,
        CPU_BASELINE_BYTES, cores=os.cpu_count() or 1, op_overhead_s=2.7e-4, ops_per_layer=120),
}
#: the profile of a config's backend (core/memory_plan.plan_backend) when --device is not given
BACKEND_PROFILE = {"Ascend": "ascend910b", "GPU": "gpu80g", "CPU": "cpu"}


def get_profile(name: str) -> DeviceProfile:
    """The profile called ``name``; ValueError listing the known ones."""
    if name not in PROFILES:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]


def calibrated(profile: DeviceProfile, values: dict) -> DeviceProfile:
    """``profile`` with the measured ``values`` (tools/calibrate_device.py's JSON) that name
    its fields; an all-reduce measured on one node sets both links."""
    names = {f.name for f in fields(DeviceProfile)}
    update = {k: v for k, v in values.items() if k in names}
    if "intra_bandwidth_Bps" in update and profile.backend == "CPU":
        update.setdefault("inter_bandwidth_Bps", update["intra_bandwidth_Bps"])
        update.setdefault("inter_latency_s", update.get("intra_latency_s",
                                                        profile.intra_latency_s))
    return replace(profile, **update)
