"""The CPU kernels as torch custom ops (`radixlm::...`), callable eagerly and traceable by
torch.compile (each op has a fake implementation giving its output's shape).

`decode_attention_available()` says whether the kernel built on this machine; callers keep
their torch fallback for when it did not.
"""

from __future__ import annotations

import torch

from radixlm.attention.cpu_kernels.build import load_kernel


def decode_attention_available() -> bool:
    return load_kernel("decode_attention") is not None


def decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                     req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """`paged_decode_attention`: the op while torch.compile traces, else the kernel called
    directly (eagerly the op's dispatch through torch.library costs more than the kernel
    at small batches)."""
    if torch.compiler.is_compiling():
        return paged_decode_attention(q, k_buf, v_buf, req_to_token, req_pool_indices,
                                      seq_lens, scale)
    return load_kernel("decode_attention").paged_decode_attention(
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale)


@torch.library.custom_op("radixlm::paged_decode_attention", mutates_args=(), device_types="cpu")
def paged_decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                           req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of each request's one query token q [B, H, D] over its first seq_lens[b]
    positions, K/V read in place from one pool layer [S + 1, KVH, D] through
    req_to_token[req_pool_indices[b]] (int32); returns [B, H, D] in q's dtype."""
    return load_kernel("decode_attention").paged_decode_attention(
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale)


@paged_decode_attention.register_fake
def _(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)
