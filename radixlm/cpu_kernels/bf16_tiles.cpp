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
// bf16_tiles_q4_matmul / _gated: the same for a 4-bit weight in the int4_bf16 layout
// (int4_chunks.h), each group dequantized per call into the B tile pack_tiles makes of
// its dense bf16 copy (equal outputs, bit for bit), the next group's dequantization
// overlapping this group's tile products: 0.75 B/weight read instead of 2, 1.1-1.35x at
// 9-64 rows (docs/benchmarks.md, "4-bit groups dequantized into AMX tiles").
// Built only where the compiler targets AMX-BF16; bf16_tiles_path() says whether the OS
// grants the tile state (0: callers keep oneDNN).
#include "torch_api.h"
#include "prefetch.h"
#include "amx_tiles.h"
#include "activations.h"
#include "int4_chunks.h"

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

// The two weight sources of the entry points: the packed bf16 tiles (`w`, `block` bf16
// per block), or 4-bit groups in the int4_bf16 layout (q, d, m per block at their strides;
// exact_c: one FMA per dequantized weight, see dequantize_group).
struct Bf16Weight {
  const uint16_t* w;
  int64_t block;
};
struct Q4Weight {
  const uint8_t* q;
  const float* d;
  const float* m;
  int64_t qstride, sstride;
  bool exact_c;
};

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

// Group g's tile products: A tile 0 (and A tile 1 when r1 > 0) x the group's B tiles b0
// (and b1 when NB = 2) into C tiles 4-7.
template <int NB>
inline void group_products(const uint16_t* xa, int64_t K, int64_t g, const uint16_t* b0,
                           const uint16_t* b1, int r1) {
  _tile_loadd(0, xa + g * kGroup, K * 2);
  _tile_loadd(2, b0, 64);
  _tile_dpbf16ps(4, 0, 2);
  if (r1 > 0) {
    _tile_loadd(1, xa + 16 * K + g * kGroup, K * 2);
    _tile_dpbf16ps(6, 1, 2);
  }
  if constexpr (NB > 1) {
    _tile_loadd(3, b1, 64);
    _tile_dpbf16ps(5, 0, 3);
    if (r1 > 0) _tile_dpbf16ps(7, 1, 3);
  }
}

// A partial pass: NB (1 or 2) blocks, up to 16 rows in A tile 0 and r1 more in A tile 1
// (r1 = 0 when NB = 2: that full pass is pass_2x2's).
template <int NB>
void pass_partial(const uint16_t* xa, int64_t K, const uint16_t* w0, const uint16_t* w1,
                  int r1, bool prefetch) {
  const int64_t ng = K / kGroup;
  for (int64_t g = 0; g < ng; ++g) {
    if (prefetch) {
      prefetch_span(w0 + g * kTile, kTile * 2, kPrefetchBytes);
      if constexpr (NB > 1) prefetch_span(w1 + g * kTile, kTile * 2, kPrefetchBytes);
    }
    group_products<NB>(xa, K, g, w0 + g * kTile, w1 + g * kTile, r1);
  }
}

// A 4-bit block of 16 channels in the int4_bf16 layout (int4_chunks.h): q its K / 8
// chunks (group g's four at 256 g), d and m [groups, 16] float32.
struct Q4Block {
  const uint8_t* q;
  const float* d;
  const float* m;
};

// A 4-bit unit: its blocks and the thread's scratch tiles they dequantize into (ng each).
struct Q4Unit {
  Q4Block blocks[2];
  uint16_t* tiles[2];
};

// Group g of block b as the B tile pack_tiles makes of the dense weight: each w = d q + m
// in float32 (the product exact: an 11-17 bit d times a 4-bit q; the sum rounded once, as
// Int4Groups.dequantize) rounded to bf16 (nearest-even, as a cast; subnormal values flush
// to zero). From the lanes' 128 + q: with ExactC (c = m - 128 d exact in float32 for every
// group of the weight, checked at load) one FMA (128 + q) d + c, the same single rounding
// of q d + m; else (128 + q) d - 128 d (the exact q d), then + m.
template <bool ExactC>
inline void dequantize_group(const Q4Block& b, int64_t g, uint16_t* tile) {
  const __m512i odd = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  // lane 2 j <- lane j (the even columns' bf16), lane 2 j + 1 <- lane 16 + j (the odd's)
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
  prefetch_ahead(b.d + g * kBlockN, kPrefetchBytes / 4);
  prefetch_ahead(b.m + g * kBlockN, kPrefetchBytes / 4);
  const __m512 d = _mm512_loadu_ps(b.d + g * kBlockN), m = _mm512_loadu_ps(b.m + g * kBlockN);
  const __m512 d128 = _mm512_mul_ps(d, _mm512_set1_ps(128.f));
  const __m512 c = _mm512_sub_ps(m, d128);
  for (int ch = 0; ch < 4; ++ch) {
    __m512i w[4];
    unpack_chunk(b.q + g * 256 + 64 * ch, w);
    for (int r = 0; r < 4; ++r) {  // 32-bit lane j: channel j's (even, odd) column pair
      const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(w[r], 16));
      const __m512 odd_v = _mm512_castsi512_ps(_mm512_and_si512(w[r], odd));
      __m512 ve, vo;
      if constexpr (ExactC) {
        ve = _mm512_fmadd_ps(even, d, c);
        vo = _mm512_fmadd_ps(odd_v, d, c);
      } else {
        ve = _mm512_add_ps(_mm512_fmsub_ps(even, d, d128), m);
        vo = _mm512_add_ps(_mm512_fmsub_ps(odd_v, d, d128), m);
      }
      const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(vo, ve);
      _mm512_storeu_si512(tile + 32 * (4 * ch + r), _mm512_permutexvar_epi16(pairs, h));
    }
  }
}

