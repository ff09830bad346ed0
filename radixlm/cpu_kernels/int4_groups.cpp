// x @ W.T for 4-bit groupwise weights, w[n, k] = d[n, g] * q[n, k] + m[n, g] (g = k / 32,
// q in 0..15: GGUF's Q4_0/Q4_1/Q4_K), in the style of llama.cpp's Q4_1 x Q8_1 dot: each
// row of x is quantized once per call, per group of 32, to int8 (sx = max|x| / 127, round
// to nearest even) with the float32 sum S of the group's x kept for the m term, and
//
//     y[i, n] = sum_g d[n, g] * sx[i, g] * (q[n, g, :] . xq[i, g, :]) + m[n, g] * S[i, g]
//
// with the integer dot products exact (u8 x s8: _mm512_dpbusd_epi32 on AVX512-VNNI,
// _mm256_maddubs_epi16 + _mm256_madd_epi16 on AVX2: at most 4 * 2 * 15 * 127 per int16
// lane, no saturation; plain loops otherwise; the path is chosen at compile time,
// -DRADIXLM_INT4_PATH=1 (scalar) / 2 (AVX2) forces a narrower one).
//
// Weight layout (packed at load by models/linear/int4_blocks.py): the groups of a row in
// blocks of W = 4 groups, then one of 2 and one of 1 for the rest; a block is 16 W bytes,
// byte 4 l + j (l < 4 W, j < 4) holding column 4 (l / W) + j of group l % W in its low
// nibble and column 16 + 4 (l / W) + j in its high one. So a 32-bit lane l of a vector
// of the block belongs to group l % W: the nibbles need no shuffle, and the per-group
// scales are a broadcast of W values. The quantized x uses the same order per block (its
// low-column bytes, then its high-column bytes: 32 W bytes). d, m: [N, groups] float16
// (GGUF's own values, exact) or float32.
//
// Invariants: x [M, K] bf16 or float32 contiguous; K % 32 == 0; y [M, N] in x's dtype,
// float32 sums rounded once. Each weight byte is read from memory once per call whatever
// M is (rows of x are taken 8 at a time against one weight row, which stays in L1).
#include "torch_api.h"
#include "prefetch.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <cmath>
#include <vector>

#include "quantize_q8.h"
#include "simd.h"

#if !defined(RADIXLM_INT4_PATH)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__) && \
    defined(__AVX512DQ__)
#define RADIXLM_INT4_PATH 3
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define RADIXLM_INT4_PATH 2
#else
#define RADIXLM_INT4_PATH 1
#endif
#endif

namespace {

constexpr int kGroup = 32;
constexpr int kRowBlock = 8;  // rows of x computed together against one weight row

// Group g0's block width: 4 while 4 groups remain, then 2, then 1.
inline int block_width(int64_t g0, int64_t ng) {
  const int64_t left = ng - g0;
  return left >= 4 ? 4 : (left >= 2 ? 2 : 1);
}

// The first group of group g's block.
inline int64_t block_start(int64_t g, int64_t ng) {
  const int64_t ng4 = ng & ~int64_t{3};
  if (g < ng4) return g & ~int64_t{3};
  return (ng - ng4 >= 2 && g < ng4 + 2) ? ng4 : g;
}

// ---- activations -------------------------------------------------------------------

// 32 floats -> int8 out[32] = round(v * (1 / d)) (the product rounded to float, then to
// the nearest integer, ties to even: the same values on every path), d = max|v| / 127,
// sum = their float32 sum.
inline void quantize_group(const float* v, int8_t* out, float& d, float& sum) {
#if RADIXLM_INT4_PATH == 3
  const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  sum = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
  d = amax / 127.f;
  const __m512 id = _mm512_set1_ps(d != 0.f ? 1.f / d : 0.f);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, id))));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16),
                   _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, id))));
#elif RADIXLM_INT4_PATH == 2
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), quantize_group_q8(v, d, sum));
#else
  float amax = 0.f;
  sum = 0.f;
  for (int k = 0; k < kGroup; ++k) {
    amax = std::max(amax, std::fabs(v[k]));
    sum += v[k];
  }
  d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  // (a call: the product is not contracted into an FMA)
  for (int k = 0; k < kGroup; ++k)
    out[k] = static_cast<int8_t>(static_cast<int32_t>(std::nearbyint(v[k] * id)));
#endif
}

