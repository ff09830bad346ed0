"""Pools: the three objects of the KV addressing chain, built once from the memory plan and
shared by the model runner (forwards) and the scheduler (allocation, radix cache).

`build_pools(plan, ...)` allocates exactly what the plan says: `plan.max_running_requests`
req_to_token rows of `plan.context_len` positions and `plan.kv_tokens` KV slots in pages
of `plan.page_size` (docs/memory.md, "The addressing chain")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixlm.mem.kv_slot_allocator import KVSlotAllocator
from radixlm.mem.req_to_token_pool import ReqToTokenPool
from radixlm.mem.token_to_kv_pool import TokenToKVPool

if TYPE_CHECKING:
    from radixlm.planning.planner import MemoryPlan


@dataclass
class Pools:
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    allocator: KVSlotAllocator


def build_pools(plan: "MemoryPlan", *, num_layers: int, kv_heads: int, head_dim: int,
                kv_dtype: torch.dtype, device: torch.device) -> Pools:
    """`kv_heads`: this tensor-parallel rank's KV heads."""
    return Pools(
        req_to_token_pool=ReqToTokenPool(plan.max_running_requests, plan.context_len, device),
        token_to_kv_pool=TokenToKVPool(plan.kv_tokens, num_layers, kv_heads, head_dim,
                                       kv_dtype, device),
        allocator=KVSlotAllocator(plan.kv_tokens, device, plan.page_size))
