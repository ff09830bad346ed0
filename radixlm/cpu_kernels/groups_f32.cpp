// x @ W.T for groupwise quantized weights with x float32 UNQUANTIZED, for CPUs whose
// float32 runs have no bf16 dot products (AVX2 + FMA + F16C: Zen 2/3, Intel before Cooper
// Lake). Two weight forms, the same loops:
//
//   int4 (GGUF's Q4_0/Q4_1/Q4_K), groups of 32:  w[n, k] = d[n, g] q[n, k] + m[n, g], q 0..15
//       y[i, n] = sum_g d[n, g] (sum_{k in g} q[n, k] x[i, k]) + m[n, g] S[i, g]
//   int8 (Q8_0, Q5_0, Q6_K), groups of 16 or 32: w[n, k] = s[n, g] q[n, k], q int8
//       y[i, n] = sum_g s[n, g] (sum_{k in g} q[n, k] x[i, k])
//
// with S the float32 sum of the group's x. Each q is exact in float32, so the products are
// the dense float32 weights' up to the rounding of d q + m and the summation order:
// results within float32 rounding of the dense copy's.
//
// Weight layout (packed at load by models/linear/groups_f32.py): output channels in
// blocks of 8; per block the K columns in order, 8 channels a column: int4 as words of 8
// int32 lanes (lane j = channel 8 b + j, column 8 w + t in bits 4 t .. 4 t + 3), int8 as
// 8 bytes a column. A column's 8 channels become one register of floats (int4: a mask in
// place and a conversion of the word's register, q * 16^t, against x pre-scaled by 16^-t:
// the same products; int8: a widening load and a conversion),
// multiplied by the broadcast x[i, k] into 8 float sums: no horizontal reduction, and
// each column unpacked serves every row of x (4 at a time). Scales (d, m; s):
// [blocks, groups, 8], float16 (exact GGUF halves) or float32.
//
// int4 weights also take x quantized to int8 per group of 32 (opt-in, int4_f32_q8_matmul:
// llama.cpp's Q4_1 x Q8_1 numerics, `quantize_q8.h`), against the same words:
//       y[i, n] = sum_g d[n, g] sx[i, g] (sum_{k in g} q[n, k] xq[i, k]) + m[n, g] S[i, g]
// A word's byte r of lane j holds columns 2 r (low nibble) and 2 r + 1 (high): a mask gives
// the even columns (4 a lane), a shift and a mask the odd ones, each multiplied by x's
// quantized [0 2 4 6] or [1 3 5 7] broadcast to every lane (_mm256_maddubs_epi16, u4 x s8,
// pairs to int16: at most 2 * 15 * 127), a group's 8 products summed in int16 (at most
// 30480: no saturation), widened once a group (_mm256_madd_epi16): exact integer dots, a
// quarter of the float path's instructions per weight, still no horizontal reduction.
//
// Invariants: x [M, K] float32 contiguous, K a multiple of the group; y [M, N] float32.
// Each output's sum runs over the columns in order, then group by group, whatever M is
// and however the channels are split among threads: a row's result is the same bit for
// bit at every M (a speculative verify equals its decode steps). Each weight byte is read
// from memory once per call (a thread's 4 blocks stay in L1 across the row blocks).
// Built with RADIXLM_GROUPS_F32 = 1 only where the compiler targets AVX2, FMA and F16C
// (groups_f32_path() says 0 otherwise and the matmuls refuse: callers keep dense weights).
#include "torch_api.h"
#include "prefetch.h"
#include "quantize_q8.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#if !defined(RADIXLM_GROUPS_F32)
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RADIXLM_GROUPS_F32 1
#else
#define RADIXLM_GROUPS_F32 0
#endif
#endif

namespace {

constexpr int kBlockN = 8;      // channels per block: one register of float32
constexpr int kUnit = 4;        // blocks per thread work unit (32 channels)
constexpr int kRowBlock = 4;    // rows of x computed together

#if RADIXLM_GROUPS_F32

inline __m256 load_scales(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_scales(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 4-bit columns: a word of 8 columns is one 32-byte register.
struct Q4 {
  static constexpr bool kOffset = true;  // the m S term
  static constexpr int64_t kColumnBytes = 4;
  using Word = __m256i;
  static Word load(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  // Column t as q * 16^t, the nibble masked in place (no shift; the top one shifted down
  // by 4 to stay positive: q * 16^6 for t = 7): exact in float32. x comes scaled by the
  // inverse power of two (`scale_columns`), so each product is q * x bit for bit.
  static __m256 column(const Word& v, int t) {
    if (t == 7)
      return _mm256_cvtepi32_ps(
          _mm256_and_si256(_mm256_srli_epi32(v, 4), _mm256_set1_epi32(15 << 24)));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15 << (4 * t))));
  }
};

// x for Q4's columns: column k times 16^-(k % 8) (16^-6 for k % 8 = 7), exact for x in
// float32's normal range (powers of two; a value that would fall below it is rounded).
void scale_columns(const float* x, int64_t n, float* out) {
  const __m256 f = _mm256_setr_ps(1.f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f,
                                  0x1p-24f, 0x1p-24f);
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), f));
}

