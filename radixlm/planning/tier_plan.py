"""The hierarchical cache's tiers below the device KV pool, for the memory plan: their
capacity in tokens and bytes (the start-up log, `radixlm memory`, /get_server_info's
pool.hicache). The host tier costs RAM, not device memory (pinned on CUDA; on the CPU
backend it is the same RAM the device pool and activations use); the storage tier costs
disk only."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.planning.units import fmt_bytes


@dataclass(frozen=True)
class TierPlan:
    kv_bytes_per_token: int
    storage_bytes: int
    host_bytes: int = 0
    pinned: bool = False

    @property
    def storage_tokens(self) -> int:
        return self.storage_bytes // self.kv_bytes_per_token

    @property
    def host_tokens(self) -> int:
        return self.host_bytes // self.kv_bytes_per_token

    def as_dict(self) -> dict[str, int]:
        return {"host_tokens": self.host_tokens, "host_bytes": self.host_bytes,
                "storage_tokens": self.storage_tokens, "storage_bytes": self.storage_bytes}

    def lines(self, device_tokens: int) -> list[str]:
        host = ("none (--hicache-ratio / --hicache-size; off by default on the CPU backend)"
                if not self.host_bytes else
                ("pinned " if self.pinned else "") + "host RAM, not device memory "
                "(--hicache-ratio / --hicache-size)")
        return [
            "hierarchical cache tiers (below the device KV pool of "
            f"{device_tokens} tokens):",
            f"  host      {self.host_tokens:>12} tokens  {fmt_bytes(self.host_bytes):>11}  {host}",
            f"  storage   {self.storage_tokens:>12} tokens  {fmt_bytes(self.storage_bytes):>11}  "
            "files on disk (--hicache-storage-size), not device memory or RAM",
        ]


def host_tier_bytes(size_gb: float, ratio: float | None, device_kv_bytes: int,
                    device_kind: str) -> int:
    """Bytes of the host tier: --hicache-size GB, else --hicache-ratio x the device KV
    pool; unset, 2.0 x on CUDA and none on the CPU backend (the same RAM as the pool)."""
    if size_gb < 0:
        raise ValueError(f"--hicache-size must be >= 0 GB, got {size_gb}")
    if size_gb:
        return int(size_gb * 1e9)
    if ratio is None:
        ratio = 2.0 if device_kind == "cuda" else 0.0
    if ratio < 0:
        raise ValueError(f"--hicache-ratio must be >= 0, got {ratio}")
    return int(ratio * device_kv_bytes)
