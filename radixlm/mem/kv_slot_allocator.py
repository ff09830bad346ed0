"""KVSlotAllocator: hands out free slot indices of the token_to_kv_pool.

Slots are 1..size; slot 0 is the dummy that padded tokens write to and is never handed
out. The free list is one int64 tensor, so alloc and free are slicing and `torch.cat`
whatever the number of tokens: no per-token Python work.
"""

from __future__ import annotations

import torch


class KVSlotAllocator:
    def __init__(self, size: int, device: torch.device | str = "cpu") -> None:
        self.size = size
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        self.free_slots = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)

    def available_size(self) -> int:
        return int(self.free_slots.numel())

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` slots; None (nothing taken) when fewer than `n` are free."""
        if n > self.free_slots.numel():
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Return slots. The caller must not hold them anywhere else afterwards."""
        if slots.numel():
            self.free_slots = torch.cat([self.free_slots, slots.to(self.free_slots)])
