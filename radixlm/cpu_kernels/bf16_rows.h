// The activation side of the kernels that take bf16 dot products against unpacked weight
// blocks of 16 channels (int4_bf16.cpp, q5_bf16.cpp): x as bf16 bits with the float32
// sum of each group of 32, a unit's block results written into y, and a row count as a
// template argument.
//
// Invariants: R = M rows for bf16 x, 2 M for float32 x (hi rows, then lo rows: x = hi +
// lo to ~16 mantissa bits); a unit's results res [R, kStride] hold each row's values for
// up to 4 blocks; y's bf16 values are rounded once, its float32 ones are hi + lo.
// Compiled only where AVX-512 (F, BW) and AVX512-BF16 are (the kernels' own condition).
#pragma once

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include "torch_api.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace bf16_rows {

constexpr int kGroup = 32;
constexpr int kBlockN = 16;
constexpr int64_t kStride = 4 * kBlockN;  // floats per row of a unit's results

struct Rows {
  const uint16_t* x;  // [R, K] bf16 bits
  const float* s;     // [R, ng] group sums
  int64_t K, ng;
};

// bf16 bits of x (float32: hi rows then lo rows) and their group sums; R set.
inline void prepare(const torch::Tensor& x, std::vector<uint16_t>& xb, std::vector<float>& s,
                    int64_t& R) {
  const int64_t M = x.size(0), K = x.size(1), ng = K / kGroup;
  const bool f32 = x.scalar_type() == torch::kFloat;
  R = f32 ? 2 * M : M;
  xb.resize(R * K);
  s.resize(R * ng);
  if (f32) {
    const float* xp = x.data_ptr<float>();
    for (int64_t i = 0; i < M * K; ++i) {
      const c10::BFloat16 hi(xp[i]);
      const c10::BFloat16 lo(xp[i] - static_cast<float>(hi));
      xb[i] = hi.x;
      xb[M * K + i] = lo.x;
    }
  } else {
    std::memcpy(xb.data(), x.data_ptr(), M * K * 2);
  }
  for (int64_t i = 0; i < R; ++i)
    for (int64_t g = 0; g < ng; ++g) {
      const uint16_t* src = xb.data() + i * K + g * kGroup;
      const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))), 16));
      const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16))), 16));
      s[i * ng + g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    }
}

// A unit's results (blocks b0 .. b0 + nb) into y [M, N] (x's dtype).
inline void write_rows(const std::vector<float>& res, int64_t M, int64_t N, int64_t b0, int nb,
                       bool bf16, torch::Tensor& y) {
  const int64_t n0 = b0 * kBlockN;
  const int64_t nv = std::min<int64_t>(nb * kBlockN, N - n0);
  for (int64_t i = 0; i < M; ++i) {
    const float* v = res.data() + i * kStride;
    if (bf16) {
      auto* yp = y.data_ptr<c10::BFloat16>() + i * N + n0;
      for (int64_t j = 0; j < nv; ++j) yp[j] = static_cast<c10::BFloat16>(v[j]);
    } else {  // hi row i plus lo row M + i
      const float* v2 = res.data() + (M + i) * kStride;
      float* yp = y.data_ptr<float>() + i * N + n0;
      for (int64_t j = 0; j < nv; ++j) yp[j] = v[j] + v2[j];
    }
  }
}

// Blocks per unit for the vector loops: enough independent dot-product chains (vdpbf16ps
// has a latency of several cycles) when there are few rows.
inline int loop_blocks(int64_t R, int64_t nblocks) {
  return (R == 1 && nblocks >= 4) ? 4 : ((R == 2 && nblocks >= 2) ? 2 : 1);
}

// A thread's units [begin, end) of NB blocks each: per unit, row_block(b0, nb, m0, mb, out)
// for each block of up to row_block_rows rows (out: its rows in the unit's results
// res [R, kStride]), then the unit's results written into y.
template <typename F>
inline void run_units(int64_t begin, int64_t end, int NB, int64_t nblocks, int64_t R,
                      int64_t row_block_rows, int64_t M, int64_t N, bool bf16, torch::Tensor& y,
                      F&& row_block) {
  std::vector<float> res(R * kStride);
  for (int64_t u = begin; u < end; ++u) {
    const int64_t b0 = u * NB;
    const int nb = static_cast<int>(std::min<int64_t>(NB, nblocks - b0));
    for (int64_t m0 = 0; m0 < R; m0 += row_block_rows)
      row_block(b0, nb, m0, std::min<int64_t>(row_block_rows, R - m0), res.data() + m0 * kStride);
    write_rows(res, M, N, b0, nb, bf16, y);
  }
}

// f(std::integral_constant<int, mb>{}) for mb in 1..8: a row count as a template argument.
template <typename F>
inline void with_rows(int64_t mb, F&& f) {
  switch (mb) {
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

}  // namespace bf16_rows
#endif