// The first 32-row pass of a 4-bit unit (NB blocks, r1 rows in A tile 1): each group's B
// tiles dequantized into the unit's scratch (every group's tile kept for the unit's later
// passes), then multiplied; the vector units dequantize group g + 1 while the tile unit
// multiplies group g.
template <int NB, bool ExactC>
void pass_q4(const uint16_t* xa, int64_t K, const Q4Unit& w, int r1) {
  const int64_t ng = K / kGroup;
  for (int64_t g = 0; g < ng; ++g) {
    dequantize_group<ExactC>(w.blocks[0], g, w.tiles[0] + g * kTile);
    if constexpr (NB > 1) dequantize_group<ExactC>(w.blocks[1], g, w.tiles[1] + g * kTile);
    group_products<NB>(xa, K, g, w.tiles[0] + g * kTile, w.tiles[1] + g * kTile, r1);
  }
}

// One unit (NB = 1 or 2 blocks from b0) for R rows of x into res [R, kResStride], 32 rows
// a pass. prefetch: the weight is read from memory in this call (the first row chunk);
// configured: the tile shape this thread loaded last.
// w0, w1: the unit's two blocks' tiles (w1 unused when NB = 1). With q4 (a 4-bit unit
// whose scratch tiles are w0, w1), the first pass dequantizes them (pass_q4) and later
// passes read them there.
template <int NB, bool ExactC = false>
void unit_dot(const uint16_t* x, int64_t R, int64_t K, const uint16_t* w0, const uint16_t* w1,
              float* res, bool prefetch, int& configured, const Q4Unit* q4 = nullptr) {
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
    if (q4 != nullptr && m0 == 0)
      pass_q4<NB, ExactC>(xa, K, *q4, r1);
    else if (NB > 1 && r1 > 0)
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

// A B tile row: scratch tiles made of them start on cache lines (an unaligned tile row
// loads two lines: 4-bit calls of 256-1024 rows ran 5-10% slower).
struct alignas(64) TileRow {
  uint16_t v[32];
};

// unit(u, c0, rows, res, configured, tiles) for every unit u of [0, units) and row chunk
// [c0, c0 + rows) of [0, M): units spread over torch's threads, each thread's chunks in
// order (its weight streamed from memory by the first chunk, from cache after), res the
// thread's scratch of kRowChunk x kResStride floats, configured its last tile shape, tiles
// its scratch of `tile_scratch` B tiles (the 4-bit entry points dequantize into it).
template <typename Unit>
void for_unit_chunks(int64_t M, int64_t units, const Unit& unit, int64_t tile_scratch = 0) {
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> res(std::min(M, kRowChunk) * kResStride);
    std::vector<TileRow> tiles(tile_scratch * 16);
    int configured = -1;
    for (int64_t c0 = 0; c0 < M; c0 += kRowChunk) {
      const int64_t rows = std::min(kRowChunk, M - c0);
      for (int64_t u = begin; u < end; ++u)
        unit(u, c0, rows, res.data(), configured, reinterpret_cast<uint16_t*>(tiles.data()));
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

// A unit's dot products (blocks b0 and b1: NB of them) for R rows of x into res, per
// weight source; first: the call's first row chunk (the weight read from memory then),
// tiles: the thread's scratch (2 x ng tiles; the 4-bit source dequantizes into it).
template <int NB>
void unit_dot_of(const Bf16Weight& w, int64_t b0, int64_t b1, const uint16_t* x, int64_t R,
                 int64_t K, float* res, bool first, int& configured, uint16_t*) {
  unit_dot<NB>(x, R, K, w.w + b0 * w.block, w.w + b1 * w.block, res, first, configured);
}

template <int NB>
void unit_dot_of(const Q4Weight& w, int64_t b0, int64_t b1, const uint16_t* x, int64_t R,
                 int64_t K, float* res, bool, int& configured, uint16_t* tiles) {
  const int64_t ng = K / kGroup;
  auto block = [&](int64_t b) {
    return Q4Block{w.q + b * w.qstride, w.d + b * w.sstride, w.m + b * w.sstride};
  };
  const Q4Unit unit{{block(b0), block(b1)}, {tiles, tiles + ng * kTile}};
  if (w.exact_c)
    unit_dot<NB, true>(x, R, K, unit.tiles[0], unit.tiles[1], res, false, configured, &unit);
  else
    unit_dot<NB, false>(x, R, K, unit.tiles[0], unit.tiles[1], res, false, configured, &unit);
}

// Scratch tiles per thread a weight source needs (the 4-bit source: a unit's 2 x ng).
inline int64_t scratch_tiles(const Bf16Weight&, int64_t) { return 0; }
inline int64_t scratch_tiles(const Q4Weight&, int64_t K) { return 2 * (K / kGroup); }

// y [M, N] = x @ W.T (+ bias, float32 [N] or null): units of 2 blocks (the last may be 1).
template <typename W>
void matmul_units(const W& w, const uint16_t* xp, int64_t M, int64_t K, int64_t N,
                  const float* bias, uint16_t* yp) {
  const int64_t nblocks = (N + kBlockN - 1) / kBlockN;
  for_unit_chunks(M, (nblocks + 1) / 2, [&](int64_t u, int64_t c0, int64_t rows, float* res,
                                            int& configured, uint16_t* tiles) {
    const int64_t b0 = 2 * u;
    const int nb = static_cast<int>(std::min<int64_t>(2, nblocks - b0));
    if (nb == 2)
      unit_dot_of<2>(w, b0, b0 + 1, xp + c0 * K, rows, K, res, c0 == 0, configured, tiles);
    else
      unit_dot_of<1>(w, b0, b0 + 1, xp + c0 * K, rows, K, res, c0 == 0, configured, tiles);
    write_unit(res, rows, N, b0, nb, bias, yp + c0 * N);
  }, scratch_tiles(w, K));
}

// y [M, H] = act(x @ Wg.T) * (x @ Wu.T): unit u pairs gate block u with up block u + H / 16.
template <typename W>
void gated_units(const W& w, const uint16_t* xp, int64_t M, int64_t K, int64_t H, bool gelu,
                 uint16_t* yp) {
  const int64_t units = H / kBlockN;
  for_unit_chunks(M, units, [&](int64_t u, int64_t c0, int64_t rows, float* res,
                                int& configured, uint16_t* tiles) {
    unit_dot_of<2>(w, u, u + units, xp + c0 * K, rows, K, res, c0 == 0, configured, tiles);
    if (gelu)
      write_gated<GeluTanh>(res, rows, H, u, yp + c0 * H);
    else
      write_gated<Silu>(res, rows, H, u, yp + c0 * H);
  }, scratch_tiles(w, K));
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

// x [M, K] bf16 contiguous with K a multiple of 32, and the tiles usable here (`what`
// names the caller).
static void check_x(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(bf16_tiles_path() == 1, what, ": no AMX-BF16 tiles here");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kBFloat16,
              what, ": x [M, K] bfloat16 contiguous");
  TORCH_CHECK(x.size(1) % kGroup == 0, what, ": K a multiple of 32");
}

// The bf16 entry points' checks: x, and w the packed tiles of N channels.
static void check_operands(const torch::Tensor& x, const torch::Tensor& w, int64_t N,
                           const char* what) {
  check_x(x, what);
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.is_contiguous() &&
                  w.numel() == (N + kBlockN - 1) / kBlockN * x.size(1) * kBlockN,
              what, ": w [ceil(N / 16), K / 32, 16, 32] bfloat16 contiguous");
}

// The 4-bit entry points' checks: x, and N channels in the int4_bf16 layout: q
// [ceil(N / 16), K * 8] uint8, d and m [ceil(N / 16), K / 32, 16] float32.
static void check_q4(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                     const torch::Tensor& m, int64_t N, const char* what) {
  check_x(x, what);
  const int64_t nb = (N + kBlockN - 1) / kBlockN, K = x.size(1);
  TORCH_CHECK(q.scalar_type() == torch::kByte && q.is_contiguous() && q.numel() == nb * K * 8,
              what, ": q [ceil(N / 16), K * 8] uint8 contiguous");
  for (const torch::Tensor* t : {&d, &m})
    TORCH_CHECK(t->scalar_type() == torch::kFloat && t->is_contiguous() &&
                    t->numel() == nb * (K / kGroup) * kBlockN,
                what, ": d, m [ceil(N / 16), K / 32, 16] float32 contiguous");
}

// y = x @ W.T (+ bias) [M, N] bf16 from the weight source w (the operands checked).
template <typename W>
torch::Tensor matmul_of(const torch::Tensor& x, const W& w, int64_t N,
                        const c10::optional<torch::Tensor>& bias, const char* what) {
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == N), what, ": bias [N]");
  const int64_t M = x.size(0);
  auto y = torch::empty({M, N}, x.options());
#if RADIXLM_BF16_TILES
  if (M == 0 || N == 0) return y;
  const torch::Tensor bias_f = bias ? bias->to(torch::kFloat).contiguous() : torch::Tensor();
  matmul_units(w, reinterpret_cast<const uint16_t*>(x.data_ptr()), M, x.size(1), N,
               bias ? bias_f.data_ptr<float>() : nullptr,
               reinterpret_cast<uint16_t*>(y.data_ptr()));
#endif
  return y;
}

