// x @ W.T for a bf16 weight on AMX tiles: the weight packed once (models/linear/
// bf16_tiles.py) as the B tiles of a tile product, block of 16 output channels by group
// of 32 input columns: w[b, g, r, 2 j + e] = W[16 b + j, 32 g + 2 r + e] (1 KiB a tile,
// a block's tiles consecutive). Per unit of 2 blocks and 32 rows of x, 2 A tiles x 2 B
// tiles into 4 C tiles accumulated over every group (float32, each C element its own
// sum of exact bf16 products), the weight read once per call for the first 32 rows with
// software prefetch (prefetch.h) and from cache for the rest. oneDNN's AMX GEMM on its
// prepacked weight computes the same sums (equal outputs on the project's shapes) but
// streams a cold weight slower: per SmolLM2 layer, weights from memory, this kernel is
// 1.5x faster at 1-32 rows, 1.1x at 256, 0.87x at 1024 (docs/benchmarks.md, "bf16 GEMMs
// on AMX tiles").
//
// Invariants: x [M, K] bf16 contiguous, K % 32 == 0; w [ceil(N / 16), K / 32, 16, 32]
// bf16 (the last block's missing channels zero); y [M, N] bf16, each output's float32
// sum (plus the bias, when given) rounded once (round-to-nearest-even), as oneDNN's
// fused bias does; a row's result is the same whatever M.
// bf16_tiles_gated: a gated MLP's gate_up weight ([gate; up] rows, H each, H % 16 == 0)
// whose unit pairs gate block u with up block u + H / 16, so that the epilogue writes
// act(gate) * up [M, H] instead of [gate | up] [M, 2H]: rounded exactly as the unfused
// GEMM followed by norm_rope.cpp's act_mul (gate and up to bf16, act(gate) to bf16, the
// product to bf16; activations.h), without the [M, 2H] round trip through memory.
// Built only where the compiler targets AMX-BF16; bf16_tiles_path() says whether the OS
// grants the tile state (0: callers keep oneDNN).
#include "torch_api.h"
#include "prefetch.h"
#include "amx_tiles.h"
#include "activations.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#define RADIXLM_BF16_TILES 1
#else
#define RADIXLM_BF16_TILES 0
#endif

namespace {

constexpr int kGroup = 32;
constexpr int kBlockN = 16;
constexpr int64_t kTile = 16 * 32;  // bf16 per B tile
constexpr int kUnitRows = 32;       // rows of x per tile pass (2 A tiles)
constexpr int64_t kRowChunk = 256;  // rows per pass over a thread's units (x in L2)
constexpr int kResStride = 2 * kBlockN;

#if RADIXLM_BF16_TILES
// Tiles 0, 1: A, rows r0 and r1 (<= 16 each) of x x a group's 32 columns; 2, 3: B, the
// unit's two blocks; 4, 5: C of A 0 x B 2, 3; 6, 7: C of A 1 x B 2, 3.
void configure_unit(int r0, int r1) {
  const int rows[8] = {r0, r1, 16, 16, r0, r0, r1, r1};
  amx_tiles::configure(rows, 8);
}

// The full 2 x 2 pass over every group: 32 rows x 2 blocks. Software-pipelined: each
// operand tile is reloaded for the next group right after this group's last product
// that reads it (at 1024 rows 1-17% faster than the four loads first).
inline void pass_2x2(const uint16_t* xa, int64_t K, const uint16_t* w0, const uint16_t* w1,
                     bool prefetch) {
  const int64_t ng = K / kGroup;
  _tile_loadd(0, xa, K * 2);
  _tile_loadd(2, w0, 64);
  _tile_loadd(3, w1, 64);
  _tile_loadd(1, xa + 16 * K, K * 2);
  for (int64_t g = 0; g < ng; ++g) {
    if (prefetch) {
      prefetch_span(w0 + g * kTile, kTile * 2, kPrefetchBytes);
      prefetch_span(w1 + g * kTile, kTile * 2, kPrefetchBytes);
    }
    const bool more = g + 1 < ng;
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    if (more) _tile_loadd(0, xa + (g + 1) * kGroup, K * 2);
    _tile_dpbf16ps(6, 1, 2);
    if (more) _tile_loadd(2, w0 + (g + 1) * kTile, 64);
    _tile_dpbf16ps(7, 1, 3);
    if (more) {
      _tile_loadd(1, xa + 16 * K + (g + 1) * kGroup, K * 2);
      _tile_loadd(3, w1 + (g + 1) * kTile, 64);
    }
  }
}

// A partial pass: NB (1 or 2) blocks, up to 16 rows in A tile 0 and r1 more in A tile 1.
template <int NB>
void pass_partial(const uint16_t* xa, int64_t K, const uint16_t* w0, const uint16_t* w1,
                  int r1, bool prefetch) {
  const int64_t ng = K / kGroup;
  for (int64_t g = 0; g < ng; ++g) {
    if (prefetch) {
      prefetch_span(w0 + g * kTile, kTile * 2, kPrefetchBytes);
      if constexpr (NB > 1) prefetch_span(w1 + g * kTile, kTile * 2, kPrefetchBytes);
    }
    _tile_loadd(0, xa + g * kGroup, K * 2);
    _tile_loadd(2, w0 + g * kTile, 64);
    _tile_dpbf16ps(4, 0, 2);
    if (r1 > 0) {
      _tile_loadd(1, xa + 16 * K + g * kGroup, K * 2);
      _tile_dpbf16ps(6, 1, 2);
    }
    if constexpr (NB > 1) {
      _tile_loadd(3, w1 + g * kTile, 64);
      _tile_dpbf16ps(5, 0, 3);
    }
  }
}

// One unit (NB = 1 or 2 blocks from b0) for R rows of x into res [R, kResStride], 32 rows
// a pass. prefetch: the weight is read from memory in this call (the first row chunk);
// configured: the tile shape this thread loaded last.
// w0, w1: the unit's two blocks' tiles (w1 unused when NB = 1).
template <int NB>
void unit_dot(const uint16_t* x, int64_t R, int64_t K, const uint16_t* w0, const uint16_t* w1,
              float* res, bool prefetch, int& configured) {
  constexpr int64_t rs = kResStride * 4;  // bytes per row of res
  for (int64_t m0 = 0; m0 < R; m0 += kUnitRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kUnitRows, R - m0));
    const int r0 = std::min(rows, 16), r1 = rows - r0;
    if (configured != r0 * 64 + r1) {
      configure_unit(r0, r1);
      configured = r0 * 64 + r1;
    }
    _tile_zero(4);
    if constexpr (NB > 1) _tile_zero(5);
    if (r1 > 0) {
      _tile_zero(6);
      if constexpr (NB > 1) _tile_zero(7);
    }
    const uint16_t* xa = x + m0 * K;
    if (NB > 1 && r1 > 0)
      pass_2x2(xa, K, w0, w1, prefetch && m0 == 0);
    else
      pass_partial<NB>(xa, K, w0, w1, r1, prefetch && m0 == 0);
    float* out = res + m0 * kResStride;
    _tile_stored(4, out, rs);
    if constexpr (NB > 1) _tile_stored(5, out + kBlockN, rs);
    if (r1 > 0) {
      _tile_stored(6, out + 16 * kResStride, rs);
      if constexpr (NB > 1) _tile_stored(7, out + 16 * kResStride + kBlockN, rs);
    }
  }
}

