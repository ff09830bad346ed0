// x @ W.T for 4-bit groupwise weights, w[n, k] = d[n, g] * q[n, k] + m[n, g] (g = k / 32,
// q in 0..15: GGUF's Q4_0/Q4_1/Q4_K), with x UNQUANTIZED: bf16 dot products
// (AVX512-BF16 vdpbf16ps: exact bf16 x bf16 products, float32 sums). Each nibble q
// becomes the bf16 of 128 + q by putting 0x43 in the high byte of its 16-bit lane (exact:
// 128..143 are bf16 integers), and the offset goes into the group's additive term
// c = m - 128 d (float32, formed per group in the kernel):
//
//     y[i, n] = sum_g d[n, g] * (x[i, g, :] . (128 + q[n, g, :])) + c[n, g] * S[i, g]
//
// with S the float32 sum of the group's x. The 128 offset costs a cancellation of about
// 143 / 8 ~ 20 float32 ulps of the group's sum |x| (~1e-5 relative), far below the bf16
// rounding of x itself. float32 x is split into two bf16 rows (hi + lo: ~16 mantissa bits)
// whose results are added.
//
// Weight layout (packed at load by models/linear/int4_bf16_blocks.py): output channels in
// blocks of 16 (the last padded with q = d = c = 0), per block the K columns in chunks of
// 8, one chunk = 64 bytes that unpack (nibbles, then unpacklo/hi_epi8 with 0x43) into 4
// registers r of 32 bf16 lanes,, lane 2 j + e = channel j, column 8 chunk + 2 r + e: the
// operand of one vdpbf16ps against the broadcast pair (x[2 r], x[2 r + 1]). Each unpacked
// register is applied to every row of x (up to 8 rows at a time): M rows cost far less
// than M one-row calls. d, m: [blocks, groups, 16] float32. On a CPU with AMX-BF16 (and
// the OS granting its tile state) the same 4 registers per chunk, stored, are a group's B
// tile, and one tile product per group and block of 16 channels serves up to 8 rows:
// 1 row as fast as the vector loops, 4 rows 1.7x, 8 rows 2.35x (docs/benchmarks.md,
// "int4 x bf16 on AMX tiles"). Every call of a process takes the same path.
//
// Invariants: x [M, K] bf16 or float32 contiguous, K % 32 == 0; y [M, N] in x's dtype,
// each output's float32 sum rounded once; a row's result is the same whatever M.
// Built only with AVX512-BF16 (int4_bf16_path() says 0 otherwise and the matmul refuses:
// callers keep aten's int4pack kernel).
#include "torch_api.h"
#include "prefetch.h"
#include "bf16_rows.h"
#include "int4_chunks.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <cstring>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define RADIXLM_INT4_BF16 1
#else
#define RADIXLM_INT4_BF16 0
#endif
// AMX-BF16 (where the compiler targets it; -DRADIXLM_INT4_AMX=0 builds without it).
#if !defined(RADIXLM_INT4_AMX)
#if RADIXLM_INT4_BF16 && defined(__AMX_BF16__) && defined(__AMX_TILE__)
#define RADIXLM_INT4_AMX 1
#else
#define RADIXLM_INT4_AMX 0
#endif
#endif
#if RADIXLM_INT4_AMX
#include "amx_tiles.h"
#endif