// 8-bit columns: a word of 8 columns is 64 bytes, read a column (8 bytes) at a time.
struct Q8 {
  static constexpr bool kOffset = false;
  static constexpr int64_t kColumnBytes = 8;
  using Word = const uint8_t*;
  static Word load(const uint8_t* p) { return p; }
  static __m256 column(const Word& p, int t) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * t))));
  }
};

struct Call {
  const float* x;    // [M, K]
  const float* s;    // [M, ng]: the float32 sum of each group of x (int4 only)
  const uint8_t* w;  // [blocks, K, 8 channels] in the form's column bytes
  float* y;          // [M, N]
  int64_t K, ng, N;
};

// Block b's 8 sums into a row of y [N] (the padded last block: its real channels only).
inline void store_channels(float* row, int64_t N, int64_t b, __m256 v) {
  const int64_t n0 = b * kBlockN;
  if (n0 + kBlockN <= N) {
    _mm256_storeu_ps(row + n0, v);
    return;
  }
  alignas(32) float lanes[kBlockN];
  _mm256_store_ps(lanes, v);
  for (int64_t j = 0; j < N - n0; ++j) row[n0 + j] = lanes[j];
}

// MB rows (from m0) against NB blocks of 8 channels (from b0); groups of 8 GW columns.
template <typename F, int GW, int MB, int NB, typename S>
inline void block_dot(const Call& c, int64_t m0, int64_t b0, const S* dp, const S* mp) {
  const int64_t K = c.K, ng = c.ng;
  const float* xr[MB];
  for (int i = 0; i < MB; ++i) xr[i] = c.x + (m0 + i) * K;
  const uint8_t* wb[NB];
  const int64_t block_bytes = K * kBlockN * F::kColumnBytes / 8;
  for (int b = 0; b < NB; ++b) wb[b] = c.w + (b0 + b) * block_bytes;
  // Each block's stream announces the block NB later at the same offset: the next blocks
  // this thread reads (its units are consecutive) arrive whole while these are computed.
  const int64_t ahead = NB * block_bytes;
  __m256 tot[NB][MB];
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) tot[b][i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m256 acc[NB][MB];
    for (int b = 0; b < NB; ++b)
      for (int i = 0; i < MB; ++i) acc[b][i] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int wd = 0; wd < GW; ++wd) {
      const int64_t k0 = (g * GW + wd) * 8;
      typename F::Word v[NB];
      for (int b = 0; b < NB; ++b) {
        const uint8_t* p = wb[b] + k0 * F::kColumnBytes;
        prefetch_ahead(p, ahead);
        if (F::kColumnBytes == 8) prefetch_ahead(p + 32, ahead);  // a 64-byte word: both halves
        v[b] = F::load(p);
      }
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        __m256 xv[MB];
        for (int i = 0; i < MB; ++i) xv[i] = _mm256_broadcast_ss(xr[i] + k0 + t);
        for (int b = 0; b < NB; ++b) {
          const __m256 q = F::column(v[b], t);
          for (int i = 0; i < MB; ++i) acc[b][i] = _mm256_fmadd_ps(q, xv[i], acc[b][i]);
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      const int64_t off = ((b0 + b) * ng + g) * kBlockN;
      const __m256 dv = load_scales(dp + off);
      for (int i = 0; i < MB; ++i) tot[b][i] = _mm256_fmadd_ps(acc[b][i], dv, tot[b][i]);
      if (F::kOffset) {
        const __m256 mv = load_scales(mp + off);
        for (int i = 0; i < MB; ++i)
          tot[b][i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(c.s[(m0 + i) * ng + g]), tot[b][i]);
      }
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) store_channels(c.y + (m0 + i) * c.N, c.N, b0 + b, tot[b][i]);
}

