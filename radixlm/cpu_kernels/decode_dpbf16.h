// The bf16 dot-product decode attention kernel (AVX512-BF16, 16-float vectors), included
// by decode_attention.cpp. RADIXLM_DECODE_DPBF16 says whether it is compiled in.
//
// Invariants: bf16 queries and KV only; the output equals softmax(q K^T scale) V up to
// bf16 rounding of the probabilities (their sum is of the rounded values).
#pragma once

// -DRADIXLM_DECODE_DPBF16=0 leaves the kernel out (a test builds the float32 block kernel so).
#if !defined(RADIXLM_DECODE_DPBF16)
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    (!defined(RADIXLM_SIMD_LANES) || RADIXLM_SIMD_LANES == 16)
#define RADIXLM_DECODE_DPBF16 1
#else
#define RADIXLM_DECODE_DPBF16 0
#endif
#endif

#if RADIXLM_DECODE_DPBF16
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "decode_task.h"
#include "fast_exp.h"
#include "simd.h"

namespace decode_dp {

using decode_task::begin_task;
using decode_task::KvWrite;
using decode_task::prefetch_row;

// The dp kernel's online softmax step for one head over a block: the block's scores sc
// (lanes past the end masked by `valid`) raise the running max m where they exceed it;
// the probabilities, rounded to bf16 (nearest even) so that lsum sums the weights V gets,
// go to p. Returns exp(m_old - m_new), 1 where the max stands: the factor by which the
// caller rescales what it accumulated (as it loads it: no branch on the data).
inline float softmax_step_dp(float& m, vf& lsum, float* p_out, vf sc, vf valid) {
  sc = valid != 0.f ? sc : splat(-INFINITY);
  const float m_new = std::max(m, hmax(sc));
  const vf pr = round_bf16(exp_vec(sc - m_new) * valid);
  const float corr = exp_approx(m - m_new);  // m = -inf (first block): ~0, nothing to rescale
  m = m_new;
  lsum = lsum * corr + pr;
  store(p_out, pr);
  return corr;
}

// The V sums of two positions' rows unpacked by 16-bit word (per 128-bit lane) hold, in
// vector u = 2 c + (0 lo, 1 hi) and lane n, dim 32 c + 8 (n / 4) + 4 (u % 2) + n % 4.
// Lane indices that put vectors 2 c and 2 c + 1 back in order: dims 32 c + 0..15 (lo)
// and + 16..31 (hi).
struct UndoUnpack {
  __m512i lo, hi;
  UndoUnpack() {
    alignas(64) int32_t a[16], b[16];
    for (int t = 0; t < 16; ++t) {
      a[t] = 16 * ((t % 8) / 4) + 4 * (t / 8) + t % 4;
      b[t] = a[t] + 8;
    }
    lo = _mm512_load_si512(a);
    hi = _mm512_load_si512(b);
  }
};

// out[g][0, D) = acc[g][0, D) (the unpack's order) * inv, in dim order, as bf16.
inline void write_unpacked(const float* acc, float inv, int64_t D, const UndoUnpack& undo,
                           c10::BFloat16* out) {
  const __m512 s = _mm512_set1_ps(inv);
  for (int64_t d = 0; d < D; d += 32) {
    const __m512 a = _mm512_loadu_ps(acc + d), b = _mm512_loadu_ps(acc + d + 16);
    const __m512 lo = _mm512_mul_ps(_mm512_permutex2var_ps(a, undo.lo, b), s);
    const __m512 hi = _mm512_mul_ps(_mm512_permutex2var_ps(a, undo.hi, b), s);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), (__m256i)_mm512_cvtneps_pbh(lo));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d + 16), (__m256i)_mm512_cvtneps_pbh(hi));
  }
}

// Rows asked for this many positions ahead, spread over the block's loops (16 beat 32
// and 64, and one burst of a block's 32 rows, on an AMX Xeon).
constexpr int64_t kDpAhead = 16;

