"""One step of the streaming (online) softmax shared by the decode and extend kernels.

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
