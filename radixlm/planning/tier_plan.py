"""The hierarchical cache's tiers below the device KV pool, for the memory plan: their
capacity in tokens and bytes (the start-up log, `radixlm memory`, /get_server_info's
pool.hicache). Only the storage tier exists: it costs disk, not device memory or RAM;
there is no host tier (on the CPU backend it would take the same RAM the device pool
uses, so a bigger --max-total-tokens buys the same; on CUDA a pinned pool is not built
yet), so the OOM advice has no host-tier RAM to weigh."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.planning.units import fmt_bytes


@dataclass(frozen=True)
class TierPlan:
    kv_bytes_per_token: int
    storage_bytes: int
    host_bytes: int = 0

    @property
    def storage_tokens(self) -> int:
        return self.storage_bytes // self.kv_bytes_per_token

    @property
    def host_tokens(self) -> int:
        return self.host_bytes // self.kv_bytes_per_token

    def lines(self, device_tokens: int) -> list[str]:
        return [
            "hierarchical cache tiers (below the device KV pool of "
            f"{device_tokens} tokens):",
            f"  host      {self.host_tokens:>12} tokens  {fmt_bytes(self.host_bytes):>11}  "
            "none (docs/memory.md, 'Hierarchical cache')",
            f"  storage   {self.storage_tokens:>12} tokens  {fmt_bytes(self.storage_bytes):>11}  "
            "files on disk (--hicache-storage-size), not device memory or RAM",
        ]
