// x @ W.T for 5-bit groupwise weights, w[n, k] = d[n, g] * (q[n, k] - 16) (g = k / 32,
// q in 0..31, d a float16: GGUF's Q5_0), read at their own size (0.6875 bytes a weight:
// 4 bits + 1 bit + 2 bytes of d per 32), with x UNQUANTIZED: bf16 dot products
// (AVX512-BF16 vdpbf16ps: exact bf16 x bf16 products, float32 sums). Each 5-bit q
// becomes the bf16 of 128 + q by putting 0x43 in the high byte of its 16-bit lane (exact:
// 128..159 are bf16 integers), and the offset goes into the group's additive term
// -144 d (float32, formed per group in the kernel):
//
//     y[i, n] = sum_g d[n, g] * (x[i, g, :] . (128 + q[n, g, :])) - 144 d[n, g] * S[i, g]
//
// with S the float32 sum of the group's x. The offset costs a cancellation of about
// 159 / 8 ~ 20 float32 ulps of the group's sum |x| |w| (~1e-5 relative), far below the
// bf16 rounding of x itself. float32 x is split into two bf16 rows (hi + lo: ~16 mantissa
// bits) whose results are added.
//
// Weight layout (packed at load by models/linear/q5_bf16_blocks.py): output channels in
// blocks of 16 (the last padded with q = d = 0), per block and group of 32 columns 320
// bytes: 4 chunks of 8 columns x 64 bytes of low nibbles (int4_bf16.cpp's layout: they
// unpack into 4 registers r of 32 bf16 lanes, lane 2 j + e = channel j, column 8 chunk +
// 2 r + e), then per chunk two 64-bit masks: bit b of the first = the high bit (16) of the
// value in byte b's low nibble, of the second = that of byte b's high nibble (added to the
// unpacked nibble bytes with one masked vpaddb each). d: [blocks, groups, 16] float16.
//
// Invariants: x [M, K] bf16 or float32 contiguous, K % 32 == 0; y [M, N] in x's dtype,
// each output's float32 sum rounded once. Built only with AVX512-BF16 (q5_bf16_path()
// says 0 otherwise and the matmul refuses: callers keep the int8_groups kernel).
#include "torch_api.h"
#include "prefetch.h"
#include "bf16_rows.h"
#include "int4_chunks.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <cstring>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define RADIXLM_Q5_BF16 1
#else
#define RADIXLM_Q5_BF16 0
#endif

namespace {

constexpr int kGroup = 32;
constexpr int kBlockN = 16;
constexpr int kRowBlock = 8;
constexpr int64_t kGroupBytes = 320;  // 256 nibble bytes + 4 x 16 mask bytes

#if RADIXLM_Q5_BF16

using bf16_rows::prepare;
using bf16_rows::kStride;
using bf16_rows::Rows;
using bf16_rows::with_rows;
using bf16_rows::write_rows;

// NB blocks of 16 channels (starting at block b0) against MB rows (starting at m0);
// out[i * ostride + nb * 16 + j] for i < MB.
template <int MB, int NB>
inline void block_dot(const Rows& X, int64_t m0, const uint8_t* wp, const uint16_t* dp,
                      int64_t b0, float* out, int64_t ostride) {
  const int64_t K = X.K, ng = X.ng;
  constexpr int AC = (MB * NB >= 8) ? 1 : 2;  // accumulators per (row, block): chains
  const int64_t bstride = ng * kGroupBytes;    // bytes per block of 16 channels
  __m512 tot[NB][MB];
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) tot[b][i] = _mm512_setzero_ps();
  const uint16_t* xr[MB];
  for (int i = 0; i < MB; ++i) xr[i] = X.x + (m0 + i) * K;
  for (int64_t g = 0; g < ng; ++g) {
    __m512 acc[NB][MB][AC];
    for (int b = 0; b < NB; ++b)
      for (int i = 0; i < MB; ++i)
        for (int a = 0; a < AC; ++a) acc[b][i][a] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int ch = 0; ch < 4; ++ch) {
      const int64_t k0 = g * kGroup + 8 * ch;
      for (int b = 0; b < NB; ++b) {
        const uint8_t* gp = wp + (b0 + b) * bstride + g * kGroupBytes;
        if (ch == 0) prefetch_ahead(gp + 256);  // the masks' line (320-byte groups)
        __m512i wi[4];
        unpack_q5_chunk(gp + 64 * ch, gp + 256 + 16 * ch, wi);
        __m512bh w[4];
        for (int r = 0; r < 4; ++r) w[r] = (__m512bh)wi[r];
        for (int i = 0; i < MB; ++i) {
          for (int r = 0; r < 4; ++r) {
            int32_t pair;
            std::memcpy(&pair, xr[i] + k0 + 2 * r, 4);
            acc[b][i][r % AC] = _mm512_dpbf16_ps(acc[b][i][r % AC], w[r],
                                                 (__m512bh)_mm512_set1_epi32(pair));
          }
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      // d: 32 bytes per 320-byte group.
      prefetch_ahead(dp + ((b0 + b) * ng + g) * kBlockN, kPrefetchBytes / 10);
      const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(dp + ((b0 + b) * ng + g) * kBlockN)));
      const __m512 cv = _mm512_mul_ps(_mm512_set1_ps(-144.f), dv);
      for (int i = 0; i < MB; ++i) {
        __m512 a = acc[b][i][0];
        if (AC == 2) a = _mm512_add_ps(a, acc[b][i][AC - 1]);
        tot[b][i] = _mm512_fmadd_ps(a, dv, tot[b][i]);
        tot[b][i] = _mm512_fmadd_ps(cv, _mm512_set1_ps(X.s[(m0 + i) * ng + g]), tot[b][i]);
      }
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) _mm512_storeu_ps(out + i * ostride + b * kBlockN, tot[b][i]);
}

