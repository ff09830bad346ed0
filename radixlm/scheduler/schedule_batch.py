"""ScheduleBatch: the requests of one step, their KV allocation, and the ForwardBatch.

`prepare_for_extend` / `prepare_for_decode` allocate the KV slots this step writes,
record them in req_to_token, and build the device tensors. They mutate the pools and
each Req's `req_pool_idx`; they do not advance `kv_len` (that happens once the forward
has run, in `commit_kv`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.executor.forward_batch import ForwardBatch, ForwardMode
from radixlm.mem import KVSlotAllocator, ReqToTokenPool, TokenToKVPool
from radixlm.mem.radix_cache import RadixCache
from radixlm.scheduler.req import Req


class OutOfKVSlots(RuntimeError):
    """Raised when a step needs more KV slots than are free; nothing was allocated."""


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    allocator: KVSlotAllocator
    device: torch.device
    tree_cache: RadixCache
    forward_batch: ForwardBatch | None = None

    def _alloc(self, n: int) -> torch.Tensor | None:
        """n free KV slots, evicting unlocked cache leaves (LRU) when short."""
        short = n - self.allocator.available_size()
        if short > 0:
            self.tree_cache.evict(short)
        return self.allocator.alloc(n)

    def prepare_for_extend(self) -> ForwardBatch:
        """Allocate slots for every request's extend tokens (rows and cached prefixes were
        set at admission); build the batch."""
        reqs = self.reqs
        extend_lens = [r.extend_input_len for r in reqs]
        slots = self._alloc(sum(extend_lens))
        if slots is None:
            raise OutOfKVSlots(f"extend needs {sum(extend_lens)} KV slots, "
                               f"{self.allocator.available_size()} free")
        assert all(r.req_pool_idx is not None for r in reqs), "admission allocates rows"
        input_ids: list[int] = []
        positions: list[torch.Tensor] = []
        offset = 0
        for r, n in zip(reqs, extend_lens):
            # Token positions kv_len .. kv_len+n-1 take slots[offset : offset + n]; for a
            # chunk (n < extend_len) the rest of the prompt waits for later steps.
            self.req_to_token_pool.write(r.req_pool_idx, r.kv_len, slots[offset:offset + n])
            input_ids.extend(r.fill_ids[r.kv_len:r.kv_len + n])
            positions.append(torch.arange(r.kv_len, r.kv_len + n))
            offset += n
        seq_lens = [r.kv_len + n for r, n in zip(reqs, extend_lens)]
        # The last token of request i sits at flat index cumsum(extend_lens)[i] - 1.
        logits_idx = torch.tensor(extend_lens).cumsum(0) - 1
        dev = self.device
        self.forward_batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(reqs),
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.cat(positions).to(dev),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            out_cache_loc=slots.to(dev),
            logits_indices=logits_idx.to(dev),
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=[r.kv_len for r in reqs],
            extend_seq_lens_cpu=extend_lens,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
        )
        return self.forward_batch

    def prepare_for_decode(self) -> ForwardBatch:
        """One slot per request for the K/V of its newest token (input of this step)."""
        reqs = self.reqs
        slots = self._alloc(len(reqs))
        if slots is None:
            raise OutOfKVSlots(f"decode needs {len(reqs)} KV slots, "
                               f"{self.allocator.available_size()} free")
        dev = self.device
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64, device=dev)
        positions = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64, device=dev)
        self.req_to_token_pool.req_to_token[rows, positions] = slots.to(dev, torch.int32)
        seq_lens_cpu = [r.kv_len + 1 for r in reqs]
        self.forward_batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=len(reqs),
            input_ids=torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64, device=dev),
            positions=positions,
            req_pool_indices=rows,
            seq_lens=positions + 1,
            out_cache_loc=slots.to(dev),
            logits_indices=torch.arange(len(reqs), device=dev),
            seq_lens_cpu=seq_lens_cpu,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
        )
        return self.forward_batch

    def commit_kv(self) -> None:
        """After the forward: every computed position now has its K/V in the pool."""
        for r, seq_len in zip(self.reqs, self.forward_batch.seq_lens_cpu):
            r.kv_len = seq_len
