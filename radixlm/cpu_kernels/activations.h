// The gated MLP's activations and bf16 rounding, shared by the kernels that apply them
// (norm_rope.cpp's act(gate) * up, bf16_tiles.cpp's fused gate_up epilogue), so that both
// round alike: float32 math in code GCC vectorizes, bf16 as its 16 bits.
//
// Invariants: bf16_store rounds to nearest even (c10::BFloat16's result for every value
// arithmetic produces; a quiet NaN stays a NaN); Act::apply(x) is the same float for the
// same x in every kernel that includes this header (one definition, one set of flags).
#pragma once

#include <cstdint>

#include "fast_exp.h"

inline float bf16_load(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t bf16_store(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

struct Silu {
  static float apply(float x) { return x / (1.f + exp_approx(-x)); }
};
// tanh-approximated GELU, 0.5 x (1 + tanh(z)) with z = sqrt(2 / pi) (x + 0.044715 x^3)
// (torch's approximate="tanh"), rounded as torch rounds it: with t = 1 + tanh(z) =
// 2 / (1 + exp(-2 z)) (accurate), torch's float32 tanh is t - 1 rounded, and adding 1
// back leaves t rounded to a multiple of 2^-24 where t < 1/2 (exactly 0 far in the negative
// tail), t itself above (the subtraction and the addition are exact there). Written
// without the "- 1 + 1", which -fassociative-math (build.py) would fold away.
struct GeluTanh {
  static float apply(float x) {
    const float z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    const float t = 2.f / (1.f + exp_approx(-2.f * z));
    const float h = t < 0.5f ? __builtin_rintf(t * 16777216.f) * (1.f / 16777216.f) : t;
    return 0.5f * x * h;
  }
};
