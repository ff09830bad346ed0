"""The device facts the memory planner needs, probed once after the weights are loaded.

  * CUDA: `torch.cuda.mem_get_info` -- total device memory, and what is free now (the
    weights are already in, so free = available after weights).
  * CPU: the host's available memory (psutil's `available`: free + reclaimable caches) is
    the device. Probed after the load, it no longer counts the weights, so the device total
    is `available + weight bytes`: what was there for the engine before it started.
  * `--device-memory` (any device): a budget. The device is that big: total = the budget,
    available after weights = budget - weights (on CUDA also at most what is free).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DeviceMemory:
    kind: str  # "cuda" | "cpu"
    total_bytes: int
    available_after_weights: int
    source: str  # where the numbers come from, for the start-up table


def probe_device_memory(device: torch.device, weight_bytes: int,
                        budget: int | None = None) -> DeviceMemory:
    if device.type == "cuda":
        import torch  # (not at module level: a MemoryPlan unpickled in the API process)

        free, total = torch.cuda.mem_get_info(device)
        if budget is not None:
            return DeviceMemory("cuda", budget, min(free, budget - weight_bytes), "--device-memory")
        return DeviceMemory("cuda", total, free, "torch.cuda.mem_get_info")
    if budget is not None:
        return DeviceMemory("cpu", budget, budget - weight_bytes, "--device-memory")
    import psutil

    available = psutil.virtual_memory().available
    return DeviceMemory("cpu", available + weight_bytes, available,
                        "available host memory at start")
