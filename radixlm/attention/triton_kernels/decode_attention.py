"""Decode attention with split-KV (flash-decoding) over req_to_token, for GQA.

Stage 1: for each (request b, KV head, split s) one program reads positions
[s * split_len, min((s + 1) * split_len, seq_len)) of request b's K/V through
req_to_token, for the block of query heads that share that KV head (one `tl.dot` serves
the whole group), and writes the normalized partial output and its log-sum-exp
lse = m + log(l) per (b, head, s).
Stage 2: for each (b, head) the splits are combined: out = sum_s w_s * o_s / sum_s w_s
with w_s = exp(lse_s - max lse). Splitting keeps the GPU busy when the batch is small
and the sequences long.

The split count is per request, on the device (`num_kv_splits[b]`, see
`num_kv_splits_for`), and the grid always has `max_kv_splits` split programs (those past
a request's count do nothing): shapes depend only on the batch size, never on a host
read of seq_lens, which CUDA-graph capture needs later.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.attention.triton_kernels.online_softmax import M_INIT, attend_pool_range


@triton.jit
def _decode_stage1(Q, K_buf, V_buf, Req_to_token, Req_pool_indices, Seq_lens, Num_splits,
                   Mid_o, Mid_lse, sm_scale,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                   stride_r2t, stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    s = tl.program_id(2)
    # Program axis 1 enumerates (kv_head, block of BLOCK_H query heads inside its group):
    # query head kv_head * GROUP + g, 0 <= g < GROUP, attends to kv_head. A block never
    # straddles two groups; rows g >= GROUP are padding (masked).
    blocks_per_group: tl.constexpr = (GROUP + BLOCK_H - 1) // BLOCK_H
    kv_head = hb // blocks_per_group
    g = (hb % blocks_per_group) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = g < GROUP
    heads = kv_head * GROUP + g
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    seq_len = tl.load(Seq_lens + b)
    n_splits = tl.load(Num_splits + b)
    split_len = tl.cdiv(seq_len, n_splits)
    start = s * split_len
    end = tl.minimum(start + split_len, seq_len)
    # Splits past the request's count, or empty at the tail, write nothing; stage 2
    # recomputes the same ranges and skips them.
    if end > start:
        row = tl.load(Req_pool_indices + b).to(tl.int64)
        q = tl.load(Q + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=h_mask[:, None] & d_mask[None, :], other=0.0)
        m_i = tl.full([BLOCK_H], M_INIT, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        m_i, l_i, acc = attend_pool_range(
            q, m_i, l_i, acc, start, end, row, Req_to_token, stride_r2t, K_buf, V_buf,
            stride_kt, stride_kh, stride_vt, stride_vh, kv_head, offs_d, d_mask, sm_scale,
            BLOCK_N, DOT_PRECISION)
        out_mask = h_mask[:, None] & d_mask[None, :]
        tl.store(Mid_o + b * stride_mob + heads[:, None] * stride_moh + s * stride_mos
                 + offs_d[None, :], acc / l_i[:, None], mask=out_mask)
        tl.store(Mid_lse + b * stride_mlb + heads * stride_mlh + s, m_i + tl.log(l_i),
                 mask=h_mask)


@triton.jit
def _decode_stage2(Mid_o, Mid_lse, O, Seq_lens, Num_splits,
                   stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh,
                   stride_ot, stride_oh,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    seq_len = tl.load(Seq_lens + b)
    n_splits = tl.load(Num_splits + b)
    split_len = tl.cdiv(seq_len, n_splits)
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in range(0, n_splits):
        # The same ranges as stage 1; an empty split wrote nothing and is skipped. Split 0
        # is never empty (seq_len >= 1), so m is finite after it.
        if s * split_len < seq_len:
            lse = tl.load(Mid_lse + b * stride_mlb + h * stride_mlh + s + tl.arange(0, 1))
            o = tl.load(Mid_o + b * stride_mob + h * stride_moh + s * stride_mos + offs_d,
                        mask=d_mask, other=0.0)
            m_new = tl.maximum(m, lse)
            alpha = tl.exp(m - m_new)
            w = tl.exp(lse - m_new)
            acc = acc * alpha + w * o
            w_sum = w_sum * alpha + w
            m = m_new
    tl.store(O + b * stride_ot + h * stride_oh + offs_d, (acc / w_sum).to(O.dtype.element_ty),
             mask=d_mask)


def num_kv_splits_for(seq_lens: torch.Tensor, max_kv_splits: int,
                      min_split_tokens: int) -> torch.Tensor:
    """Per request: ceil(seq_len / min_split_tokens) splits, between 1 and max_kv_splits
    (int32, on the device of seq_lens; no host sync)."""
    splits = (seq_lens + (min_split_tokens - 1)) // min_split_tokens
    return splits.clamp(1, max_kv_splits).to(torch.int32)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use exact fp32 dots (tf32 would drift from the torch backend); the
    setting has no effect on fp16/bf16 inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def alloc_mid(batch: int, heads: int, head_dim: int, max_kv_splits: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage-1 scratch: per (request, head, split) the partial output [.., head_dim] and
    its log-sum-exp, fp32. Uninitialized: stage 2 reads only splits stage 1 wrote."""
    return (torch.empty((batch, heads, max_kv_splits, head_dim), dtype=torch.float32, device=device),
            torch.empty((batch, heads, max_kv_splits), dtype=torch.float32, device=device))


def decode_attention_fwd(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                         o: torch.Tensor, req_to_token: torch.Tensor,
                         req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         num_kv_splits: torch.Tensor, max_kv_splits: int, sm_scale: float,
                         block_n: int = 64, block_h: int = 16, num_warps: int = 4,
                         mid: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """o[b] = softmax(q[b] K_b^T * sm_scale) V_b for one decode token per request.

    q, o: [B, heads, head_dim] (last dim contiguous); k_buf, v_buf: the pool's
    [slots, kv_heads, head_dim]; req_to_token: [rows, context]; req_pool_indices,
    seq_lens, num_kv_splits: [B]. `mid`: scratch from `alloc_mid` (allocated here when
    None; the layers of one pass can share it). Writes o and the scratch only.
    """
    batch, heads, head_dim = q.shape
    kv_heads = k_buf.shape[1]
    assert heads % kv_heads == 0, (heads, kv_heads)
    assert q.stride(-1) == 1 and o.stride(-1) == 1 and k_buf.stride(-1) == 1 and v_buf.stride(-1) == 1
    group = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    # tl.dot needs at least 16 rows: a group smaller than that is padded with masked rows.
    block_h = max(16, min(block_h, triton.next_power_of_2(group)))
    mid_o, mid_lse = mid if mid is not None else alloc_mid(batch, heads, head_dim, max_kv_splits,
                                                           q.device)
    assert mid_o.shape == (batch, heads, max_kv_splits, head_dim), mid_o.shape
    grid1 = (batch, kv_heads * triton.cdiv(group, block_h), max_kv_splits)
    _decode_stage1[grid1](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, num_kv_splits,
        mid_o, mid_lse, sm_scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        req_to_token.stride(0), mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(q.dtype), num_warps=num_warps, num_stages=2)
    _decode_stage2[(batch, heads)](
        mid_o, mid_lse, o, seq_lens, num_kv_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        o.stride(0), o.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, num_warps=num_warps)
