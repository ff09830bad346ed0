"""ForwardBatch: the description of one forward pass.

Built by `ScheduleBatch.prepare_for_extend/decode` with host tensors (except
out_cache_loc); the forward worker puts them on the device at launch
(`executor/cuda_streams.py`: on CUDA an async upload on a copy stream; on the CPU they are
used as built). Read by the model and the attention backend.
Tokens of all requests are packed in one flat dimension T (no padding):

    EXTEND: request i contributes extend_seq_lens[i] new tokens at positions
            prefix_lens[i] .. seq_lens[i]-1; its prefix K/V is already in the pool.
    DECODE: every request contributes exactly one token at position seq_lens[i]-1.
    TARGET_VERIFY: laid out as EXTEND (newest token + drafts); rows may run as decodes.

`out_cache_loc[t]` is the KV slot where token t's K/V is written; the same slots have
already been recorded in `req_to_token` so attention can read them back through it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from radixlm.mem.req_to_token_pool import ReqToTokenPool
    from radixlm.mem.token_to_kv_pool import TokenToKVPool


class AttentionRunner(Protocol):
    """What a layer calls through the batch: attention/base.py's AttentionBackend (named
    here by shape, so this ground module imports nothing above it)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: object,
                forward_batch: "ForwardBatch") -> torch.Tensor: ...


class ForwardMode(enum.Enum):
    EXTEND = enum.auto()  # prefill, possibly on top of a cached prefix
    DECODE = enum.auto()  # one new token per request
    MIXED = enum.auto()  # prefill chunk + running decodes (as 1-token extends) in one pass
    IDLE = enum.auto()  # nothing to run
    # The speculative verify: an EXTEND (newest token + drafts per request, logits at every
    # row) that a backend may run as one decode row per token (SGLang's name).
    TARGET_VERIFY = enum.auto()

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    req_pool_indices: torch.Tensor  # [B] int64, rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64, length after this pass
    out_cache_loc: torch.Tensor  # [T] int64, KV slots written this pass
    # Index into T of the token whose logits each request needs (its last one);
    # tests may pass arange(T) to get every position's logits.
    logits_indices: torch.Tensor  # [B] int64
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int] | None = None  # EXTEND only
    extend_seq_lens_cpu: list[int] | None = None  # EXTEND only
    req_pool_indices_cpu: list[int] | None = None  # EXTEND only (None: read the tensor)
    # EXTEND only, [B] int32 for the kernels: request b's cached prefix length, its new
    # tokens, and the flat index of its first new token (= sum of the earlier requests'
    # new tokens). Built with the batch, so on CUDA they are uploaded with it at launch;
    # None in batches built by hand (see `extend_index_tensors`).
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_start_loc: torch.Tensor | None = None
    req_to_token_pool: "ReqToTokenPool | None" = None
    token_to_kv_pool: "TokenToKVPool | None" = None
    attn_backend: "AttentionRunner | None" = None
    # Overlap scheduling: input_ids[future_token_idx] are placeholders for tokens that were
    # still being sampled when the batch was built; the forward worker fills them from its
    # token relay (relay[future_token_rows], indexed by req_to_token row) before running.
    future_token_idx: torch.Tensor | None = None  # [F] int64 indices into input_ids
    future_token_rows: torch.Tensor | None = None  # [F] int64 req_to_token rows

    def extend_index_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(prefix lens, extend lens, start locs) as [B] int32 on the batch's device: the
        staged fields, or, when the batch was built without them, from the *_cpu lists (a
        host->device copy, which on CUDA waits for the stream)."""
        if self.extend_start_loc is not None:
            return self.extend_prefix_lens, self.extend_seq_lens, self.extend_start_loc
        prefix = torch.tensor(self.extend_prefix_lens_cpu, dtype=torch.int32)
        ext = torch.tensor(self.extend_seq_lens_cpu, dtype=torch.int32)
        start = torch.cumsum(ext, 0, dtype=torch.int32) - ext
        dev = self.input_ids.device
        return prefix.to(dev), ext.to(dev), start.to(dev)
