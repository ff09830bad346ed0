"""The CPU kernels for callers: decode attention as a torch op
(`radixlm::paged_decode_attention`, implemented by the kernel's library, traceable by
torch.compile: a fake implementation here gives its output's shape) and, eagerly, with
the pool's KV write fused in; RMSNorm (with the residual add), RoPE and SiLU * up for the
eager forward only (under torch.compile inductor fuses the torch versions itself); the
sampler's argmax and draw.

Each `*_available()` / `eager_kernels()` says whether the kernel built on this machine;
callers keep their torch code for when it did not.
"""

from __future__ import annotations

from types import ModuleType

import torch

from radixlm.cpu_kernels.build import load_kernel
from radixlm.cpu_kernels.kernel_ops import kernel_op


def decode_attention_available() -> bool:
    return load_kernel("decode_attention") is not None


def decode_attention_with_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   k_buf: torch.Tensor, v_buf: torch.Tensor,
                                   loc: torch.Tensor, req_to_token: torch.Tensor,
                                   req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                                   scale: float, window: int = 0,
                                   kv_first: bool = False) -> torch.Tensor:
    """Eager only: writes the step's k/v [B, KVH, D] into k_buf/v_buf at slots `loc` [B]
    (the pool's set_kv), then `paged_decode_attention`, in one call of the kernel.
    kv_first: all rows are written before any attends (rows that read each other's K/V:
    a verify batch's rows, several per request); else each row's write is fused into
    its own task."""
    return load_kernel("decode_attention").paged_decode_attention(
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale, window, k, v, loc,
        kv_first)


@kernel_op("paged_decode_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, "
           "Tensor req_pool_indices, Tensor seq_lens, float scale, int window=0) -> Tensor")
def _(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale, window=0):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def paged_decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                           req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float, window: int = 0) -> torch.Tensor:
    """Attention of each request's one query token q [B, H, D] over its first seq_lens[b]
    positions (the last `window` of them; 0 = all), K/V read in place from one pool layer
    [S + 1, KVH, D] through req_to_token[req_pool_indices[b]] (int32); returns [B, H, D]
    in q's dtype. The op compiled decode graphs hold (the KV write stays a separate
    index_put there, which inductor generates itself). Eagerly the kernel loads first
    (its library implements the op); a traced graph's caller has loaded it."""
    if not torch.compiler.is_dynamo_compiling():
        load_kernel("decode_attention")
    return torch.ops.radixlm.paged_decode_attention(q, k_buf, v_buf, req_to_token,
                                                    req_pool_indices, seq_lens, scale, window)


def sampling_kernel() -> ModuleType | None:
    """The sampler's argmax and inverse-CDF draw (`sampling.cpp`), or None where it did
    not build (the sampler's torch code then)."""
    return load_kernel("sampling")


def eager_kernels(x: torch.Tensor) -> ModuleType | None:
    """The norm/RoPE kernels (`norm_rope.cpp`) when they apply to x: a 2-D CPU tensor in
    an eager forward, the kernels built; else None (use the torch code)."""
    # Called several times per layer: is_dynamo_compiling() first (x's attributes stay out
    # of a traced graph), then `is_cpu` (a flag; `x.device` builds a device object per
    # call).
    if torch.compiler.is_dynamo_compiling() or not x.is_cpu or x.dim() != 2:
        return None
    return load_kernel("norm_rope")
