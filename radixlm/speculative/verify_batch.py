"""The verify forward: every request's newest token plus its drafts as one TARGET_VERIFY
batch (laid out as an EXTEND; the CPU torch backend runs its rows as decode rows).

Request i contributes rows [newest, d_1..d_k] at positions kv_len .. kv_len + k over its
paged KV (causal within them: row j attends to the prefix and rows 0..j); a request
without drafts contributes one row, as a decode. Logits are taken at every row
(`logits_indices` = all T), so row j of request i gives the target's next token after
d_1..d_j. Slots are allocated like a prefill's
(`allocator.alloc_extend`); the caller gives rejected positions back (RequestKV.roll_back).
Raises OutOfKVSlots (nothing allocated) when short even after evicting the cache.
"""

from __future__ import annotations

import torch

from radixlm.forward_batch import ForwardBatch, ForwardMode
from radixlm.scheduler.schedule_batch import ScheduleBatch


def prepare_verify(batch: ScheduleBatch, drafts: list[list[int]]) -> ForwardBatch:
    """Fill `batch.forward_batch` (mode TARGET_VERIFY) for `batch.reqs` and their `drafts`;
    every request has its newest token sampled and appended (kv_len == seq_len - 1)."""
    reqs = batch.reqs
    assert all(r.kv_len == r.seq_len - 1 and not r.pending_samples for r in reqs)
    es = batch.alloc_extend_slots([1 + len(d) for d in drafts], "verify")
    input_ids: list[int] = []
    for r, d in zip(reqs, drafts):
        input_ids.append(r.output_ids[-1] if r.output_ids else r.input_ids[-1])
        input_ids.extend(d)
    return batch.extend_forward_batch(es, ForwardMode.TARGET_VERIFY, input_ids,
                                      torch.arange(len(input_ids)))