// One row of x [K] -> xq [K] int8 (block order, or plain column order if !blocked),
// sx [ng], sq [ng] = S / 4 (each group's m term is added in 4 vector lanes).
template <typename T>
void quantize_row(const T* x, int64_t K, bool blocked, int8_t* xq, float* sx, float* sq) {
  const int64_t ng = K / kGroup;
  alignas(64) int8_t plain[kGroup];
  for (int64_t g = 0; g < ng; ++g) {
    const T* xg = x + g * kGroup;
    float v[kGroup];
    for (int k = 0; k < kGroup; k += kLanes) store(v + k, load(xg + k));
    int8_t* out = blocked ? plain : xq + g * kGroup;
    float d, sum;
    quantize_group(v, out, d, sum);
    sx[g] = d;
    sq[g] = sum * 0.25f;
    if (blocked) {
      // Group g is member gi of the block starting at g0 (W groups, 32 W bytes).
      const int64_t g0 = block_start(g, ng);
      const int W = block_width(g0, ng);
      const int gi = static_cast<int>(g - g0);
      int8_t* blk = xq + g0 * kGroup;
      for (int r = 0; r < 4; ++r) {
        const int l = r * W + gi;
        std::memcpy(blk + 4 * l, plain + 4 * r, 4);                 // columns 4r .. 4r+3
        std::memcpy(blk + 16 * W + 4 * l, plain + 16 + 4 * r, 4);   // columns 16 + 4r ..
      }
    }
  }
}

// ---- scales ------------------------------------------------------------------------

inline float to_f32(c10::Half h) { return static_cast<float>(h); }
inline float to_f32(float f) { return f; }

#if RADIXLM_INT4_PATH >= 2
inline __m128 load4(const c10::Half* p) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m128 load4(const float* p) { return _mm_loadu_ps(p); }
// [p0, p1, p0, p1]
inline __m128 load2x2(const c10::Half* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_set1_epi32(v));
}
inline __m128 load2x2(const float* p) {
  return _mm_castpd_ps(_mm_loaddup_pd(reinterpret_cast<const double*>(p)));
}
#endif

// ---- one weight row against MB rows of x -------------------------------------------

struct Rows {
  const int8_t* xq;  // [M, K] block order
  const float* sx;   // [M, ng]
  const float* sq;   // [M, ng]
  int64_t K, ng;
};

#if RADIXLM_INT4_PATH == 3

template <int MB, typename S>
inline void row_dot(const Rows& X, int64_t m0, const uint8_t* w, const S* dr, const S* mr,
                    float* out) {
  const int64_t K = X.K, ng = X.ng;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  int64_t g0 = 0;
  for (; g0 + 4 <= ng; g0 += 4) {
    const __m512i p = _mm512_loadu_si512(w + 16 * g0);
    const __m512i lo = _mm512_and_si512(p, low4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
    const __m512 dv = _mm512_broadcast_f32x4(load4(dr + g0));
    const __m512 mv = _mm512_broadcast_f32x4(load4(mr + g0));
    for (int i = 0; i < MB; ++i) {
      const int64_t row = m0 + i;
      const int8_t* xb = X.xq + row * K + kGroup * g0;
      __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xb));
      s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(xb + 64));
      const __m512 sx = _mm512_broadcast_f32x4(_mm_loadu_ps(X.sx + row * ng + g0));
      const __m512 sq = _mm512_broadcast_f32x4(_mm_loadu_ps(X.sq + row * ng + g0));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, sx), acc[i]);
      acc[i] = _mm512_fmadd_ps(mv, sq, acc[i]);
    }
  }
  float tail[MB];
  for (int i = 0; i < MB; ++i) tail[i] = 0.f;
  if (g0 + 2 <= ng) {  // one block of 2 groups: 256-bit lanes, group l % 2
    const __m256i low4y = _mm256_set1_epi8(0x0F);
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * g0));
    const __m256i lo = _mm256_and_si256(p, low4y);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4y);
    const __m128 d2 = load2x2(dr + g0), m2 = load2x2(mr + g0);
    const __m256 dv = _mm256_set_m128(d2, d2), mv = _mm256_set_m128(m2, m2);
    for (int i = 0; i < MB; ++i) {
      const int64_t row = m0 + i;
      const int8_t* xb = X.xq + row * K + kGroup * g0;
      __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo,
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)));
      s = _mm256_dpbusd_epi32(s, hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32)));
      const __m128 sx2 = load2x2(X.sx + row * ng + g0), sq2 = load2x2(X.sq + row * ng + g0);
      __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv, _mm256_set_m128(sx2, sx2)));
      a = _mm256_fmadd_ps(mv, _mm256_set_m128(sq2, sq2), a);
      acc[i] = _mm512_add_ps(acc[i], _mm512_zextps256_ps512(a));
    }
    g0 += 2;
  }
  if (g0 < ng) {  // one group: 128-bit, all four lanes group g0
    const __m128i low4x = _mm_set1_epi8(0x0F);
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * g0));
    const __m128i lo = _mm_and_si128(p, low4x);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(p, 4), low4x);
    const float d = to_f32(dr[g0]), m = to_f32(mr[g0]);
    for (int i = 0; i < MB; ++i) {
      const int64_t row = m0 + i;
      const int8_t* xb = X.xq + row * K + kGroup * g0;
      __m128i s = _mm_dpbusd_epi32(_mm_setzero_si128(), lo,
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
      s = _mm_dpbusd_epi32(s, hi, _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
      const __m128i s2 = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
      const int32_t dot = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
      tail[i] = static_cast<float>(dot) * (d * X.sx[row * ng + g0]) + m * 4.f * X.sq[row * ng + g0];
    }
  }
  for (int i = 0; i < MB; ++i) out[i] = _mm512_reduce_add_ps(acc[i]) + tail[i];
}

