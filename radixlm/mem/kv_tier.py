"""KVTier: the interface of one tier below the device KV pool (a storage class).

A tier maps a block key (16 bytes, `kv_fingerprint.block_keys`) to the K/V bytes of that
block: a uint8 tensor of `block_bytes` bytes laid out [K|V][layer][token][head][dim].
`get` returns exactly what `put` stored or None, never other bytes; implementations
are thread-safe (the hicache's loader and writer threads call them beside the scheduler).
"""

from __future__ import annotations

from typing import Protocol

import torch


class KVTier(Protocol):
    name: str
    block_bytes: int
    capacity_bytes: int

    def contains(self, key: bytes) -> bool: ...

    def get(self, key: bytes) -> torch.Tensor | None: ...

    def put(self, key: bytes, data: torch.Tensor) -> bool: ...

    def clear(self) -> None: ...

    def num_blocks(self) -> int: ...

    def size_bytes(self) -> int: ...

    def close(self) -> None: ...