// Rows m0 .. m0 + MB against the blocks b0 .. b0 + nblk (nblk <= kUnit): 4 blocks at once
// for 1 or 2 rows, 2 for 3 or 4 (at most 8 accumulators), the rest one by one.
template <typename F, int GW, int MB, typename S>
inline void unit_dot(const Call& c, int64_t m0, int64_t b0, int64_t nblk, const S* dp,
                     const S* mp) {
  if (nblk == kUnit && MB <= 2) {
    block_dot<F, GW, MB, 4>(c, m0, b0, dp, mp);
    return;
  }
  int64_t b = b0;
  for (; b + 2 <= b0 + nblk; b += 2) block_dot<F, GW, MB, 2>(c, m0, b, dp, mp);
  for (; b < b0 + nblk; ++b) block_dot<F, GW, MB, 1>(c, m0, b, dp, mp);
}

// The threads split the units of kUnit blocks; each unit meets the rows kRowBlock at a
// time: unit(m0, rows, b0, nblk), rows 1 .. kRowBlock.
template <typename Unit>
void for_units(int64_t M, int64_t N, const Unit& unit) {
  const int64_t nb = (N + kBlockN - 1) / kBlockN;
  const int64_t units = (nb + kUnit - 1) / kUnit;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b0 = u * kUnit, nblk = std::min<int64_t>(kUnit, nb - b0);
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock)
        unit(m0, std::min<int64_t>(kRowBlock, M - m0), b0, nblk);
    }
  });
}

template <typename F, int GW, typename S>
void run(const Call& c, int64_t M, const S* dp, const S* mp) {
  for_units(M, c.N, [&](int64_t m0, int64_t rows, int64_t b0, int64_t nblk) {
    switch (rows) {
      case 4: unit_dot<F, GW, 4>(c, m0, b0, nblk, dp, mp); break;
      case 3: unit_dot<F, GW, 3>(c, m0, b0, nblk, dp, mp); break;
      case 2: unit_dot<F, GW, 2>(c, m0, b0, nblk, dp, mp); break;
      default: unit_dot<F, GW, 1>(c, m0, b0, nblk, dp, mp); break;
    }
  });
}

// ---- int8 activations: the int4 words against x quantized per group of 32 ----------

struct CallQ8 {
  const int8_t* xq;  // [M, K] int8, each 8 columns in the order 0 2 4 6 1 3 5 7
  const float* sx;   // [M, ng]: x's scale per group
  const float* s;    // [M, ng]: the float32 sum of each group of x
  const uint8_t* w;  // [blocks, K, 8 channels] int4 words
  float* y;          // [M, N]
  int64_t K, ng, N;
};

// MB rows (from m0) against NB blocks of 8 channels (from b0).
template <int MB, int NB, typename S>
inline void block_dot_q8(const CallQ8& c, int64_t m0, int64_t b0, const S* dp, const S* mp) {
  const int64_t K = c.K, ng = c.ng, block_bytes = K * Q4::kColumnBytes;
  const int64_t ahead = NB * block_bytes;  // as block_dot: the thread's next blocks
  const int8_t* xr[MB];
  for (int i = 0; i < MB; ++i) xr[i] = c.xq + (m0 + i) * K;
  const uint8_t* wb[NB];
  for (int b = 0; b < NB; ++b) wb[b] = c.w + (b0 + b) * block_bytes;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 tot[NB][MB];
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) tot[b][i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m256i acc[NB][MB];
    for (int b = 0; b < NB; ++b)
      for (int i = 0; i < MB; ++i) acc[b][i] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int wd = 0; wd < 4; ++wd) {
      const int64_t k0 = (g * 4 + wd) * 8;
      __m256i xe[MB], xo[MB];
      for (int i = 0; i < MB; ++i) {
        int32_t e, o;
        std::memcpy(&e, xr[i] + k0, 4);
        std::memcpy(&o, xr[i] + k0 + 4, 4);
        xe[i] = _mm256_set1_epi32(e);
        xo[i] = _mm256_set1_epi32(o);
      }
      for (int b = 0; b < NB; ++b) {
        const uint8_t* p = wb[b] + k0 * Q4::kColumnBytes;
        if (wd % 2 == 0) prefetch_ahead(p, ahead);  // one per 64-byte line
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const __m256i even = _mm256_and_si256(v, low4);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int i = 0; i < MB; ++i)
          acc[b][i] = _mm256_add_epi16(acc[b][i],
                                       _mm256_add_epi16(_mm256_maddubs_epi16(even, xe[i]),
                                                        _mm256_maddubs_epi16(odd, xo[i])));
      }
    }
    for (int b = 0; b < NB; ++b) {
      const int64_t off = ((b0 + b) * ng + g) * kBlockN;
      const __m256 dv = load_scales(dp + off), mv = load_scales(mp + off);
      for (int i = 0; i < MB; ++i) {
        const int64_t at = (m0 + i) * ng + g;
        const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[b][i], ones));
        tot[b][i] = _mm256_fmadd_ps(dots, _mm256_mul_ps(dv, _mm256_set1_ps(c.sx[at])), tot[b][i]);
        tot[b][i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(c.s[at]), tot[b][i]);
      }
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) store_channels(c.y + (m0 + i) * c.N, c.N, b0 + b, tot[b][i]);
}