#elif RADIXLM_INT4_PATH == 2

inline __m256i maddubs4(__m256i lo0, __m256i hi0, __m256i lo1, __m256i hi1, const int8_t* xb) {
  // x block: low-column bytes [0, 64), high-column bytes [64, 128)
  auto ld = [&](int off) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + off)); };
  __m256i t = _mm256_maddubs_epi16(lo0, ld(0));
  t = _mm256_add_epi16(t, _mm256_maddubs_epi16(lo1, ld(32)));
  t = _mm256_add_epi16(t, _mm256_maddubs_epi16(hi0, ld(64)));
  t = _mm256_add_epi16(t, _mm256_maddubs_epi16(hi1, ld(96)));
  return _mm256_madd_epi16(t, _mm256_set1_epi16(1));
}

template <int MB, typename S>
inline void row_dot(const Rows& X, int64_t m0, const uint8_t* w, const S* dr, const S* mr,
                    float* out) {
  const int64_t K = X.K, ng = X.ng;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_ps();
  int64_t g0 = 0;
  for (; g0 + 4 <= ng; g0 += 4) {
    // 64 bytes: lanes 0..7 then 8..15, lane l group l % 4 (lanes l and l + 8 summed
    // together: each group in 2 of the 8 int32 lanes, so its m term takes S / 2).
    const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * g0));
    const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * g0 + 32));
    const __m256i lo0 = _mm256_and_si256(p0, low4), lo1 = _mm256_and_si256(p1, low4);
    const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(p0, 4), low4);
    const __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(p1, 4), low4);
    const __m128 d4 = load4(dr + g0), m4 = load4(mr + g0);
    const __m256 dv = _mm256_set_m128(d4, d4);
    const __m256 mv = _mm256_set_m128(_mm_add_ps(m4, m4), _mm_add_ps(m4, m4));
    for (int i = 0; i < MB; ++i) {
      const int64_t row = m0 + i;
      const __m256i s = maddubs4(lo0, hi0, lo1, hi1, X.xq + row * K + kGroup * g0);
      const __m128 sx4 = _mm_loadu_ps(X.sx + row * ng + g0), sq4 = _mm_loadu_ps(X.sq + row * ng + g0);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv, _mm256_set_m128(sx4, sx4)), acc[i]);
      acc[i] = _mm256_fmadd_ps(mv, _mm256_set_m128(sq4, sq4), acc[i]);
    }
  }
  if (g0 + 2 <= ng) {  // one block of 2 groups: 8 lanes, group l % 2, 4 lanes each
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * g0));
    const __m256i lo = _mm256_and_si256(p, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
    const __m128 d2 = load2x2(dr + g0), m2 = load2x2(mr + g0);
    const __m256 dv = _mm256_set_m128(d2, d2), mv = _mm256_set_m128(m2, m2);
    for (int i = 0; i < MB; ++i) {
      const int64_t row = m0 + i;
      const int8_t* xb = X.xq + row * K + kGroup * g0;
      __m256i t = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)));
      t = _mm256_add_epi16(t, _mm256_maddubs_epi16(
          hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32))));
      const __m256i s = _mm256_madd_epi16(t, _mm256_set1_epi16(1));
      const __m128 sx2 = load2x2(X.sx + row * ng + g0), sq2 = load2x2(X.sq + row * ng + g0);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv, _mm256_set_m128(sx2, sx2)), acc[i]);
      acc[i] = _mm256_fmadd_ps(mv, _mm256_set_m128(sq2, sq2), acc[i]);
    }
    g0 += 2;
  }
  float tail[MB];
  for (int i = 0; i < MB; ++i) tail[i] = 0.f;
  if (g0 < ng) {  // one group: 16 bytes, plain loop
    const uint8_t* p = w + 16 * g0;
    const float d = to_f32(dr[g0]), m = to_f32(mr[g0]);
    for (int i = 0; i < MB; ++i) {
      const int64_t row = m0 + i;
      const int8_t* xb = X.xq + row * K + kGroup * g0;
      int32_t dot = 0;
      for (int b = 0; b < 16; ++b) dot += (p[b] & 15) * xb[b] + (p[b] >> 4) * xb[16 + b];
      tail[i] = static_cast<float>(dot) * (d * X.sx[row * ng + g0]) + m * 4.f * X.sq[row * ng + g0];
    }
  }
  for (int i = 0; i < MB; ++i) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
    const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    out[i] = _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2))) + tail[i];
  }
}

