// exp(x) in float32 arithmetic the compiler vectorizes (std::exp is a scalar libm call),
// shared by the kernels of this folder (build.py hashes headers into every kernel's key).
#pragma once

#include <cstdint>

// exp(x) = 2^n * exp(r), x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-7 Taylor
// polynomial (relative error < 1e-7); x clamped to [-87, 88], where float32's exp neither
// underflows to subnormals nor overflows (below -87 the result is ~1.6e-38, as good as 0).
// exp(r) for |r| <= ln2 / 2 by its degree-7 Taylor polynomial; T is float or a GCC vector
// of floats (simd.h's exp_vec), so both evaluate it in the same order.
template <typename T>
inline T exp_taylor(T r) {
  T p = T{} + 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  return p * r + 1.f;
}

inline float exp_approx(float x) {
  x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  const float n = __builtin_roundf(x * 1.44269504f);
  // ln2 split in two parts so that n * ln2 is subtracted without losing r's bits.
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  const float p = exp_taylor(r);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 127]
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
