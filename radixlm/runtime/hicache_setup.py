"""The hierarchical cache's configuration from ServerArgs and the loaded model runner:
where its files go, their bound, and the fingerprint of everything that changes KV bytes
(weights hash, KV dtype and layout, page and block size, RoPE, TP rank/size), and the
host tier's size (--hicache-size GB, else --hicache-ratio x the device KV pool; by default
2.0 on CUDA and none on the CPU backend)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from radixlm.config import ServerArgs
from radixlm.mem.hi_radix_cache import HiCacheConfig, storage_block_tokens
from radixlm.mem.kv_fingerprint import KVFingerprint, rope_signature, weights_sha256
from radixlm.planning.tier_plan import TierPlan, host_tier_bytes
from radixlm.planning.units import parse_size
from radixlm.runtime.cache_dir import cache_root

if TYPE_CHECKING:
    from radixlm.executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def hicache_config(args: ServerArgs, runner: "ModelRunner", model_path: str) -> HiCacheConfig | None:
    """None unless --enable-hierarchical-cache."""
    if not args.enable_hierarchical_cache:
        return None
    if args.disable_radix_cache:
        raise ValueError("--enable-hierarchical-cache needs the radix cache "
                         "(drop --disable-radix-cache)")
    t0 = time.perf_counter()
    pool = runner.token_to_kv_pool
    fp = KVFingerprint(
        weights_sha256=weights_sha256(model_path, cache_root()),
        kv_dtype=str(pool.dtype).removeprefix("torch."), num_layers=pool.num_layers,
        kv_heads=pool.kv_heads, head_dim=pool.head_dim, page_size=runner.page_size,
        block_tokens=storage_block_tokens(runner.page_size),
        rope=rope_signature(runner.model_config), tp_rank=runner.ctx.tp_rank,
        tp_size=runner.ctx.tp_size)
    logger.info("hicache: KV fingerprint %s in %.2f s (weights sha256 %s...)",
                fp.digest().hex(), time.perf_counter() - t0, fp.weights_sha256[:12])
    host = host_tier_bytes(args.hicache_size, args.hicache_ratio, runner.plan.kv_bytes,
                           runner.device.type)
    # The OOM advice weighs the host tier (RAM, not device memory): the plan carries it.
    runner.plan = dataclasses.replace(runner.plan, host_tier_bytes=host)
    storage_dir = args.hicache_storage_dir or str(cache_root() / "hicache")
    tiers = TierPlan(runner.plan.kv_bytes_per_token, parse_size(args.hicache_storage_size),
                     host, pinned=runner.device.type == "cuda")
    logger.info("%s\n  storage dir: %s", "\n".join(tiers.lines(runner.plan.kv_tokens)),
                storage_dir)
    return HiCacheConfig(storage_dir=storage_dir, storage_bytes=parse_size(args.hicache_storage_size),
                         write_policy=args.hicache_write_policy, fingerprint=fp,
                         sync_loads=runner.ctx.tp_size > 1, host_bytes=host,
                         pin_host=runner.device.type == "cuda")

