// x @ W.T for int8 weights with one float32 scale per group of G input features,
// W[n, k] = q[n, k] * s[n, k / G] (GGUF's Q8_0 and Q5_0: G = 32; Q6_K: G = 16, s = d * sc),
// computed as llama.cpp computes Q8_0 x Q8_0: each row of x is quantized per group of G
// to int8 (a = round(x / d), d = max|x| / 127), the products summed in int32 per 4 bytes
// (AVX512-VNNI dpbusd of a + 128 (u8) by q (s8), less 128 * the weights' lane sums, once
// per weight chunk for all rows of x; AVX2 maddubs of |q| by a with q's sign; or a scalar
// loop: chosen at compile time), each int32 sum converted and scaled by s * d in float32,
// one reduction per output.
//
// Invariants: x [M, K] float32 or bfloat16 contiguous, q [N, K] int8 contiguous, s
// [N, K / G] float32, G 16 or 32 dividing K; y [M, N] float32 equal
// to (a * d) @ W.T up to float32 rounding of the scaled sums (the int32 sums are exact).
// Every weight byte is read from memory once per call whatever M is (rows of x go 8 at a
// time against a weight row, which stays in L1), so a call is bound by the weight's read.
#include "torch_api.h"
#include "prefetch.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// 2: AVX512-VNNI, 1: AVX2, 0: scalar; -DRADIXLM_INT8_GROUPS_PATH=N forces one (tests).
#if !defined(RADIXLM_INT8_GROUPS_PATH)
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define RADIXLM_INT8_GROUPS_PATH 2
#elif defined(__AVX2__)
#define RADIXLM_INT8_GROUPS_PATH 1
#else
#define RADIXLM_INT8_GROUPS_PATH 0
#endif
#endif

namespace {

constexpr int64_t kChunk = 64;  // activations are padded to a multiple of this many bytes
constexpr int kRowBlock = 8;    // rows of x taken together against one weight row

// The activations quantized: a [M, Kp] int8 (zero past K), au = a + 128 as u8 (VNNI's
// unsigned operand; 128 past K), and per 4-byte lane (the unit of an int32 partial sum)
// its group's scale d (zero past K).
struct QuantX {
  int64_t Kp = 0, L = 0;  // padded K, lanes per row (Kp / 4)
  std::vector<int8_t> a;
  std::vector<uint8_t> au;
  std::vector<float> d;
};

template <typename T>
QuantX quantize_rows(const T* x, int64_t M, int64_t K, int64_t G) {
  QuantX qx;
  qx.Kp = (K + kChunk - 1) / kChunk * kChunk;
  qx.L = qx.Kp / 4;
  qx.a.assign(M * qx.Kp, 0);
  qx.d.assign(M * qx.L, 0.f);

  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * K;
    int8_t* ar = qx.a.data() + m * qx.Kp;
    for (int64_t g0 = 0; g0 < K; g0 += G) {
      float amax = 0.f;
      for (int64_t k = g0; k < g0 + G; ++k) amax = std::max(amax, std::fabs(float(xr[k])));
      const float d = amax / 127.f;
      const float id = d > 0.f ? 1.f / d : 0.f;
      for (int64_t k = g0; k < g0 + G; ++k)
        ar[k] = static_cast<int8_t>(std::nearbyint(float(xr[k]) * id));
      for (int64_t l = g0 / 4; l < (g0 + G) / 4; ++l) qx.d[m * qx.L + l] = d;
    }
  }
  qx.au.resize(qx.a.size());
  for (size_t i = 0; i < qx.a.size(); ++i) qx.au[i] = static_cast<uint8_t>(qx.a[i] + 128);
  return qx;
}

#if RADIXLM_INT8_GROUPS_PATH == 2
// Rows m0 .. m0 + MB of x against weight row qr (scales sr).
// Weight rows n .. n + NB (chunk pointers w[j], scales ws[j]) against rows m0 .. m0 + MB of
// x, one 64-byte chunk: dpbusd multiplies u8 (a + 128) by s8 (q); the weights' lane sums
// times 128 (once per chunk, shared by every row of x) are taken off first.
template <int MB, int NB>
inline void chunk_dot(__m512 (&acc)[NB][MB], const __m512i (&w)[NB], const __m512 (&ws)[NB],
                      const uint8_t* A, const float* D, int64_t Kp, int64_t L) {
  const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i neg[NB];
  for (int j = 0; j < NB; ++j)
    neg[j] = _mm512_sub_epi32(_mm512_setzero_si512(),
                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, w[j]));
  for (int i = 0; i < MB; ++i) {
    const __m512i a = _mm512_loadu_si512(A + i * Kp);
    const __m512 d = _mm512_loadu_ps(D + i * L);
    for (int j = 0; j < NB; ++j) {
      const __m512i p = _mm512_dpbusd_epi32(neg[j], a, w[j]);
      acc[j][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ws[j], d), acc[j][i]);
    }
  }
}