// unit(u, c0, rows, res, configured) for every unit u of [0, units) and row chunk [c0, c0 +
// rows) of [0, M): units spread over torch's threads, each thread's chunks in order (its
// weight streamed from memory by the first chunk, from cache after), res the thread's
// scratch of kRowChunk x kResStride floats, configured its last tile shape.
template <typename Unit>
void for_unit_chunks(int64_t M, int64_t units, const Unit& unit) {
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> res(std::min(M, kRowChunk) * kResStride);
    int configured = -1;
    for (int64_t c0 = 0; c0 < M; c0 += kRowChunk) {
      const int64_t rows = std::min(kRowChunk, M - c0);
      for (int64_t u = begin; u < end; ++u) unit(u, c0, rows, res.data(), configured);
    }
    _tile_release();
  });
}

// R rows of res (a unit's blocks b0..) plus the bias (float32 [N], or null) into y [R, N]
// as bf16: one rounding of each output.
void write_unit(const float* res, int64_t R, int64_t N, int64_t b0, int nb, const float* bias,
                uint16_t* y) {
  const int64_t n0 = b0 * kBlockN, nv = std::min<int64_t>(nb * kBlockN, N - n0);
  const __m512 b_lo = bias && nv == 2 * kBlockN ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
  const __m512 b_hi =
      bias && nv == 2 * kBlockN ? _mm512_loadu_ps(bias + n0 + kBlockN) : _mm512_setzero_ps();
  for (int64_t i = 0; i < R; ++i) {
    const float* v = res + i * kResStride;
    uint16_t* yp = y + i * N + n0;
    if (nv == 2 * kBlockN) {
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_add_ps(_mm512_loadu_ps(v + kBlockN), b_hi),
                                             _mm512_add_ps(_mm512_loadu_ps(v), b_lo));
      _mm512_storeu_si512(yp, (__m512i)h);
    } else {
      for (int64_t j = 0; j < nv; ++j) yp[j] = c10::BFloat16(v[j] + (bias ? bias[n0 + j] : 0.f)).x;
    }
  }
}
// R rows of res (gate block | up block of unit u) into y [R, H] as act(gate) * up, each
// rounding where the unfused path rounds (see the header). Three loops over up to 64 rows
// at a time, the activation's a flat loop of 1024 floats: GCC vectorizes it as it does
// norm_rope.cpp's (within a 16-float row tanh-GELU's loop stayed scalar: 1.8x slower).
template <typename Act>
void write_gated(const float* res, int64_t R, int64_t H, int64_t u, uint16_t* y) {
  constexpr int64_t kRows = 64;
  float g[kRows * kBlockN], a[kRows * kBlockN];
  for (int64_t i0 = 0; i0 < R; i0 += kRows) {
    const int64_t n = std::min(kRows, R - i0);
    for (int64_t i = 0; i < n; ++i)
      for (int j = 0; j < kBlockN; ++j)
        g[i * kBlockN + j] = bf16_load(bf16_store(res[(i0 + i) * kResStride + j]));
    for (int64_t e = 0; e < n * kBlockN; ++e) a[e] = Act::apply(g[e]);
    for (int64_t i = 0; i < n; ++i) {
      const float* __restrict up = res + (i0 + i) * kResStride + kBlockN;
      uint16_t* __restrict yp = y + (i0 + i) * H + u * kBlockN;
      for (int j = 0; j < kBlockN; ++j)
        yp[j] = bf16_store(bf16_load(bf16_store(a[i * kBlockN + j])) *
                           bf16_load(bf16_store(up[j])));
    }
  }
}
#endif

}  // namespace

