"""ScheduleBatch: the requests of one step, their KV allocation, and the ForwardBatch.

`prepare_for_extend` / `prepare_for_decode` allocate the KV slots this step writes,
record them in req_to_token, and build the ForwardBatch. They mutate the pools and
each Req's `req_pool_idx`; they do not advance `kv_len` (that happens once the forward
is launched, in `commit_kv`).

Slots come from the `KVSlotAllocator` in pages (`--page-size`, 1 by default): position i
of a request lives at offset i % page_size of its (i // page_size)-th page, so a step takes
a fresh page only for page-aligned positions; the others continue the request's partly
filled last page (the allocator reads the slot of the previous position from req_to_token).

More: docs/scheduler.md, "scheduler/schedule_batch.py".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.forward_batch import ForwardBatch, ForwardMode
from radixlm.mem import KVSlotAllocator, ReqToTokenPool, TokenToKVPool
from radixlm.mem.radix_cache import RadixCache
from radixlm.scheduler.req import Req


class OutOfKVSlots(RuntimeError):
    """Raised when a step needs more KV slots than are free; nothing was allocated."""


@dataclass
class ExtendSlots:
    """Where an extend's new tokens go (ScheduleBatch.alloc_extend_slots): per request its
    computed prefix and new-token count, flat token t's position and KV slot; host tensors
    except `slots` (the pools' device)."""
    prefix_lens: list[int]
    extend_lens: list[int]
    rows: torch.Tensor
    prefix: torch.Tensor
    ext: torch.Tensor
    start: torch.Tensor  # flat index of each request's first new token
    positions: torch.Tensor
    slots: torch.Tensor


@dataclass
class ScheduleBatch:
    reqs: list[Req]
    forward_mode: ForwardMode
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    allocator: KVSlotAllocator
    device: torch.device
    tree_cache: RadixCache
    # MIXED only: the last `num_mixed_decodes` of `reqs` are running requests decoding one
    # token each inside this extend batch (they come after every prefill request).
    num_mixed_decodes: int = 0
    forward_batch: ForwardBatch | None = None

    @property
    def extend_reqs(self) -> list[Req]:
        """The requests computing (a chunk of) their prompt."""
        return self.reqs[:len(self.reqs) - self.num_mixed_decodes]

    @property
    def decode_reqs(self) -> list[Req]:
        """MIXED: the running requests riding along as one-token extends."""
        return self.reqs[len(self.reqs) - self.num_mixed_decodes:]

    def _evict_for(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Evict unlocked cache leaves (LRU) when the free pages cannot grow every request
        from prefix_lens to seq_lens tokens. Mutates the cache and the allocator."""
        short = (self.allocator.new_slots_needed(prefix_lens, seq_lens)
                 - self.allocator.available_size())
        if short > 0:
            self.tree_cache.evict(short)

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        """`t` on the pools' device, for the bookkeeping done here (the identity on the CPU;
        on CUDA a small copy on the scheduler thread's stream, which no forward holds up)."""
        return t.to(self.device)

    def _last_slots(self, rows: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """The slot of position prefix_len - 1 of each row: where a partly filled last page
        continues (meaningless, and unused by the allocator, where prefix_len is page-aligned).
        Device tensors in and out."""
        prev = (prefix_lens - 1).clamp(min=0)
        return self.req_to_token_pool.req_to_token[rows, prev].to(torch.int64)

    def alloc_extend_slots(self, extend_lens: list[int], what: str = "extend") -> ExtendSlots:
        """Slots for extend_lens[i] new tokens of reqs[i] after its kv_len computed ones
        (evicting unlocked cache leaves when short), recorded in req_to_token. Raises
        OutOfKVSlots (nothing allocated) when the pool is short even after eviction."""
        reqs = self.reqs
        prefix_lens = [r.kv_len for r in reqs]
        # Host tensors (module docstring).
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        prefix = torch.tensor(prefix_lens, dtype=torch.int64)
        ext = torch.tensor(extend_lens, dtype=torch.int64)
        self._evict_for(prefix, prefix + ext)
        prefix_d = self._dev(prefix)
        slots = self.allocator.alloc_extend(prefix_d, self._dev(ext),
                                            self._last_slots(self._dev(rows), prefix_d))
        if slots is None:
            raise OutOfKVSlots(f"{what} needs {sum(extend_lens)} tokens' KV slots, "
                               f"{self.allocator.available_size()} free")
        # Flat token t belongs to request req_of[t]; it is that request's (t - start)-th
        # new token, at position prefix + t - start, and its K/V goes to slots[t].
        total = sum(extend_lens)
        req_of = torch.repeat_interleave(torch.arange(len(reqs)), ext, output_size=total)
        start = torch.cumsum(ext, 0) - ext
        positions = prefix[req_of] + torch.arange(total) - start[req_of]
        self.req_to_token_pool.req_to_token[self._dev(rows[req_of]), self._dev(positions)] = \
            slots.to(self.device, torch.int32)
        return ExtendSlots(prefix_lens, list(extend_lens), rows, prefix, ext, start, positions,
                           slots)

    def extend_forward_batch(self, es: ExtendSlots, mode: ForwardMode, input_ids: list[int],
                             logits_indices: torch.Tensor, **extra) -> ForwardBatch:
        """The EXTEND/MIXED ForwardBatch over `es` (kept as `self.forward_batch`)."""
        reqs = self.reqs
        self.forward_batch = ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=es.positions,
            req_pool_indices=es.rows,
            seq_lens=es.prefix + es.ext,
            out_cache_loc=es.slots.to(self.device),
            logits_indices=logits_indices,
            seq_lens_cpu=[p + n for p, n in zip(es.prefix_lens, es.extend_lens)],
            extend_prefix_lens_cpu=es.prefix_lens,
            extend_seq_lens_cpu=es.extend_lens,
            req_pool_indices_cpu=[r.req_pool_idx for r in reqs],
            extend_prefix_lens=es.prefix.to(torch.int32),
            extend_seq_lens=es.ext.to(torch.int32),
            extend_start_loc=es.start.to(torch.int32),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            **extra,
        )
        return self.forward_batch

    def prepare_for_extend(self) -> ForwardBatch:
        """Allocate slots for every request's extend tokens (rows and cached prefixes were
        set at admission; MIXED decodes take one slot each, as a decode does); record them
        in req_to_token; build the batch. Raises OutOfKVSlots (nothing allocated) when the
        pool is short even after eviction."""
        reqs = self.reqs
        riders = self.decode_reqs
        assert all(r.req_pool_idx is not None for r in reqs), "admission allocates rows"
        assert all(r.kv_len == r.seq_len + r.pending_samples - 1 for r in riders), \
            "a mixed decode computes 1 token"
        extend_lens = [r.extend_input_len for r in self.extend_reqs] + [1] * len(riders)
        es = self.alloc_extend_slots(extend_lens)
        input_ids: list[int] = []
        for r, n in zip(self.extend_reqs, extend_lens):
            # A chunk (n < extend_len) computes fill_ids[kv_len : kv_len + n]; the rest of
            # the prompt waits for later steps.
            input_ids.extend(r.fill_ids[r.kv_len:r.kv_len + n])
        rider_ids, future_idx, future_rows = _newest_tokens(riders, offset=len(input_ids))
        input_ids.extend(rider_ids)  # == fill_ids[kv_len], or a relay placeholder
        # The last token of request i sits at flat index cumsum(extend_lens)[i] - 1.
        return self.extend_forward_batch(es, self.forward_mode, input_ids,
                                         torch.cumsum(es.ext, 0) - 1,
                                         **_future_fields(future_idx, future_rows))

    def prepare_for_decode(self) -> ForwardBatch:
        """One slot per request for the K/V of its newest token (input of this step), at
        position kv_len: a fresh page when that position is page-aligned, else the next
        slot of its last page. Raises OutOfKVSlots (nothing allocated) when short."""
        reqs = self.reqs
        dev = self.device
        # Host tensors (module docstring).
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        positions = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64)
        self._evict_for(positions, positions + 1)
        rows_d, positions_d = self._dev(rows), self._dev(positions)
        slots = self.allocator.alloc_decode(positions_d, self._last_slots(rows_d, positions_d))
        if slots is None:
            raise OutOfKVSlots(f"decode of {len(reqs)} requests needs "
                               f"{self.allocator.new_slots_needed(positions, positions + 1)} "
                               f"KV slots, {self.allocator.available_size()} free")
        self.req_to_token_pool.req_to_token[rows_d, positions_d] = slots.to(dev, torch.int32)
        seq_lens_cpu = [r.kv_len + 1 for r in reqs]
        input_ids, future_idx, future_rows = _newest_tokens(reqs)
        self.forward_batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=len(reqs),
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=positions,
            req_pool_indices=rows,
            seq_lens=positions + 1,
            out_cache_loc=slots.to(dev),
            logits_indices=torch.arange(len(reqs)),
            seq_lens_cpu=seq_lens_cpu,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            **_future_fields(future_idx, future_rows),
        )
        return self.forward_batch

    def commit_kv(self) -> None:
        """Once the forward is launched: every position it computes counts as having its
        K/V in the pool (a later forward that reads them runs after this one)."""
        for r, seq_len in zip(self.reqs, self.forward_batch.seq_lens_cpu):
            r.kv_len = seq_len


def _newest_tokens(reqs: list[Req], offset: int = 0) -> tuple[list[int], list[int], list[int]]:
    """The decode input of each request: its newest token. When that token is still being
    sampled by a launched batch (`pending_samples` > 0, overlap scheduling), a placeholder
    0 goes in its place and (offset + i, row) is recorded, so the forward worker reads it
    from the token relay; the relay then holds the newest sample of that row, since
    batches run in launch order."""
    ids: list[int] = []
    future_idx: list[int] = []
    future_rows: list[int] = []
    for i, r in enumerate(reqs):
        if r.pending_samples:
            ids.append(0)
            future_idx.append(offset + i)
            future_rows.append(r.req_pool_idx)
        else:
            ids.append(r.output_ids[-1])
    return ids, future_idx, future_rows


def _future_fields(idx: list[int], rows: list[int]) -> dict:
    """The ForwardBatch's future_token_idx/rows, as host tensors (none when empty)."""
    if not idx:
        return {}
    return {"future_token_idx": torch.tensor(idx, dtype=torch.int64),
            "future_token_rows": torch.tensor(rows, dtype=torch.int64)}