// Rows m0 .. m0 + MB of x against weight rows qr + j * K (scales sr + j * K / G), j < NB.
template <int MB, int NB, int G>
inline void row_dot(const QuantX& qx, int64_t m0, const int8_t* qr, const float* sr, int64_t K,
                    const __m512i lane_group, float* out, int64_t N) {
  __m512 acc[NB][MB];
  for (int j = 0; j < NB; ++j)
    for (int i = 0; i < MB; ++i) acc[j][i] = _mm512_setzero_ps();
  const int64_t Kp = qx.Kp, L = qx.L, ng = K / G;
  const uint8_t* A = qx.au.data() + m0 * Kp;
  const float* D = qx.d.data() + m0 * L;
  constexpr int kGroups = kChunk / G;  // per chunk
  __m512i w[NB];
  __m512 ws[NB];
  int64_t k = 0;
  for (; k + kChunk <= K; k += kChunk) {
    for (int j = 0; j < NB; ++j) {
      prefetch_ahead(qr + j * K + k);
      prefetch_ahead(sr + j * ng + k / G, kPrefetchBytes * 4 / G);
      w[j] = _mm512_loadu_si512(qr + j * K + k);
      ws[j] = _mm512_permutexvar_ps(
          lane_group, _mm512_maskz_loadu_ps((1u << kGroups) - 1, sr + j * ng + k / G));
    }
    chunk_dot<MB, NB>(acc, w, ws, A + k, D + k / 4, Kp, L);
  }
  if (k < K) {  // bytes past K: weight 0, activation 0 (padding)
    const int64_t left = K - k;
    for (int j = 0; j < NB; ++j) {
      w[j] = _mm512_maskz_loadu_epi8(~0ULL >> (64 - left), qr + j * K + k);
      ws[j] = _mm512_permutexvar_ps(
          lane_group, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (left / G)) - 1),
                                            sr + j * ng + k / G));
    }
    chunk_dot<MB, NB>(acc, w, ws, A + k, D + k / 4, Kp, L);
  }
  for (int j = 0; j < NB; ++j)
    for (int i = 0; i < MB; ++i) out[(m0 + i) * N + j] = _mm512_reduce_add_ps(acc[j][i]);
}
#elif RADIXLM_INT8_GROUPS_PATH == 1
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// maddubs multiplies u8 by s8 into saturating int16 pairs: |q| (<= 128) by a with q's
// sign (|a| <= 127) keeps each pair within 2 * 128 * 127 < 32767.
template <int MB, int G>
inline void row_dot(const QuantX& qx, int64_t m0, const int8_t* qr, const float* sr, int64_t K,
                    float* out, int64_t N) {
  __m256 acc[MB];
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t k = 0; k < K; k += 32) {
    const bool half = K - k < 32;  // 16 bytes left (K % 16 == 0)
    prefetch_ahead(qr + k);
    prefetch_ahead(sr + k / G, kPrefetchBytes * 4 / G);
    const __m256i w = half
        ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qr + k)))
        : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qr + k));
    const __m256i aw = _mm256_abs_epi8(w);
    const float s0 = sr[k / G];
    const float s1 = (G == 16 && !half) ? sr[k / G + 1] : s0;
    const __m256 ws = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
    for (int i = 0; i < MB; ++i) {
      const int64_t m = m0 + i;
      const __m256i a =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx.a.data() + m * qx.Kp + k));
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), ones);
      const __m256 sc = _mm256_mul_ps(ws, _mm256_loadu_ps(qx.d.data() + m * qx.L + k / 4));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[i]);
    }
  }
  for (int i = 0; i < MB; ++i) out[(m0 + i) * N] = hsum256(acc[i]);
}
#else
template <int MB, int G>
inline void row_dot(const QuantX& qx, int64_t m0, const int8_t* qr, const float* sr, int64_t K,
                    float* out, int64_t N) {
  for (int i = 0; i < MB; ++i) {
    const int64_t m = m0 + i;
    const int8_t* ar = qx.a.data() + m * qx.Kp;
    float acc = 0.f;
    for (int64_t g0 = 0; g0 < K; g0 += G) {
      int32_t isum = 0;
      for (int64_t k = g0; k < g0 + G; ++k) isum += int32_t(qr[k]) * int32_t(ar[k]);
      acc += float(isum) * (sr[g0 / G] * qx.d[m * qx.L + g0 / 4]);
    }
    out[m * N] = acc;
  }
}
#endif

template <int MB, int G, int NB = 1>
inline void rows_against(const QuantX& qx, int64_t m0, const int8_t* qr, const float* sr,
                         int64_t K, float* out, int64_t N) {
#if RADIXLM_INT8_GROUPS_PATH == 2
  // lane j of a 64-byte chunk holds bytes 4j .. 4j + 3: its group is 4j / G.
  const __m512i lane_group = G == 16
      ? _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
      : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  row_dot<MB, NB, G>(qx, m0, qr, sr, K, lane_group, out, N);
#else
  for (int j = 0; j < NB; ++j) row_dot<MB, G>(qx, m0, qr + j * K, sr + j * (K / G), K, out + j, N);
#endif
}