template <int NB>
void rows_dot(const Rows& X, int64_t m0, int64_t mb, const uint8_t* wp, const uint16_t* dp,
              int64_t b0, float* out, int64_t ostride) {
  with_rows(mb, [&](auto MB) { block_dot<MB(), NB>(X, m0, wp, dp, b0, out, ostride); });
}

#endif

}  // namespace

int64_t q5_bf16_path() { return RADIXLM_Q5_BF16; }

torch::Tensor q5_bf16_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor d, int64_t N) {
  TORCH_CHECK(RADIXLM_Q5_BF16, "q5_bf16_matmul: built without AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat),
              "q5_bf16_matmul: x [M, K] bfloat16 or float32 contiguous");
  const int64_t M = x.size(0), K = x.size(1), ng = K / kGroup;
  TORCH_CHECK(K % kGroup == 0, "q5_bf16_matmul: K a multiple of 32");
  const int64_t nblocks = (N + kBlockN - 1) / kBlockN;
  TORCH_CHECK(w.scalar_type() == torch::kByte && w.is_contiguous() &&
                  w.numel() == nblocks * ng * kGroupBytes,
              "q5_bf16_matmul: w [ceil(N / 16), K / 32 * 320] uint8 contiguous");
  TORCH_CHECK(d.scalar_type() == torch::kHalf && d.is_contiguous() &&
                  d.numel() == nblocks * ng * kBlockN,
              "q5_bf16_matmul: d [ceil(N / 16), K / 32, 16] float16 contiguous");
  auto y = torch::empty({M, N}, x.options());
#if RADIXLM_Q5_BF16
  if (M == 0 || N == 0) return y;
  std::vector<uint16_t> xb;
  std::vector<float> s;
  int64_t R;
  prepare(x, xb, s, R);
  const Rows X{xb.data(), s.data(), K, ng};
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  const int NB = bf16_rows::loop_blocks(R, nblocks);
  const int64_t units = (nblocks + NB - 1) / NB;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    bf16_rows::run_units(begin, end, NB, nblocks, R, kRowBlock, M, N, bf16, y,
                         [&](int64_t b0, int nb, int64_t m0, int64_t mb, float* out) {
      if (nb == 4)
        rows_dot<4>(X, m0, mb, wp, dp, b0, out, kStride);
      else if (nb == 2)
        rows_dot<2>(X, m0, mb, wp, dp, b0, out, kStride);
      else
        for (int b = 0; b < nb; ++b)
          rows_dot<1>(X, m0, mb, wp, dp, b0 + b, out + b * kBlockN, kStride);
    });
  });
#endif
  return y;
}

#if RADIXLM_TORCH_OPS
// The entry as a torch op for compiled decode graphs (schema: models/linear/q5_bf16.py).
TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("q5_bf16_matmul", &q5_bf16_matmul); }
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("q5_bf16_matmul", &q5_bf16_matmul,
        "x [M, K] bf16/f32 @ (d * (q - 16) per group of 32).T -> [M, N] in x's dtype; x "
        "unquantized (bf16 dot products; see the source).");
  mod.def("q5_bf16_path", &q5_bf16_path, "1 AVX512-BF16, 0 not built for it.");
}