// act(x @ Wg.T) * (x @ Wu.T) [M, H] bf16 from the weight source w (the operands checked).
template <typename W>
torch::Tensor gated_of(const torch::Tensor& x, const W& w, int64_t H, bool gelu) {
  const int64_t M = x.size(0);
  auto y = torch::empty({M, H}, x.options());
#if RADIXLM_BF16_TILES
  if (M == 0) return y;
  gated_units(w, reinterpret_cast<const uint16_t*>(x.data_ptr()), M, x.size(1), H, gelu,
              reinterpret_cast<uint16_t*>(y.data_ptr()));
#endif
  return y;
}

static Bf16Weight bf16_weight(const torch::Tensor& w, int64_t K) {
  return {reinterpret_cast<const uint16_t*>(w.data_ptr()), (K / kGroup) * kTile};
}

static Q4Weight q4_weight(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& m,
                          int64_t K, bool exact_c) {
  return {q.data_ptr<uint8_t>(), d.data_ptr<float>(), m.data_ptr<float>(), K * kBlockN / 2,
          (K / kGroup) * kBlockN, exact_c};
}

torch::Tensor bf16_tiles_matmul(torch::Tensor x, torch::Tensor w, int64_t N,
                                c10::optional<torch::Tensor> bias) {
  check_operands(x, w, N, "bf16_tiles_matmul");
  return matmul_of(x, bf16_weight(w, x.size(1)), N, bias, "bf16_tiles_matmul");
}