#else  // plain loops over the same layout

template <int MB, typename S>
inline void row_dot(const Rows& X, int64_t m0, const uint8_t* w, const S* dr, const S* mr,
                    float* out) {
  const int64_t K = X.K, ng = X.ng;
  float acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = 0.f;
  for (int64_t g0 = 0; g0 < ng;) {
    const int W = block_width(g0, ng);
    const uint8_t* p = w + 16 * g0;
    for (int i = 0; i < MB; ++i) {
      const int64_t row = m0 + i;
      const int8_t* xb = X.xq + row * K + kGroup * g0;
      int32_t dot[4] = {0, 0, 0, 0};
      for (int b = 0; b < 16 * W; ++b)
        dot[(b / 4) % W] += (p[b] & 15) * xb[b] + (p[b] >> 4) * xb[16 * W + b];
      for (int gi = 0; gi < W; ++gi) {
        const int64_t g = g0 + gi;
        acc[i] += static_cast<float>(dot[gi]) * (to_f32(dr[g]) * X.sx[row * ng + g]) +
                  to_f32(mr[g]) * 4.f * X.sq[row * ng + g];
      }
    }
    g0 += W;
  }
  for (int i = 0; i < MB; ++i) out[i] = acc[i];
}

#endif

template <typename T>
void quantize_all(const torch::Tensor& x, bool blocked, int8_t* xq, float* sx, float* sq) {
  const int64_t M = x.size(0), K = x.size(1), ng = K / kGroup;
  const T* xp = x.data_ptr<T>();
  for (int64_t i = 0; i < M; ++i)
    quantize_row(xp + i * K, K, blocked, xq + i * K, sx + i * ng, sq + i * ng);
}

void quantize(const torch::Tensor& x, bool blocked, int8_t* xq, float* sx, float* sq) {
  if (x.scalar_type() == torch::kBFloat16)
    quantize_all<c10::BFloat16>(x, blocked, xq, sx, sq);
  else
    quantize_all<float>(x, blocked, xq, sx, sq);
}

void check_x(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat),
              "int4_groups: x [M, K] bfloat16 or float32 contiguous");
  TORCH_CHECK(x.size(1) % kGroup == 0, "int4_groups: K a multiple of 32");
}

