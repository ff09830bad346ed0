// x @ W.T for int8 weights with one float32 scale per group of G input features:
// W[n, k] = q[n, k] * s[n, k / G]. GGUF's Q8_0 (G = 32), Q5_0 (G = 32) and Q6_K (G = 16,
// s = d * sc) are exactly this form, so the weights computed with are the file's values
// bit for bit (q * s is exact in float32: at most 8 + 18 significant bits... 24 used).
//
// Invariants: x [M, K] float32 contiguous, q [N, K] int8 contiguous, s [N, K / G] float32,
// K % G == 0 and G % kLanes == 0; y [M, N] float32, each entry one float32 sum (the order
// differs from a BLAS GEMM's). Each weight row is read from memory once per call whatever
// M is (rows of x are taken 4 at a time against the row, which stays in L1): the call is
// bound by reading the weight at decode sizes, by float FMAs at large M.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include "simd.h"

namespace {

// int8 -> float32: the sign extension by intrinsics where the width is the machine's
// (GCC scalarizes __builtin_convertvector from a char vector), else a plain loop.
inline vf load_i8(const int8_t* p) {
#if defined(__AVX512F__) && !defined(RADIXLM_SIMD_LANES)
  const __m512 v = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  return reinterpret_cast<const vf&>(v);
#elif defined(__AVX2__) && !defined(RADIXLM_SIMD_LANES)
  const __m256 v = _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  return reinterpret_cast<const vf&>(v);
#else
  vf v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}

inline float hsum(vf v) {
#if defined(__AVX512F__) && !defined(RADIXLM_SIMD_LANES)
  return _mm512_reduce_add_ps(reinterpret_cast<const __m512&>(v));
#else
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
#endif
}

// Rows m0 .. m0 + MB of x against weight row n.
template <int MB>
inline void row_dot(const float* x, int64_t K, const int8_t* qr, const float* sr, int64_t G,
                    float* y, int64_t N, int64_t n, int64_t m0) {
  vf acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = vf{};
  const int64_t ng = K / G;
  // Per group: the unscaled products summed, then one FMA by the group's scale (exact
  // weights either way; the sum is what is rounded).
  for (int64_t g = 0; g < ng; ++g) {
    const vf sg = splat(sr[g]);
    vf part[MB];
    for (int i = 0; i < MB; ++i) part[i] = vf{};
    for (int64_t k = g * G; k < (g + 1) * G; k += kLanes) {
      const vf w = load_i8(qr + k);
      for (int i = 0; i < MB; ++i) part[i] += w * load(x + (m0 + i) * K + k);
    }
    for (int i = 0; i < MB; ++i) acc[i] += part[i] * sg;
  }
  for (int i = 0; i < MB; ++i) y[(m0 + i) * N + n] = hsum(acc[i]);
}

}  // namespace

torch::Tensor int8_group_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor s, int64_t G) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(),
              "int8_group_matmul: x [M, K] float32 contiguous");
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kChar && q.is_contiguous(),
              "int8_group_matmul: q [N, K] int8 contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  TORCH_CHECK(q.size(1) == K && G > 0 && K % G == 0 && G % kLanes == 0,
              "int8_group_matmul: K a multiple of G, G of the vector width");
  TORCH_CHECK(s.scalar_type() == torch::kFloat && s.is_contiguous() && s.size(0) == N &&
              s.size(1) == K / G, "int8_group_matmul: s [N, K / G] float32 contiguous");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ng = K / G;
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int8_t* qr = qp + n * K;
      const float* sr = sp + n * ng;
      int64_t m0 = 0;
      for (; m0 + 4 <= M; m0 += 4) row_dot<4>(xp, K, qr, sr, G, yp, N, n, m0);
      switch (M - m0) {
        case 3: row_dot<3>(xp, K, qr, sr, G, yp, N, n, m0); break;
        case 2: row_dot<2>(xp, K, qr, sr, G, yp, N, n, m0); break;
        case 1: row_dot<1>(xp, K, qr, sr, G, yp, N, n, m0); break;
        default: break;
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_group_matmul", &int8_group_matmul,
        "x [M, K] f32 @ (q [N, K] int8 * s [N, K/G] f32 per group).T -> [M, N] f32.");
}