torch::Tensor bf16_tiles_gated(torch::Tensor x, torch::Tensor w, int64_t H, bool gelu) {
  TORCH_CHECK(H > 0 && H % kBlockN == 0, "bf16_tiles_gated: H a positive multiple of 16");
  check_operands(x, w, 2 * H, "bf16_tiles_gated");
  return gated_of(x, bf16_weight(w, x.size(1)), H, gelu);
}

torch::Tensor bf16_tiles_q4_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor d,
                                   torch::Tensor m, int64_t N, c10::optional<torch::Tensor> bias,
                                   bool exact_c) {
  check_q4(x, q, d, m, N, "bf16_tiles_q4_matmul");
  return matmul_of(x, q4_weight(q, d, m, x.size(1), exact_c), N, bias, "bf16_tiles_q4_matmul");
}

torch::Tensor bf16_tiles_q4_gated(torch::Tensor x, torch::Tensor q, torch::Tensor d,
                                  torch::Tensor m, int64_t H, bool gelu, bool exact_c) {
  TORCH_CHECK(H > 0 && H % kBlockN == 0, "bf16_tiles_q4_gated: H a positive multiple of 16");
  check_q4(x, q, d, m, 2 * H, "bf16_tiles_q4_gated");
  return gated_of(x, q4_weight(q, d, m, x.size(1), exact_c), H, gelu);
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
  mod.def("bf16_tiles_q4_matmul", &bf16_tiles_q4_matmul,
        "bf16_tiles_matmul for a 4-bit weight in the int4_bf16 layout (q, d, m), its B "
        "tiles dequantized per call (see the source).",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("m"), py::arg("n"),
        py::arg("bias") = py::none(), py::arg("exact_c") = false);
  mod.def("bf16_tiles_q4_gated", &bf16_tiles_q4_gated,
        "bf16_tiles_gated for a 4-bit [gate; up] weight in the int4_bf16 layout.",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("m"), py::arg("h"),
        py::arg("gelu") = false, py::arg("exact_c") = false);
  mod.def("bf16_tiles_path", &bf16_tiles_path, "1: AMX-BF16 tiles usable here, 0: not.");
}
