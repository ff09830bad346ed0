"""The streaming (online) softmax shared by the decode and extend kernels: one step, and
the loop over a range of a request's positions in the KV pool.

For each query row the kernels keep a running max `m`, a running sum `l` of
exp(score - m) and an accumulator `acc` = sum_j exp(score_j - m) * v_j. A new block of
scores folds in by rescaling the old state by exp(m_old - m_new). `m` starts at a large
finite negative value (not -inf) so that a row whose keys are all masked (-inf scores)
keeps alpha = exp(0) = 1 and p = 0 instead of producing NaN from -inf - -inf.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The starting running max: far below any real score, but finite (see above). A constexpr
# so that jitted functions may read the global.
M_INIT = tl.constexpr(-1.0e30)


@triton.jit
def online_softmax_step(scores, v, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """scores [R, N] fp32 (masked keys hold -inf), v [N, D]; state m_i, l_i [R], acc [R, D].

    Returns the updated (m_i, l_i, acc).
    """
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_new, acc


@triton.jit
def attend_pool_range(q, m_i, l_i, acc, start, end, row, Req_to_token, stride_r2t,
                      K_buf, V_buf, stride_kt, stride_kh, stride_vt, stride_vh, kv_head,
                      offs_d, d_mask, sm_scale, BLOCK_N: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """Fold positions [start, end) of the request in req_to_token row `row` into the state
    of the query rows q [R, D]: their KV slots are read through req_to_token, then K and V
    of head `kv_head` from the pool (no causal mask: every position precedes the queries).
    Returns the updated (m_i, l_i, acc)."""
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        # KV slot of each position; masked positions read slot 0 (the dummy).
        loc = tl.load(Req_to_token + row * stride_r2t + offs_n, mask=n_mask, other=0).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K_buf + loc[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        v = tl.load(V_buf + loc[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(q.dtype)
        m_i, l_i, acc = online_softmax_step(scores, v, m_i, l_i, acc, DOT_PRECISION)
    return m_i, l_i, acc
