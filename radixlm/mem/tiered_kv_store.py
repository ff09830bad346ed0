"""TieredKVStore: the tiers below the device pool as one KVTier: an optional host tier
over the storage tier (files).

put: into the host tier, and (write-through) into storage too; without a host tier,
into storage. The host tier's LRU evictions go to storage unless stored already (so under
write_back a block reaches disk only when host memory lets it go). get: host first, then
storage; `get_tier` also says which tier answered. Called from the BlockIO threads only
(writer: put; loader: get), so disk IO never runs on the scheduler thread.
"""

from __future__ import annotations

import torch

from radixlm.mem.host_kv_store import HostKVStore
from radixlm.mem.kv_tier import KVTier


class TieredKVStore:
    name = "tiers"

    def __init__(self, storage: KVTier, host: HostKVStore | None = None,
                 write_through: bool = True) -> None:
        if host is not None and host.block_bytes != storage.block_bytes:
            raise ValueError("host and storage tiers disagree on the block size")
        self.storage = storage
        self.host = host
        self.write_through = write_through
        self.block_bytes = storage.block_bytes
        self.capacity_bytes = storage.capacity_bytes + (host.capacity_bytes if host else 0)
        self.host_to_storage = 0  # blocks the host tier evicted and storage took
        if host is not None:
            host.on_evict = self._demote

    def _demote(self, key: bytes, data: torch.Tensor) -> None:
        if not self.storage.contains(key) and self.storage.put(key, data):
            self.host_to_storage += 1

    def contains(self, key: bytes) -> bool:
        return (self.host is not None and self.host.contains(key)) or self.storage.contains(key)

    def get_tier(self, key: bytes) -> tuple[torch.Tensor | None, str]:
        if self.host is not None:
            block = self.host.get(key)
            if block is not None:
                return block, "host"
        return self.storage.get(key), "storage"

    def get(self, key: bytes) -> torch.Tensor | None:
        return self.get_tier(key)[0]

    def put(self, key: bytes, data: torch.Tensor) -> bool:
        if self.host is None:
            return self.storage.put(key, data)
        ok = self.host.put(key, data)
        if self.write_through and not self.storage.contains(key):
            self.storage.put(key, data)
        return ok

    def clear_host(self) -> None:
        if self.host is not None:
            self.host.clear()

    def clear(self) -> None:
        self.clear_host()
        self.storage.clear()

    def num_blocks(self) -> int:
        return (self.host.num_blocks() if self.host else 0) + self.storage.num_blocks()

    def size_bytes(self) -> int:
        return (self.host.size_bytes() if self.host else 0) + self.storage.size_bytes()

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
        self.storage.close()
