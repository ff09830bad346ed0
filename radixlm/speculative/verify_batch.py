"""The verify forward: every request's newest token plus its drafts as one EXTEND batch.

Request i contributes rows [newest, d_1..d_k] at positions kv_len .. kv_len + k over its
paged KV (the extend attention is causal within them); a request without drafts contributes
one row, as a decode. Logits are taken at every row (`logits_indices` = all T), so row j of
request i gives the target's next token after d_1..d_j. Slots are allocated like a prefill's
(`allocator.alloc_extend`); the caller gives rejected positions back (RequestKV.roll_back).
Raises OutOfKVSlots (nothing allocated) when short even after evicting the cache.
"""

from __future__ import annotations

import torch

from radixlm.forward_batch import ForwardBatch, ForwardMode
from radixlm.scheduler.schedule_batch import OutOfKVSlots, ScheduleBatch


def prepare_verify(batch: ScheduleBatch, drafts: list[list[int]]) -> ForwardBatch:
    """Fill `batch.forward_batch` (mode EXTEND) for `batch.reqs` and their `drafts`; every
    request has its newest token sampled and appended (kv_len == seq_len - 1)."""
    reqs = batch.reqs
    assert all(r.kv_len == r.seq_len - 1 and not r.pending_samples for r in reqs)
    ext_l = [1 + len(d) for d in drafts]
    prefix_l = [r.kv_len for r in reqs]
    rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
    prefix = torch.tensor(prefix_l, dtype=torch.int64)
    ext = torch.tensor(ext_l, dtype=torch.int64)
    batch._evict_for(prefix, prefix + ext)
    prefix_d = batch._dev(prefix)
    slots = batch.allocator.alloc_extend(prefix_d, batch._dev(ext),
                                         batch._last_slots(batch._dev(rows), prefix_d))
    if slots is None:
        raise OutOfKVSlots(f"verify needs {sum(ext_l)} tokens' KV slots, "
                           f"{batch.allocator.available_size()} free")
    total = sum(ext_l)
    req_of = torch.repeat_interleave(torch.arange(len(reqs)), ext, output_size=total)
    start = torch.cumsum(ext, 0) - ext
    positions = prefix[req_of] + torch.arange(total) - start[req_of]
    batch.req_to_token_pool.req_to_token[batch._dev(rows[req_of]), batch._dev(positions)] = \
        slots.to(batch.device, torch.int32)
    input_ids: list[int] = []
    for r, d in zip(reqs, drafts):
        input_ids.append(r.output_ids[-1] if r.output_ids else r.input_ids[-1])
        input_ids.extend(d)
    batch.forward_batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=len(reqs),
        input_ids=torch.tensor(input_ids, dtype=torch.int64), positions=positions,
        req_pool_indices=rows, seq_lens=prefix + ext, out_cache_loc=slots.to(batch.device),
        logits_indices=torch.arange(total),
        seq_lens_cpu=[p + n for p, n in zip(prefix_l, ext_l)],
        extend_prefix_lens_cpu=prefix_l, extend_seq_lens_cpu=ext_l,
        req_pool_indices_cpu=[r.req_pool_idx for r in reqs],
        extend_prefix_lens=prefix.to(torch.int32), extend_seq_lens=ext.to(torch.int32),
        extend_start_loc=start.to(torch.int32),
        req_to_token_pool=batch.req_to_token_pool, token_to_kv_pool=batch.token_to_kv_pool)
    return batch.forward_batch
