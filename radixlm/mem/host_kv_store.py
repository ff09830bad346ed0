"""HostKVStore: the hierarchical cache's host tier, K/V blocks in host memory (a KVTier).

Each block is a uint8 tensor of `block_bytes` (pinned when `pin`, i.e. the device is
CUDA, so host -> device copies can run asynchronously; plain on the CPU backend), keyed
like the storage tier. An LRU index bounds it to `capacity_bytes`; the blocks it evicts
are handed to `on_evict` (the tier below), outside its lock. `get` returns the stored
tensor itself: callers only read it (the loader copies it into device slots).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

import torch


class HostKVStore:
    name = "host"

    def __init__(self, block_bytes: int, capacity_bytes: int, pin: bool = False,
                 on_evict: Callable[[bytes, torch.Tensor], None] | None = None) -> None:
        if capacity_bytes < block_bytes:
            raise ValueError(f"host tier of {capacity_bytes} bytes holds no block of "
                             f"{block_bytes} bytes")
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes // block_bytes * block_bytes
        self.pin = pin
        self.on_evict = on_evict
        self._mu = threading.Lock()
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # LRU first
        self.evicted = 0

    def contains(self, key: bytes) -> bool:
        with self._mu:
            return key in self._blocks

    def get(self, key: bytes) -> torch.Tensor | None:
        with self._mu:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
            return block

    def put(self, key: bytes, data: torch.Tensor) -> bool:
        """Keep a copy of one block (uint8, block_bytes); evicts the least recently used
        blocks past capacity (to `on_evict`)."""
        if data.numel() != self.block_bytes:
            raise ValueError(f"block of {data.numel()} bytes, expected {self.block_bytes}")
        block = torch.empty(self.block_bytes, dtype=torch.uint8, pin_memory=self.pin)
        block.copy_(data.reshape(-1))
        out: list[tuple[bytes, torch.Tensor]] = []
        with self._mu:
            self._blocks[key] = block
            self._blocks.move_to_end(key)
            while len(self._blocks) * self.block_bytes > self.capacity_bytes:
                out.append(self._blocks.popitem(last=False))
            self.evicted += len(out)
        if self.on_evict is not None:
            for k, b in out:
                self.on_evict(k, b)
        return True

    def flush_to(self, tier, deadline: float) -> int:
        """Put every block `tier` (a KVTier) lacks into it, most recently used first,
        until `deadline` (time.monotonic()); returns how many went. At close."""
        with self._mu:
            items = list(reversed(self._blocks.items()))
        n = 0
        for key, block in items:
            if time.monotonic() >= deadline:
                break
            if not tier.contains(key) and tier.put(key, block):
                n += 1
        return n

    def clear(self) -> None:
        with self._mu:
            self._blocks.clear()

    def num_blocks(self) -> int:
        with self._mu:
            return len(self._blocks)

    def size_bytes(self) -> int:
        return self.num_blocks() * self.block_bytes

    def close(self) -> None:
        self.clear()
