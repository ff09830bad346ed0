// One group of 32 float32 activations -> int8, llama.cpp's Q8 numerics, AVX2: the scale
// d = max|v| / 127, each q = v * (1 / d) rounded to float then to the nearest integer,
// ties to even (|q| <= 127: a u8 x s8 dot never saturates on that side), and the group's
// float32 sum. Shared by the kernels that quantize x per group (int4_groups: its AVX2
// path; groups_f32: its int8-activation calls) so both round the same way.
//
// Invariants: the 32 bytes come back in column order, one register; d = 0 (an all-zero
// group) gives q = 0.
#pragma once

#if defined(__AVX2__)

#include <immintrin.h>

#include <algorithm>

inline __m256i quantize_group_q8(const float* v, float& d, float& sum) {
  __m256 q[4];
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 mx = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm256_loadu_ps(v + 8 * i);
    mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, q[i]));
    sm = _mm256_add_ps(sm, q[i]);
  }
  alignas(32) float t[8], u[8];
  _mm256_store_ps(t, mx);
  _mm256_store_ps(u, sm);
  float amax = 0.f;
  sum = 0.f;
  for (int i = 0; i < 8; ++i) {
    amax = std::max(amax, t[i]);
    sum += u[i];
  }
  d = amax / 127.f;
  const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
  __m256i r[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(q[i], id));
  // packs interleave the 128-bit halves: [0 1 2 3 | 4 5 6 7] of 4-byte runs -> order.
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

#endif  // __AVX2__