namespace {

constexpr int kGroup = 32;
constexpr int kBlockN = 16;
constexpr int kRowBlock = 8;

#if RADIXLM_INT4_BF16

using bf16_rows::prepare;
using bf16_rows::kStride;
using bf16_rows::Rows;
using bf16_rows::with_rows;
using bf16_rows::write_rows;

// Block blk's d and c = m - 128 d for group g (d and m read kPrefetchBytes / 4 ahead:
// 64 bytes each per 256 bytes of nibbles).
struct GroupScales {
  __m512 d, c;
};
inline GroupScales group_scales(const float* dp, const float* cp, int64_t blk, int64_t g,
                                int64_t ng) {
  const int64_t off = (blk * ng + g) * kBlockN;
  prefetch_ahead(dp + off, kPrefetchBytes / 4);
  prefetch_ahead(cp + off, kPrefetchBytes / 4);
  const __m512 d = _mm512_loadu_ps(dp + off);
  return {d, _mm512_fnmadd_ps(_mm512_set1_ps(128.f), d, _mm512_loadu_ps(cp + off))};
}

// NB blocks of 16 channels (starting at block b0) against MB rows (starting at m0);
// out[i * ostride + nb * 16 + j] for i < MB.
template <int MB, int NB>
inline void block_dot(const Rows& X, int64_t m0, const uint8_t* wp, const float* dp,
                      const float* cp, int64_t b0, float* out, int64_t ostride) {
  const int64_t K = X.K, ng = X.ng;
  // Accumulators per (row, block): two chains, whatever MB, so that a row's sums are added
  // in the same order at every row count (a speculative verify's 8 rows equal its decode
  // steps' single rows bit for bit; one chain at MB * NB >= 8 moved greedy tokens).
  constexpr int AC = 2;
  const int64_t bstride = K * kBlockN / 2;     // bytes per block of 16 channels
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
        __m512i w[4];
        unpack_chunk(wp + (b0 + b) * bstride + k0 * 8, w);
        for (int i = 0; i < MB; ++i) {
          for (int r = 0; r < 4; ++r) {
            int32_t pair;
            std::memcpy(&pair, xr[i] + k0 + 2 * r, 4);
            acc[b][i][r % AC] = _mm512_dpbf16_ps(acc[b][i][r % AC], (__m512bh)w[r],
                                                 (__m512bh)_mm512_set1_epi32(pair));
          }
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      const auto [dv, cv] = group_scales(dp, cp, b0 + b, g, ng);
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
void rows_dot(const Rows& X, int64_t m0, int64_t mb, const uint8_t* wp, const float* dp,
              const float* cp, int64_t b0, float* out, int64_t ostride) {
  with_rows(mb, [&](auto MB) { block_dot<MB(), NB>(X, m0, wp, dp, cp, b0, out, ostride); });
}

#if RADIXLM_INT4_AMX
using amx_tiles::amx_permitted;

// Tile 0: A, mb (<= 8) rows of x x one group's 32 bf16 columns; 1..3: B, one block's group
// (16 column pairs x 16 channels x 2); 4..6: C, mb rows x 16 channels float32.
void configure_tiles(int mb) {
  const int rows[7] = {mb, 16, 16, 16, mb, mb, mb};
  amx_tiles::configure(rows, 7);
}

// One block's tile product for a group: C tile TC = A (tile 0) x B tile TB, with B loaded
// from bt (GCC's tile intrinsics take the tile numbers as literals).
#define RADIXLM_TILE_DP(TB, TC, bt) \
  do {                              \
    _tile_zero(TC);                 \
    _tile_loadd(TB, bt, 64);        \
    _tile_dpbf16ps(TC, 0, TB);      \
  } while (0)

// block_dot on AMX for MB <= 8 rows (the tiles configured for MB): per group, each
// block's nibbles unpack into a B tile (the 4 registers of chunk ch are column pairs
// 4 ch .. 4 ch + 3: already the tile's pair-interleaved layout) and one tile product gives
// the group's dot products for every row; d and c are then applied per row as block_dot
// does, into accumulators held in registers. Software-pipelined: the next group unpacks
// while this group's products run. A row's result does not depend on MB (each C element
// is its own sum), so 1-row decode steps and 8-row verifies agree bit for bit.
template <int MB, int NB>
void block_dot_amx(const Rows& X, int64_t m0, const uint8_t* wp, const float* dp,
                   const float* cp, int64_t b0, float* out, int64_t ostride) {
  const int64_t K = X.K, ng = X.ng;
  const int64_t bstride = K * kBlockN / 2;
  alignas(64) uint16_t bt[2][NB][16 * 32];  // double-buffered B tiles
  alignas(64) float ct[NB][MB * kBlockN];
  __m512 tot[NB][MB];
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) tot[b][i] = _mm512_setzero_ps();
  auto unpack = [&](int64_t g, uint16_t (*dst)[16 * 32]) {
    for (int b = 0; b < NB; ++b) {
      const uint8_t* gp = wp + (b0 + b) * bstride + g * 256;
      for (int ch = 0; ch < 4; ++ch) {
        __m512i w[4];
        unpack_chunk(gp + 64 * ch, w);
        for (int r = 0; r < 4; ++r) _mm512_store_si512(dst[b] + 32 * (4 * ch + r), w[r]);
      }
    }
  };
  auto issue = [&](int64_t g, uint16_t (*src)[16 * 32]) {
    _tile_loadd(0, X.x + m0 * K + g * kGroup, K * 2);
    RADIXLM_TILE_DP(1, 4, src[0]);
    if constexpr (NB > 1) RADIXLM_TILE_DP(2, 5, src[1]);
    if constexpr (NB > 2) RADIXLM_TILE_DP(3, 6, src[2]);
  };
  auto finish = [&](int64_t g) {
    _tile_stored(4, ct[0], 64);
    if constexpr (NB > 1) _tile_stored(5, ct[1], 64);
    if constexpr (NB > 2) _tile_stored(6, ct[2], 64);
    for (int b = 0; b < NB; ++b) {
      const auto [dv, cv] = group_scales(dp, cp, b0 + b, g, ng);
      for (int i = 0; i < MB; ++i) {
        tot[b][i] = _mm512_fmadd_ps(_mm512_load_ps(ct[b] + i * kBlockN), dv, tot[b][i]);
        tot[b][i] = _mm512_fmadd_ps(cv, _mm512_set1_ps(X.s[(m0 + i) * ng + g]), tot[b][i]);
      }
    }
  };
  unpack(0, bt[0]);
  issue(0, bt[0]);
  for (int64_t g = 0; g < ng; ++g) {
    if (g + 1 < ng) unpack(g + 1, bt[(g + 1) & 1]);
    finish(g);
    if (g + 1 < ng) issue(g + 1, bt[(g + 1) & 1]);
  }
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < MB; ++i) _mm512_storeu_ps(out + i * ostride + b * kBlockN, tot[b][i]);
}

template <int NB>
void rows_dot_amx(const Rows& X, int64_t m0, int64_t mb, const uint8_t* wp, const float* dp,
                  const float* cp, int64_t b0, float* out, int64_t ostride) {
  with_rows(mb, [&](auto MB) {
    block_dot_amx<MB(), NB>(X, m0, wp, dp, cp, b0, out, ostride);
  });
}
#endif

#endif

}  // namespace

