"""Extend (prefill) attention: new tokens attend to their cached prefix and causally to
each other, for GQA. MIXED batches use it too (a decode is a one-token extend).

One program per (request b, query head h, block of BLOCK_M new tokens). Query i of
request b (0 <= i < extend_len) sits at absolute position prefix_len + i and sees
  1. every cached prefix position 0 .. prefix_len-1, read from the pool through
     req_to_token[row, :prefix_len], then
  2. the new tokens j <= i, read straight from this pass's k/v tensors (rows
     extend_start + j of the flat T dimension), which are also in the pool by now.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.attention.triton_kernels.decode_attention import dot_precision
from radixlm.attention.triton_kernels.online_softmax import (M_INIT, attend_pool_range,
                                                             online_softmax_step)


@triton.jit
def _extend_kernel(Q, K_ext, V_ext, O, K_buf, V_buf, Req_to_token, Req_pool_indices,
                   Prefix_lens, Extend_lens, Extend_start, sm_scale,
                   stride_qt, stride_qh, stride_ket, stride_keh, stride_vet, stride_veh,
                   stride_ot, stride_oh, stride_kt, stride_kh, stride_vt, stride_vh, stride_r2t,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mb = tl.program_id(2)
    ext_len = tl.load(Extend_lens + b)
    m_start = mb * BLOCK_M
    # The grid covers the longest extend in the batch; shorter requests' extra blocks exit.
    if m_start < ext_len:
        prefix_len = tl.load(Prefix_lens + b)
        q_start = tl.load(Extend_start + b).to(tl.int64)
        row = tl.load(Req_pool_indices + b).to(tl.int64)
        kv_head = h // GROUP
        offs_m = m_start + tl.arange(0, BLOCK_M)  # query index inside the extend
        m_mask = offs_m < ext_len
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < HEAD_DIM
        q = tl.load(Q + (q_start + offs_m[:, None]) * stride_qt + h * stride_qh + offs_d[None, :],
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # 1. The cached prefix, through req_to_token: no causal mask (all of it precedes).
        m_i, l_i, acc = attend_pool_range(
            q, m_i, l_i, acc, 0, prefix_len, row, Req_to_token, stride_r2t, K_buf, V_buf,
            stride_kt, stride_kh, stride_vt, stride_vh, kv_head, offs_d, d_mask, sm_scale,
            BLOCK_N, DOT_PRECISION)

        # 2. The new tokens, causal: query i sees j <= i, so this block of queries needs
        # keys only up to its last query, min(m_start + BLOCK_M, ext_len) - 1.
        n_end = tl.minimum(m_start + BLOCK_M, ext_len)
        for n0 in range(0, n_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < n_end
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(K_ext + (q_start + offs_n[:, None]) * stride_ket + kv_head * stride_keh
                        + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale
            visible = n_mask[None, :] & (offs_n[None, :] <= offs_m[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            v = tl.load(V_ext + (q_start + offs_n[:, None]) * stride_vet + kv_head * stride_veh
                        + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
            m_i, l_i, acc = online_softmax_step(scores, v, m_i, l_i, acc, DOT_PRECISION)

        # Every real query sees at least key j = 0 of step 2, so l_i > 0 on its row.
        out = acc / l_i[:, None]
        tl.store(O + (q_start + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def extend_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                         k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                         req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                         extend_lens: torch.Tensor, extend_start: torch.Tensor,
                         max_extend_len: int, sm_scale: float, block_m: int = 64,
                         block_n: int = 64, num_warps: int = 4) -> None:
    """Attention of the T new tokens of a batch of extends.

    q, o: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim], this pass's new K/V
    (request b's tokens are rows extend_start[b] .. extend_start[b] + extend_lens[b] - 1);
    k_buf, v_buf: the pool's [slots, kv_heads, head_dim]; the prefix of request b is
    req_to_token[req_pool_indices[b], :prefix_lens[b]]. Writes o (mutates it) only.
    """
    _, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    assert heads % kv_heads == 0, (heads, kv_heads)
    for t in (q, k, v, o, k_buf, v_buf):
        assert t.stride(-1) == 1, "the head_dim axis must be contiguous"
    batch = extend_lens.shape[0]
    if batch == 0 or max_extend_len == 0:
        return
    block_d = max(16, triton.next_power_of_2(head_dim))
    grid = (batch, heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, k, v, o, k_buf, v_buf, req_to_token, req_pool_indices, prefix_lens, extend_lens,
        extend_start, sm_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
        v_buf.stride(1), req_to_token.stride(0),
        GROUP=heads // kv_heads, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d, DOT_PRECISION=dot_precision(q.dtype), num_warps=num_warps,
        num_stages=1)