// Rows m0 .. m0 + MB against a unit: 4 blocks at once for one row, 2 for two, else one
// (at most 8 int16 and 8 float accumulators).
template <int MB, typename S>
inline void unit_dot_q8(const CallQ8& c, int64_t m0, int64_t b0, int64_t nblk, const S* dp,
                        const S* mp) {
  if (nblk == kUnit && MB == 1) {
    block_dot_q8<1, 4>(c, m0, b0, dp, mp);
    return;
  }
  int64_t b = b0;
  if constexpr (MB <= 2)
    for (; b + 2 <= b0 + nblk; b += 2) block_dot_q8<MB, 2>(c, m0, b, dp, mp);
  for (; b < b0 + nblk; ++b) block_dot_q8<MB, 1>(c, m0, b, dp, mp);
}

template <typename S>
void run_q8(const CallQ8& c, int64_t M, const S* dp, const S* mp) {
  for_units(M, c.N, [&](int64_t m0, int64_t rows, int64_t b0, int64_t nblk) {
    switch (rows) {
      case 4: unit_dot_q8<4>(c, m0, b0, nblk, dp, mp); break;
      case 3: unit_dot_q8<3>(c, m0, b0, nblk, dp, mp); break;
      case 2: unit_dot_q8<2>(c, m0, b0, nblk, dp, mp); break;
      default: unit_dot_q8<1>(c, m0, b0, nblk, dp, mp); break;
    }
  });
}

// x [M, K] -> xq in the kernel's column order, sx and S per group of 32.
void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* xq, float* sx, float* s) {
  const int64_t ng = K / 32;
  // Within each 8 bytes: the even columns, then the odd ones.
  const __m256i order = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
                                         0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t at = i * ng + g;
      const __m256i q = quantize_group_q8(x + i * K + g * 32, sx[at], s[at]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + i * K + g * 32),
                          _mm256_shuffle_epi8(q, order));
    }
}

// S[i, g]: each group of 32 summed in float32, in the same order for every row.
void group_sums(const float* x, int64_t M, int64_t K, float* s) {
  const int64_t ng = K / 32;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t g = 0; g < ng; ++g) {
      const float* p = x + i * K + g * 32;
      const __m256 a = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(p + 16),
                                                   _mm256_loadu_ps(p + 24)));
      const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
      const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
      s[i * ng + g] = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
    }
  }
}

template <typename F, int GW>
void run_scales(const Call& c, int64_t M, const torch::Tensor& d, const torch::Tensor& m) {
  if (d.scalar_type() == torch::kHalf)
    run<F, GW>(c, M, d.data_ptr<c10::Half>(), F::kOffset ? m.data_ptr<c10::Half>() : nullptr);
  else
    run<F, GW>(c, M, d.data_ptr<float>(), F::kOffset ? m.data_ptr<float>() : nullptr);
}

#endif  // RADIXLM_GROUPS_F32

void check_x(const torch::Tensor& x, int64_t group) {
  TORCH_CHECK(RADIXLM_GROUPS_F32, "groups_f32: built without AVX2/FMA/F16C");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat,
              "groups_f32: x [M, K] float32 contiguous");
  TORCH_CHECK(x.size(1) % group == 0, "groups_f32: K a multiple of the group");
}

// `what`: the entry, `which`: the argument (the message is formed on failure only).
void check_scales(const torch::Tensor& d, int64_t nb, int64_t ng, const char* what,
                  const char* which) {
  TORCH_CHECK((d.scalar_type() == torch::kHalf || d.scalar_type() == torch::kFloat) &&
                  d.is_contiguous() && d.dim() == 3 && d.size(0) == nb && d.size(1) == ng &&
                  d.size(2) == kBlockN,
              what, ": ", which, " [blocks, groups, 8] float16 or float32 contiguous");
}

void check_w(const torch::Tensor& w, int64_t nb, int64_t bytes_per_block) {
  TORCH_CHECK(w.dim() >= 2 && w.is_contiguous() && w.size(0) == nb &&
                  w.numel() * w.element_size() == nb * bytes_per_block,
              "groups_f32: w [ceil(n / 8), ...] contiguous, the bytes of 8 channels a block");
}