// The online softmax's scratch of one thread (reused across its tasks), for G heads of D dims.
struct Scratch {
  std::vector<float> acc, p;             // [G, D] sums (the unpack's dim order), [G, 16]
  std::vector<c10::BFloat16> zero;       // [D] zeros: the rows of a block's missing positions
  std::vector<float> m;                  // [G] running max
  std::vector<vf> lsum, part;            // [G] sums by lane, [G, 16] partial score vectors
  Scratch(int64_t G, int64_t D)
      : acc(G * D), p(G * kLanes), zero(D, c10::BFloat16(0.f)), m(G), lsum(G), part(G * kLanes) {}
};

// The bf16 dot-product kernel: bf16 queries and KV, head_dim DC (a multiple of 32), GC
// query heads per KV head, on AVX512-BF16's vdpbf16ps (pairs of bf16 products summed into
// float32 lanes), the block kernel's loop otherwise (blocks of 16 positions, online
// softmax). Scores: q . k of a position as 16 partial sums, a K row's two bf16 halves
// against the raw query (no conversion of K), scaled after transpose_sum. V: the block's
// probabilities rounded to bf16 (as flash attention's P V product does; the softmax sums
// the rounded weights), two positions' V rows interleaved by 16-bit word (unpack, per
// 128-bit lane) so that one vdpbf16ps adds both positions' weighted values to 16 dims;
// the unpack's dim order is undone once per task when the output is written. Per
// position and head 2 (K) + 2 (V) instructions for 64 dims against the float32 block
// kernel's 4 + 4 FMAs and a conversion per row.
template <int DC, int GC>
void decode_blocks_dp(const c10::BFloat16* q, c10::BFloat16* kb, c10::BFloat16* vb,
                      const int32_t* r2t, int64_t r2t_stride, const int64_t* rows,
                      const int64_t* lens, c10::BFloat16* out, int64_t B, int64_t KVH,
                      float scale, int64_t window, KvWrite<c10::BFloat16> kv) {
  static_assert(kLanes == 16 && DC % 32 == 0, "16 float lanes, head_dim a multiple of 32");
  using bf16 = c10::BFloat16;
  constexpr int64_t D = DC, H = GC;
  constexpr int R = DC / 32;                                   // 512-bit vectors per row
  // Row vectors per V pass: 2 T GC accumulators in registers (at most 24), T dividing R.
  constexpr int T = std::min(R, 12 / GC >= 4 ? 4 : (12 / GC >= 2 ? 2 : 1));
  static_assert(R % T == 0, "V passes cover the row");
  const int64_t HQ = H * KVH;                                  // query heads
  const vf order = transpose_order();
  int order_i[kLanes];
  for (int k = 0; k < kLanes; ++k) order_i[k] = static_cast<int>(order[k]);
  const UndoUnpack undo;
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    Scratch s(GC, D);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / KVH, h = task % KVH;
      int64_t L;
      const int32_t* slots = begin_task(b, h, KVH, D, kb, vb, r2t, r2t_stride, rows, lens,
                                        window, kv, &L);
      __m512bh qv[GC][R];
      const bf16* qb = q + (b * HQ + h * GC) * D;
      for (int g = 0; g < GC; ++g)
        for (int r = 0; r < R; ++r) qv[g][r] = (__m512bh)_mm512_loadu_si512(qb + g * D + r * 32);
      std::fill(s.acc.begin(), s.acc.end(), 0.f);
      std::fill(s.m.begin(), s.m.end(), -INFINITY);
      std::fill(s.lsum.begin(), s.lsum.end(), vf{});
      const auto row = [&](bf16* buf, int64_t l) {
        return buf + (static_cast<int64_t>(slots[l]) * KVH + h) * D;
      };
      for (int64_t l0 = 0; l0 < L; l0 += kLanes) {
        const int64_t n = std::min<int64_t>(kLanes, L - l0);
        const bf16* kr[kLanes];
        const bf16* vr[kLanes];
        for (int j = 0; j < kLanes; ++j) kr[j] = j < n ? row(kb, l0 + j) : s.zero.data();
        for (int k = 0; k < kLanes; ++k) vr[k] = order_i[k] < n ? row(vb, l0 + order_i[k]) : s.zero.data();
        const vf valid = order < static_cast<float>(n) ? splat(1.f) : vf{};
        for (int j = 0; j < kLanes; ++j) {
          if (l0 + kDpAhead + j < L) prefetch_row(row(kb, l0 + kDpAhead + j), D);
          __m512 a[GC];
          for (int g = 0; g < GC; ++g) a[g] = _mm512_setzero_ps();
          for (int r = 0; r < R; ++r) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512(kr[j] + r * 32);
            for (int g = 0; g < GC; ++g) a[g] = _mm512_dpbf16_ps(a[g], x, qv[g][r]);
          }
          for (int g = 0; g < GC; ++g) s.part[g * kLanes + j] = (vf)a[g];
        }
        // The probabilities as bf16 pairs: pairs[g][i] = (p of lane 2i, p of lane 2i + 1).
        alignas(64) uint32_t pairs[GC][kLanes / 2];
        float corr[GC];
        for (int g = 0; g < GC; ++g) {
          corr[g] = softmax_step_dp(s.m[g], s.lsum[g], s.p.data() + g * kLanes,
                                    transpose_sum(s.part.data() + g * kLanes) * scale, valid);
          _mm256_store_si256(reinterpret_cast<__m256i*>(pairs[g]),
                             (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s.p.data() + g * kLanes)));
        }
        for (int r0 = 0; r0 < R; r0 += T) {
          __m512 acc[GC][2 * T];
          for (int g = 0; g < GC; ++g)
            for (int t = 0; t < 2 * T; ++t)
              acc[g][t] = _mm512_mul_ps(_mm512_loadu_ps(s.acc.data() + g * D + (2 * r0 + t) * kLanes),
                                        _mm512_set1_ps(corr[g]));
          for (int i = 0; i < kLanes / 2; ++i) {
            if (r0 == 0) {
              for (int64_t l = l0 + kDpAhead + 2 * i; l < std::min<int64_t>(L, l0 + kDpAhead + 2 * i + 2); ++l)
                prefetch_row(row(vb, l), D);
            }
            __m512i w[GC];
            for (int g = 0; g < GC; ++g) w[g] = _mm512_set1_epi32(static_cast<int>(pairs[g][i]));
            for (int t = 0; t < T; ++t) {
              const __m512i x = _mm512_loadu_si512(vr[2 * i] + (r0 + t) * 32);
              const __m512i y = _mm512_loadu_si512(vr[2 * i + 1] + (r0 + t) * 32);
              const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(x, y);
              const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(x, y);
              for (int g = 0; g < GC; ++g) {
                acc[g][2 * t] = _mm512_dpbf16_ps(acc[g][2 * t], lo, (__m512bh)w[g]);
                acc[g][2 * t + 1] = _mm512_dpbf16_ps(acc[g][2 * t + 1], hi, (__m512bh)w[g]);
              }
            }
          }
          for (int g = 0; g < GC; ++g)
            for (int t = 0; t < 2 * T; ++t)
              _mm512_storeu_ps(s.acc.data() + g * D + (2 * r0 + t) * kLanes, acc[g][t]);
        }
      }
      bf16* ob = out + (b * HQ + h * GC) * D;
      for (int g = 0; g < GC; ++g) {
        const float sum = hsum(s.lsum[g]);
        write_unpacked(s.acc.data() + g * D, sum > 0.f ? 1.f / sum : 0.f, D, undo, ob + g * D);
      }
    }
  });
}

}  // namespace decode_dp
#endif