// Every row of x (8 at a time) against NB weight rows.
template <int G, int NB>
inline void rows_block(const QuantX& qx, int64_t M, const int8_t* qr, const float* sr,
                       int64_t K, float* out, int64_t N) {
  int64_t m0 = 0;
  for (; m0 + kRowBlock <= M; m0 += kRowBlock)
    rows_against<kRowBlock, G, NB>(qx, m0, qr, sr, K, out, N);
  switch (M - m0) {
    case 7: rows_against<7, G, NB>(qx, m0, qr, sr, K, out, N); break;
    case 6: rows_against<6, G, NB>(qx, m0, qr, sr, K, out, N); break;
    case 5: rows_against<5, G, NB>(qx, m0, qr, sr, K, out, N); break;
    case 4: rows_against<4, G, NB>(qx, m0, qr, sr, K, out, N); break;
    case 3: rows_against<3, G, NB>(qx, m0, qr, sr, K, out, N); break;
    case 2: rows_against<2, G, NB>(qx, m0, qr, sr, K, out, N); break;
    case 1: rows_against<1, G, NB>(qx, m0, qr, sr, K, out, N); break;
    default: break;
  }
}

template <int G>
void matmul_rows(const QuantX& qx, int64_t M, const int8_t* qp, const float* sp, int64_t K,
                 float* yp, int64_t N) {
  // Past 4 rows of x, weight rows in pairs (sharing the loads of x: ~10% faster at 8 rows
  // in cache); up to 4, one at a time (pairs streamed a 262144-row head at one row 2x
  // slower on a 2-vCPU EPYC).
  const int64_t nb = M > 4 ? 2 : 1;
  at::parallel_for(0, (N + nb - 1) / nb, 16 / nb, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n = nb * p;
      if (nb == 2 && n + 1 < N)
        rows_block<G, 2>(qx, M, qp + n * K, sp + n * (K / G), K, yp + n, N);
      else
        rows_block<G, 1>(qx, M, qp + n * K, sp + n * (K / G), K, yp + n, N);
    }
  });
}

}  // namespace

torch::Tensor int8_group_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor s, int64_t G) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
              (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16),
              "int8_group_matmul: x [M, K] float32 or bfloat16 contiguous");
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kChar && q.is_contiguous(),
              "int8_group_matmul: q [N, K] int8 contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  TORCH_CHECK(q.size(1) == K && (G == 16 || G == 32) && K % G == 0,
              "int8_group_matmul: G 16 or 32, K a multiple of G");
  TORCH_CHECK(s.scalar_type() == torch::kFloat && s.is_contiguous() && s.size(0) == N &&
              s.size(1) == K / G, "int8_group_matmul: s [N, K / G] float32 contiguous");
  auto y = torch::empty({M, N}, x.options().dtype(torch::kFloat));
  if (M == 0 || N == 0) return y;
  const QuantX qx = x.scalar_type() == torch::kFloat
      ? quantize_rows(x.data_ptr<float>(), M, K, G)
      : quantize_rows(x.data_ptr<at::BFloat16>(), M, K, G);
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (G == 16) matmul_rows<16>(qx, M, qp, sp, K, yp, N);
  else matmul_rows<32>(qx, M, qp, sp, K, yp, N);
  return y;
}

// The activation quantization alone (tests: the exact reference of the int8 products).
std::vector<torch::Tensor> quantize_activations(torch::Tensor x, int64_t G) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat &&
              G > 0 && x.size(1) % G == 0, "quantize_activations: x [M, K] float32");
  const int64_t M = x.size(0), K = x.size(1);
  const QuantX qx = quantize_rows(x.data_ptr<float>(), M, K, G);
  auto a = torch::empty({M, K}, torch::kChar);
  auto d = torch::empty({M, K / G}, torch::kFloat);
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(a.data_ptr<int8_t>() + m * K, qx.a.data() + m * qx.Kp, K);
    for (int64_t g = 0; g < K / G; ++g)
      d.data_ptr<float>()[m * (K / G) + g] = qx.d[m * qx.L + g * G / 4];
  }
  return {a, d};
}

#if RADIXLM_TORCH_OPS
// The entry as a torch op for compiled decode graphs (schema: models/linear/int8_groups.py).
TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("int8_group_matmul", &int8_group_matmul); }
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_group_matmul", &int8_group_matmul,
        "x [M, K] f32/bf16 (quantized per group of G to int8) @ (q [N, K] int8 * s [N, K/G] "
        "f32 per group).T -> [M, N] f32.");
  m.def("quantize_activations", &quantize_activations,
        "x [M, K] f32 -> (a [M, K] int8, d [M, K/G] f32): x ~ a * d per group of G.");
  m.def("path", []() { return static_cast<int64_t>(RADIXLM_INT8_GROUPS_PATH); },
        "2: AVX512-VNNI, 1: AVX2, 0: scalar.");
}