template <typename S, typename Out>
void run(const Rows& X, int64_t M, int64_t N, const uint8_t* wp, const S* dp, const S* mp,
         Out* yp) {
  const int64_t K = X.K, ng = X.ng;
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    // Results gathered per thread, n-major, then written row by row: y's column writes
    // (stride N) would alias in L1 at N a multiple of 2048 (several times slower at M 8).
    std::vector<float> buf((end - begin) * M);
    for (int64_t n = begin; n < end; ++n) {
      float* out_n = buf.data() + (n - begin) * M;
      const uint8_t* w = wp + n * (K / 2);
      const S* dr = dp + n * ng;
      const S* mr = mp + n * ng;
      // The row kPrefetchBytes of nibbles ahead (rows are contiguous), its scales too.
      const int64_t rows_ahead = (kPrefetchBytes + K / 2 - 1) / (K / 2);
      prefetch_span(w, K / 2, rows_ahead * (K / 2));
      prefetch_span(dr, ng * int64_t(sizeof(S)), rows_ahead * ng * int64_t(sizeof(S)));
      prefetch_span(mr, ng * int64_t(sizeof(S)), rows_ahead * ng * int64_t(sizeof(S)));
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
        const int64_t mb = std::min<int64_t>(kRowBlock, M - m0);
        float* out = out_n + m0;
        switch (mb) {
          case 8: row_dot<8>(X, m0, w, dr, mr, out); break;
          case 7: row_dot<7>(X, m0, w, dr, mr, out); break;
          case 6: row_dot<6>(X, m0, w, dr, mr, out); break;
          case 5: row_dot<5>(X, m0, w, dr, mr, out); break;
          case 4: row_dot<4>(X, m0, w, dr, mr, out); break;
          case 3: row_dot<3>(X, m0, w, dr, mr, out); break;
          case 2: row_dot<2>(X, m0, w, dr, mr, out); break;
          default: row_dot<1>(X, m0, w, dr, mr, out); break;
        }
      }
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t n = begin; n < end; ++n)
        yp[i * N + n] = static_cast<Out>(buf[(n - begin) * M + i]);
  });
}

}  // namespace

std::vector<torch::Tensor> int4_quantize_rows(torch::Tensor x, bool blocked) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1);
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kChar));
  auto sx = torch::empty({M, K / kGroup}, x.options().dtype(torch::kFloat));
  auto sq = torch::empty({M, K / kGroup}, x.options().dtype(torch::kFloat));
  quantize(x, blocked, xq.data_ptr<int8_t>(), sx.data_ptr<float>(), sq.data_ptr<float>());
  return {xq, sx, sq.mul_(4.f)};
}

torch::Tensor int4_group_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor d,
                                torch::Tensor m) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), ng = K / kGroup;
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kByte && w.is_contiguous() &&
                  w.size(1) == K / 2, "int4_group_matmul: w [N, K / 2] uint8 contiguous");
  TORCH_CHECK(d.scalar_type() == m.scalar_type() &&
                  (d.scalar_type() == torch::kHalf || d.scalar_type() == torch::kFloat) &&
                  d.is_contiguous() && m.is_contiguous() && d.dim() == 2 && m.dim() == 2 &&
                  d.size(0) == N && d.size(1) == ng && m.size(0) == N && m.size(1) == ng,
              "int4_group_matmul: d, m [N, K / 32] float16 or float32 contiguous");
  // Scratch for the quantized rows, on the stack for decode sizes.
  std::vector<int8_t> xq(M * K);
  std::vector<float> sx(M * ng), sq(M * ng);
  quantize(x, true, xq.data(), sx.data(), sq.data());
  const Rows X{xq.data(), sx.data(), sq.data(), K, ng};
  auto y = torch::empty({M, N}, x.options());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  if (d.scalar_type() == torch::kHalf) {
    const auto* dp = d.data_ptr<c10::Half>();
    const auto* mp = m.data_ptr<c10::Half>();
    if (bf16) run(X, M, N, wp, dp, mp, y.data_ptr<c10::BFloat16>());
    else run(X, M, N, wp, dp, mp, y.data_ptr<float>());
  } else {
    const auto* dp = d.data_ptr<float>();
    const auto* mp = m.data_ptr<float>();
    if (bf16) run(X, M, N, wp, dp, mp, y.data_ptr<c10::BFloat16>());
    else run(X, M, N, wp, dp, mp, y.data_ptr<float>());
  }
  return y;
}

int64_t int4_kernel_path() { return RADIXLM_INT4_PATH; }

#if RADIXLM_TORCH_OPS
// The entry as a torch op for compiled decode graphs (schema: models/linear/int4.py).
TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("int4_group_matmul", &int4_group_matmul); }
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_group_matmul", &int4_group_matmul,
        "x [M, K] bf16/f32 @ (d * q + m per group of 32).T -> [M, N] in x's dtype; "
        "x quantized to int8 per group (see the source).");
  m.def("int4_quantize_rows", &int4_quantize_rows,
        "x [M, K] -> (xq int8 [M, K] in block (or column) order, sx [M, K/32], S [M, K/32]).");
  m.def("int4_kernel_path", &int4_kernel_path, "3 AVX512-VNNI, 2 AVX2, 1 plain loops.");
}