// 1: AMX-BF16 tiles built and granted by the OS, 0: not (the matmul refuses).
int64_t bf16_tiles_path() {
#if RADIXLM_BF16_TILES
  return amx_tiles::amx_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

// The checks both entry points make (`what` names the caller): the tiles usable here, x
// [M, K] bf16 contiguous with K a multiple of 32, w the packed tiles of N channels.
static void check_operands(const torch::Tensor& x, const torch::Tensor& w, int64_t N,
                           const char* what) {
  TORCH_CHECK(bf16_tiles_path() == 1, what, ": no AMX-BF16 tiles here");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kBFloat16,
              what, ": x [M, K] bfloat16 contiguous");
  TORCH_CHECK(x.size(1) % kGroup == 0, what, ": K a multiple of 32");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.is_contiguous() &&
                  w.numel() == (N + kBlockN - 1) / kBlockN * x.size(1) * kBlockN,
              what, ": w [ceil(N / 16), K / 32, 16, 32] bfloat16 contiguous");
}

torch::Tensor bf16_tiles_matmul(torch::Tensor x, torch::Tensor w, int64_t N,
                                c10::optional<torch::Tensor> bias) {
  check_operands(x, w, N, "bf16_tiles_matmul");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t nblocks = (N + kBlockN - 1) / kBlockN;
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == N),
              "bf16_tiles_matmul: bias [N]");
  auto y = torch::empty({M, N}, x.options());
#if RADIXLM_BF16_TILES
  if (M == 0 || N == 0) return y;
  const torch::Tensor bias_f = bias ? bias->to(torch::kFloat).contiguous() : torch::Tensor();
  const float* bp = bias ? bias_f.data_ptr<float>() : nullptr;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t block = (K / kGroup) * kTile;
  for_unit_chunks(M, (nblocks + 1) / 2, [&](int64_t u, int64_t c0, int64_t rows, float* res,
                                            int& configured) {
    const int64_t b0 = 2 * u;
    const int nb = static_cast<int>(std::min<int64_t>(2, nblocks - b0));
    const uint16_t* w0 = wp + b0 * block;
    if (nb == 2)
      unit_dot<2>(xp + c0 * K, rows, K, w0, w0 + block, res, c0 == 0, configured);
    else
      unit_dot<1>(xp + c0 * K, rows, K, w0, w0 + block, res, c0 == 0, configured);
    write_unit(res, rows, N, b0, nb, bp, yp + c0 * N);
  });
#endif
  return y;
}

torch::Tensor bf16_tiles_gated(torch::Tensor x, torch::Tensor w, int64_t H, bool gelu) {
  TORCH_CHECK(H > 0 && H % kBlockN == 0, "bf16_tiles_gated: H a positive multiple of 16");
  check_operands(x, w, 2 * H, "bf16_tiles_gated");
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty({M, H}, x.options());
#if RADIXLM_BF16_TILES
  if (M == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t units = H / kBlockN, block = (K / kGroup) * kTile;
  for_unit_chunks(M, units, [&](int64_t u, int64_t c0, int64_t rows, float* res,
                                int& configured) {
    unit_dot<2>(xp + c0 * K, rows, K, wp + u * block, wp + (u + units) * block, res,
                c0 == 0, configured);
    if (gelu)
      write_gated<GeluTanh>(res, rows, H, u, yp + c0 * H);
    else
      write_gated<Silu>(res, rows, H, u, yp + c0 * H);
  });
#endif
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("bf16_tiles_matmul", &bf16_tiles_matmul,
        "x [M, K] bf16 @ W.T (+ bias [N]) -> [M, N] bf16, W packed as AMX B tiles (see the "
        "source).",
        py::arg("x"), py::arg("w"), py::arg("n"), py::arg("bias") = py::none());
  mod.def("bf16_tiles_gated", &bf16_tiles_gated,
        "act(x @ Wg.T) * (x @ Wu.T) [M, H] for W = [Wg; Wu] packed as AMX B tiles; act: "
        "SiLU, or tanh-GELU with gelu=True (see the source).",
        py::arg("x"), py::arg("w"), py::arg("h"), py::arg("gelu") = false);
  mod.def("bf16_tiles_path", &bf16_tiles_path, "1: AMX-BF16 tiles usable here, 0: not.");
}
