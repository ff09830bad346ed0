"""Split a ForwardBatch by requests: the forward worker's answer to an out-of-memory forward.

A launched batch cannot be undone cheaply (its KV slots are recorded, its prompt KV is in
the radix cache), but it can be *executed* in pieces: requests [0, k) and [k, B) run as
two forwards over the very same slots, positions and pool rows, and their logits are
concatenated. Each request's K/V and logits depend only on its own tokens and its own
prefix in the pool, so the result is the batch's (up to batch-size dependent rounding,
none under --enable-deterministic-inference). The activation peak roughly halves with
each split, so a batch that fits in no smaller piece is a single request.

Index arithmetic: the batch's tokens are flat, request i owning tokens
[start_i, start_i + n_i) with n_i = extend_seq_lens_cpu[i] (1 in DECODE); a piece of
requests [a, b) takes tokens [start_a, start_b) and its logits_indices are recomputed
within the piece (the last token of each request: cumsum(n) - 1).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from radixlm.forward_batch import ForwardBatch


def token_counts(fb: ForwardBatch) -> list[int]:
    return (list(fb.extend_seq_lens_cpu) if fb.extend_seq_lens_cpu is not None
            else [1] * fb.batch_size)


def slice_forward_batch(fb: ForwardBatch, a: int, b: int) -> ForwardBatch:
    """Requests [a, b) of `fb` as a batch of their own. The forward worker has already
    written any placeholder (future) tokens into input_ids: the piece carries none."""
    counts = token_counts(fb)
    starts = [0, *itertools.accumulate(counts)]
    t0, t1 = starts[a], starts[b]
    n = torch.tensor(counts[a:b], dtype=torch.int64, device=fb.input_ids.device)
    return dataclasses.replace(
        fb, batch_size=b - a,
        input_ids=fb.input_ids[t0:t1], positions=fb.positions[t0:t1],
        out_cache_loc=fb.out_cache_loc[t0:t1],
        req_pool_indices=fb.req_pool_indices[a:b], seq_lens=fb.seq_lens[a:b],
        logits_indices=torch.cumsum(n, 0) - 1,
        seq_lens_cpu=fb.seq_lens_cpu[a:b],
        extend_prefix_lens_cpu=(None if fb.extend_prefix_lens_cpu is None
                                else fb.extend_prefix_lens_cpu[a:b]),
        extend_seq_lens_cpu=None if fb.extend_seq_lens_cpu is None else counts[a:b],
        req_pool_indices_cpu=(None if fb.req_pool_indices_cpu is None
                              else fb.req_pool_indices_cpu[a:b]),
        # Rebuilt from the lists by extend_index_tensors (start locs restart at 0).
        extend_prefix_lens=None, extend_seq_lens=None, extend_start_loc=None,
        attn_backend=None, future_token_idx=None, future_token_rows=None)


def halves(fb: ForwardBatch) -> tuple[ForwardBatch, ForwardBatch]:
    """Two pieces with about half of the batch's tokens each (at least one request each)."""
    counts = token_counts(fb)
    total, acc, k = sum(counts), 0, 1
    for i, c in enumerate(counts[:-1]):
        acc += c
        k = i + 1
        if 2 * acc >= total:
            break
    return slice_forward_batch(fb, 0, k), slice_forward_batch(fb, k, fb.batch_size)
