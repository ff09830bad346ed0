// Float vectors of the machine's width as GCC vector extensions (no intrinsics: the same
// source compiles for AVX-512, AVX2 or anything else g++ targets), for the kernels of
// this folder. kLanes is 16 where the compiler targets AVX-512F (-march=native on such a
// CPU), else 8; -DRADIXLM_SIMD_LANES=8 forces 8 (a test builds the AVX2 width that way).
//
// Invariants: vf holds kLanes float32; loads and stores are unaligned (memcpy) and read or
// write exactly kLanes elements; bf16 -> f32 is exact (the 16 bits moved up).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "fast_exp.h"

#if defined(RADIXLM_SIMD_LANES)
constexpr int kLanes = RADIXLM_SIMD_LANES;
#elif defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif

typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef int32_t vi __attribute__((vector_size(kLanes * 4)));
typedef uint32_t vu __attribute__((vector_size(kLanes * 4)));
typedef uint16_t vh __attribute__((vector_size(kLanes * 2)));

inline vf splat(float x) { return vf{} + x; }

inline vf lane_index() {
  vf v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(i);
  return v;
}

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline vf load(const c10::BFloat16* p) {
  vh h;
  std::memcpy(&h, p, sizeof h);
  const vu u = __builtin_convertvector(h, vu) << 16;
  return reinterpret_cast<const vf&>(u);
}

inline vf load(const c10::Half* p) {
  vf v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// Two vectors from 2 * kLanes elements of a row: the elements in order, except for bf16:
// its even elements, then its odd ones (bit operations on 32-bit lanes, no shuffle).
// Row layout of type T: where element i of a group of 2 * kLanes ends up, see row_index.
template <typename T>
inline void load2(const T* p, vf& a, vf& b) {
  a = load(p);
  b = load(p + kLanes);
}

inline void load2(const c10::BFloat16* p, vf& a, vf& b) {
  vu u;
  std::memcpy(&u, p, sizeof u);
  a = (vf)(u << 16);
  b = (vf)(u & 0xFFFF0000u);
}

// The row element that position i of load2's layout holds.
template <typename T>
inline int64_t row_index(int64_t i) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const int64_t r = i % (2 * kLanes);
    return i - r + 2 * (r % kLanes) + r / kLanes;
  } else {
    return i;
  }
}

// Each lane rounded to bf16 precision (nearest, ties to even; the low 16 bits zero), as
// activations.h's bf16_store rounds one value; for finite lanes.
inline vf round_bf16(vf x) {
  const vu u = reinterpret_cast<const vu&>(x);
  const vu r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  return reinterpret_cast<const vf&>(r);
}

inline float hsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

namespace simd_detail {
template <int W, int... J>
inline vf swap_lanes(vf x, std::integer_sequence<int, J...>) {
  return __builtin_shufflevector(x, x, (J ^ W)...);  // lane j <- lane j xor W
}
template <int W>
inline vf max_tree(vf v) {
  const vf t = swap_lanes<W>(v, std::make_integer_sequence<int, kLanes>{});
  v = v > t ? v : t;
  if constexpr (W > 1) return max_tree<W / 2>(v);
  return v;
}
}  // namespace simd_detail

// The largest lane, by a tree of shuffles (a scalar loop would be a chain of kLanes maxes).
inline float hmax(vf v) { return simd_detail::max_tree<kLanes / 2>(v)[0]; }

// exp over a vector: fast_exp.h's exp_approx lane by lane (same range reduction and
// polynomial; n = floor(x log2e + 1/2) by truncating a positive number, so that no
// rounding builtin is needed).
inline vf exp_vec(vf x) {
  x = x < -87.f ? splat(-87.f) : x;
  x = x > 88.f ? splat(88.f) : x;
  const vi n = __builtin_convertvector(x * 1.44269504f + 128.5f, vi) - 128;
  const vf nf = __builtin_convertvector(n, vf);
  const vf r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;
  const vf p = exp_taylor(r);
  const vi bits = (n + 127) << 23;  // 2^n, n in [-126, 127]
  return p * reinterpret_cast<const vf&>(bits);
}

namespace simd_detail {

// fold<S>(x, y): x and y hold kLanes / S segments of S lanes, each the partial sums of one
// dot product. In the result, segment i of S lanes holds x's segment i folded in half in
// its low half and y's in its high half: a = (x's low halves, y's high halves) is a
// blend, b = (x's high halves, y's low halves) one two-source shuffle, a + b the fold.
constexpr int blend_index(int s, int j) {
  return (j % s) < s / 2 ? j : kLanes + j;
}
constexpr int swap_index(int s, int j) {
  const int h = s / 2, base = j - j % s, r = j % s;
  return r < h ? base + h + r : kLanes + base + r - h;
}

template <int S, int... J>
inline vf fold(vf x, vf y, std::integer_sequence<int, J...>) {
  return __builtin_shufflevector(x, y, blend_index(S, J)...) +
         __builtin_shufflevector(x, y, swap_index(S, J)...);
}

template <int S>
inline void reduce_level(vf* v) {
  // S vectors of segment size S -> S / 2 vectors of segment size S / 2.
  for (int m = 0; m < S / 2; ++m)
    v[m] = fold<S>(v[2 * m], v[2 * m + 1], std::make_integer_sequence<int, kLanes>{});
  if constexpr (S > 2) reduce_level<S / 2>(v);
}

}  // namespace simd_detail

// v[0, kLanes): lane k of the result is the sum of the lanes of v[transpose_order()[k]]
// (a transpose-add: one reduction for kLanes dot products, in a bit-reversed lane order).
// v is overwritten.
inline vf transpose_sum(vf* v) {
  simd_detail::reduce_level<kLanes>(v);
  return v[0];
}

// Which input of transpose_sum each lane of its result sums (as float, exact).
inline vf transpose_order() {
  vf v[kLanes];
  for (int j = 0; j < kLanes; ++j) v[j] = splat(static_cast<float>(j));
  return transpose_sum(v) * (1.f / kLanes);
}