// The two int4 entries' arguments (`what`: the entry, for the messages).
void check_int4(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& d,
                const torch::Tensor& m, int64_t n, const char* what) {
  check_x(x, 32);
  const int64_t K = x.size(1), nb = (n + kBlockN - 1) / kBlockN;
  check_w(w, nb, K * 4);
  check_scales(d, nb, K / 32, what, "d");
  check_scales(m, nb, K / 32, what, "m");
  TORCH_CHECK(d.scalar_type() == m.scalar_type(), what, ": d, m of one dtype");
}

}  // namespace

torch::Tensor int4_f32_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor d,
                              torch::Tensor m, int64_t n) {
  check_int4(x, w, d, m, n, "int4_f32_matmul");
  const int64_t M = x.size(0), K = x.size(1), ng = K / 32;
  auto y = torch::empty({M, n}, x.options());
#if RADIXLM_GROUPS_F32
  std::vector<float> s(M * ng), xs(M * K);
  group_sums(x.data_ptr<float>(), M, K, s.data());
  scale_columns(x.data_ptr<float>(), M * K, xs.data());
  const Call c{xs.data(), s.data(), static_cast<const uint8_t*>(w.data_ptr()),
               y.data_ptr<float>(), K, ng, n};
  run_scales<Q4, 4>(c, M, d, m);
#endif
  return y;
}

torch::Tensor int4_f32_q8_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor d,
                                 torch::Tensor m, int64_t n) {
  check_int4(x, w, d, m, n, "int4_f32_q8_matmul");
  const int64_t M = x.size(0), K = x.size(1), ng = K / 32;
  auto y = torch::empty({M, n}, x.options());
#if RADIXLM_GROUPS_F32
  std::vector<int8_t> xq(M * K);
  std::vector<float> sx(M * ng), s(M * ng);
  quantize_rows_q8(x.data_ptr<float>(), M, K, xq.data(), sx.data(), s.data());
  const CallQ8 c{xq.data(), sx.data(), s.data(), static_cast<const uint8_t*>(w.data_ptr()),
                 y.data_ptr<float>(), K, ng, n};
  if (d.scalar_type() == torch::kHalf)
    run_q8(c, M, d.data_ptr<c10::Half>(), m.data_ptr<c10::Half>());
  else
    run_q8(c, M, d.data_ptr<float>(), m.data_ptr<float>());
#endif
  return y;
}

torch::Tensor int8_f32_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor s,
                              int64_t group, int64_t n) {
  TORCH_CHECK(group == 16 || group == 32, "int8_f32_matmul: groups of 16 or 32");
  check_x(x, group);
  const int64_t M = x.size(0), K = x.size(1), ng = K / group, nb = (n + kBlockN - 1) / kBlockN;
  check_w(w, nb, K * 8);
  check_scales(s, nb, ng, "int8_f32_matmul", "s");
  auto y = torch::empty({M, n}, x.options());
#if RADIXLM_GROUPS_F32
  const Call c{x.data_ptr<float>(), nullptr, static_cast<const uint8_t*>(w.data_ptr()),
               y.data_ptr<float>(), K, ng, n};
  if (group == 32)
    run_scales<Q8, 4>(c, M, s, s);
  else
    run_scales<Q8, 2>(c, M, s, s);
#endif
  return y;
}

int64_t groups_f32_path() { return RADIXLM_GROUPS_F32; }

#if RADIXLM_TORCH_OPS
// The entries as the torch ops radixlm::int4_f32_matmul, ... (schemas and shapes for
// tracing: models/linear/groups_f32.py): a compiled decode graph's dispatcher reaches these
// functions directly, with no Python between (a Python op costs ~10 us a call).
TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("int4_f32_matmul", &int4_f32_matmul);
  m.impl("int4_f32_q8_matmul", &int4_f32_q8_matmul);
  m.impl("int8_f32_matmul", &int8_f32_matmul);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_f32_matmul", &int4_f32_matmul,
        "x [M, K] float32 @ (d * q + m per group of 32).T -> [M, n] float32, x unquantized "
        "(see the source).");
  m.def("int4_f32_q8_matmul", &int4_f32_q8_matmul,
        "x [M, K] float32 @ (d * q + m per group of 32).T -> [M, n] float32, x quantized to "
        "int8 per group of 32 (llama.cpp's Q8 numerics; see the source).");
  m.def("int8_f32_matmul", &int8_f32_matmul,
        "x [M, K] float32 @ (s * q per group of 16 or 32).T -> [M, n] float32, x unquantized.");
  m.def("groups_f32_path", &groups_f32_path, "1: AVX2 + FMA + F16C; 0: not built (refuses).");
}