// 2: AMX-BF16 tiles (built for them and granted by the OS), 1: AVX512-BF16, 0: neither.
int64_t int4_bf16_path() {
#if RADIXLM_INT4_AMX
  if (amx_permitted()) return 2;
#endif
  return RADIXLM_INT4_BF16;
}

torch::Tensor int4_bf16_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor d,
                               torch::Tensor m, int64_t N) {
  TORCH_CHECK(RADIXLM_INT4_BF16, "int4_bf16_matmul: built without AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat),
              "int4_bf16_matmul: x [M, K] bfloat16 or float32 contiguous");
  const int64_t M = x.size(0), K = x.size(1), ng = K / kGroup;
  TORCH_CHECK(K % kGroup == 0, "int4_bf16_matmul: K a multiple of 32");
  const int64_t nblocks = (N + kBlockN - 1) / kBlockN;
  TORCH_CHECK(w.scalar_type() == torch::kByte && w.is_contiguous() &&
                  w.numel() == nblocks * kBlockN * K / 2,
              "int4_bf16_matmul: w [ceil(N / 16), K * 8] uint8 contiguous");
  TORCH_CHECK(d.scalar_type() == torch::kFloat && m.scalar_type() == torch::kFloat &&
                  d.is_contiguous() && m.is_contiguous() &&
                  d.numel() == nblocks * ng * kBlockN && m.numel() == d.numel(),
              "int4_bf16_matmul: d, m [ceil(N / 16), K / 32, 16] float32 contiguous");
  auto y = torch::empty({M, N}, x.options());
#if RADIXLM_INT4_BF16
  if (M == 0 || N == 0) return y;
  std::vector<uint16_t> xb;
  std::vector<float> s;
  int64_t R;
  prepare(x, xb, s, R);
  const Rows X{xb.data(), s.data(), K, ng};
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* dp = d.data_ptr<float>();
  const float* cp = m.data_ptr<float>();  // m; c = m - 128 d per group
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
#if RADIXLM_INT4_AMX
  const bool amx = amx_permitted();
#else
  constexpr bool amx = false;
#endif
  // Blocks at a time: on AMX, 3 tile products in flight; else bf16_rows::loop_blocks.
  const int NB = amx ? (nblocks >= 3 ? 3 : 1) : bf16_rows::loop_blocks(R, nblocks);
  const int64_t units = (nblocks + NB - 1) / NB;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    [[maybe_unused]] int configured = 0;  // the rows the tiles are configured for (AMX)
    bf16_rows::run_units(begin, end, NB, nblocks, R, kRowBlock, M, N, bf16, y,
                         [&](int64_t b0, int nb, int64_t m0, int64_t mb, float* out) {
#if RADIXLM_INT4_AMX
      if (amx) {
        if (mb != configured) configure_tiles(configured = static_cast<int>(mb));
        if (nb == 3)
          rows_dot_amx<3>(X, m0, mb, wp, dp, cp, b0, out, kStride);
        else
          for (int b = 0; b < nb; ++b)
            rows_dot_amx<1>(X, m0, mb, wp, dp, cp, b0 + b, out + b * kBlockN, kStride);
        return;
      }
#endif
      if (nb == 4)
        rows_dot<4>(X, m0, mb, wp, dp, cp, b0, out, kStride);
      else if (nb == 2)
        rows_dot<2>(X, m0, mb, wp, dp, cp, b0, out, kStride);
      else
        for (int b = 0; b < nb; ++b)
          rows_dot<1>(X, m0, mb, wp, dp, cp, b0 + b, out + b * kBlockN, kStride);
    });
#if RADIXLM_INT4_AMX
    if (amx) _tile_release();
#endif
  });
#endif
  return y;
}

#if RADIXLM_TORCH_OPS
// The entry as a torch op for compiled decode graphs (schema: models/linear/int4.py).
TORCH_LIBRARY_IMPL(radixlm, CPU, m) { m.impl("int4_bf16_matmul", &int4_bf16_matmul); }
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("int4_bf16_matmul", &int4_bf16_matmul,
        "x [M, K] bf16/f32 @ (d * q + m per group of 32).T -> [M, N] in x's dtype; x "
        "unquantized (bf16 dot products; see the source).");
  mod.def("int4_bf16_path", &int4_bf16_path, "2 AMX-BF16, 1 AVX512-BF16, 0 neither.");
}
