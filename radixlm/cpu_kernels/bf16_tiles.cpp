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
// bf16_tiles_q5_* / _q8_*: the same for 5-bit groups in the q5_bf16 layout (Q5_0) and for
// int8 groups as Int8Groups holds them (q [N, K] row-major, one float32 scale per 16 or 32
// columns: Q8_0, Q6_K), bit for bit too (docs/benchmarks.md, "5-bit and int8 groups
// dequantized into AMX tiles").
// Built only where the compiler targets AMX-BF16; bf16_tiles_path() says whether the OS
// grants the tile state (0: callers keep oneDNN).
#include "torch_api.h"
#include "prefetch.h"
#include "amx_tiles.h"
#include "activations.h"
#include "int4_chunks.h"

#include <immintrin.h>

#include <algorithm>
#include <type_traits>
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
// Blocks ahead of the one it dequantizes that an int8 block prefetches (its rows are
// read column group by column group, 16 strided streams: without it half the speed).
constexpr int64_t kQ8BlocksAhead = 4;
constexpr int64_t kQ5GroupBytes = 320;  // q5_bf16 layout: 4 chunks of 64 bytes, 4 x 16 mask bytes

// The weight sources of the entry points: the packed bf16 tiles (`w`, `block` bf16 per
// block), or 4-bit groups in the int4_bf16 layout (q, d, m per block at their strides;
// exact_c: one FMA per dequantized weight, see dequantize).
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
// 5-bit groups in the q5_bf16 layout (q5 and float16 d per block at their strides).
struct Q5Weight {
  const uint8_t* q;
  const uint16_t* d;
  int64_t qstride, sstride;
};
// int8 groups as Int8Groups holds them: q [N, K] int8 row-major, s [N, K / group] float32
// (group 16 or 32).
struct Q8Weight {
  const int8_t* q;
  const float* s;
  int64_t K, N, group;
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
// chunks (group g's four at 256 g), d and m [groups, 16] float32; ExactC: see dequantize.
template <bool ExactC>
struct Q4Block {
  const uint8_t* q;
  const float* d;
  const float* m;
};

// A 5-bit block in the q5_bf16 layout: q its groups of 320 bytes (4 chunks, then their
// masks), d [groups, 16] float16.
struct Q5Block {
  const uint8_t* q;
  const uint16_t* d;
};

// An int8 block: `rows` (<= 16) row-major rows of K int8 from q, their scales from s
// (K / group a row).
struct Q8Block {
  const int8_t* q;
  const float* s;
  int64_t K, group;
  int rows;
};

// A quantized unit: its blocks and the thread's scratch tiles they dequantize into (ng
// each); NoDequant: the bf16 tiles, read as packed.
struct NoDequant {};
template <typename Block>
struct DequantUnit {
  Block blocks[2];
  uint16_t* tiles[2];
};

// Tile row `row` from the float32 values of 16 channels' even (ve) and odd (vo) columns
// of a column pair, lane j: channel j. Each rounded to bf16 (nearest-even, as a cast;
// subnormal values flush to zero), lane 2 j + e of the row = channel j's column e.
inline void store_pair_row(__m512 ve, __m512 vo, uint16_t* row) {
  // lane 2 j <- lane j (the even columns' bf16), lane 2 j + 1 <- lane 16 + j (the odd's)
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
  const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(vo, ve);
  _mm512_storeu_si512(row, _mm512_permutexvar_epi16(pairs, h));
}

// The even and odd columns of a register of bf16 pairs (int4_chunks.h's lanes) as float32.
inline __m512 even_cols(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
inline __m512 odd_cols(__m512i w) {
  return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Group g of a block as the B tile pack_tiles makes of the dense weight (the dequantize
// overloads). 4-bit: each w = d q + m in float32 (the product exact: an 11-17 bit d times
// a 4-bit q; the sum rounded once, as Int4Groups.dequantize) rounded to bf16. From the
// lanes' 128 + q: with ExactC (c = m - 128 d exact in float32 for every group of the
// weight, checked at load) one FMA (128 + q) d + c, the same single rounding of q d + m;
// else (128 + q) d - 128 d (the exact q d), then + m.
template <bool ExactC>
inline void dequantize(const Q4Block<ExactC>& b, int64_t g, uint16_t* tile) {
  prefetch_ahead(b.d + g * kBlockN, kPrefetchBytes / 4);
  prefetch_ahead(b.m + g * kBlockN, kPrefetchBytes / 4);
  const __m512 d = _mm512_loadu_ps(b.d + g * kBlockN), m = _mm512_loadu_ps(b.m + g * kBlockN);
  const __m512 d128 = _mm512_mul_ps(d, _mm512_set1_ps(128.f));
  const __m512 c = _mm512_sub_ps(m, d128);
  for (int ch = 0; ch < 4; ++ch) {
    __m512i w[4];
    unpack_chunk(b.q + g * 256 + 64 * ch, w);
    for (int r = 0; r < 4; ++r) {  // 32-bit lane j: channel j's (even, odd) column pair
      const __m512 even = even_cols(w[r]), odd = odd_cols(w[r]);
      if constexpr (ExactC)
        store_pair_row(_mm512_fmadd_ps(even, d, c), _mm512_fmadd_ps(odd, d, c),
                       tile + 32 * (4 * ch + r));
      else
        store_pair_row(_mm512_add_ps(_mm512_fmsub_ps(even, d, d128), m),
                       _mm512_add_ps(_mm512_fmsub_ps(odd, d, d128), m), tile + 32 * (4 * ch + r));
    }
  }
}

// 5-bit: w = d (q - 16) = (128 + q) d - 144 d in one FMA, exact (d a float16: (128 + q) d
// and 144 d are exact in float32, and so is their difference d (q - 16)), rounded to bf16
// as the dense copy's exact float32 value.
inline void dequantize(const Q5Block& b, int64_t g, uint16_t* tile) {
  const uint8_t* gp = b.q + g * kQ5GroupBytes;
  prefetch_ahead(gp + 256);  // the masks' line
  prefetch_ahead(b.d + g * kBlockN, kPrefetchBytes / 10);
  const __m512 d = _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.d + g * kBlockN)));
  const __m512 c = _mm512_mul_ps(d, _mm512_set1_ps(-144.f));
  for (int ch = 0; ch < 4; ++ch) {
    __m512i w[4];
    unpack_q5_chunk(gp + 64 * ch, gp + 256 + 16 * ch, w);
    for (int r = 0; r < 4; ++r)
      store_pair_row(_mm512_fmadd_ps(even_cols(w[r]), d, c), _mm512_fmadd_ps(odd_cols(w[r]), d, c),
                     tile + 32 * (4 * ch + r));
  }
}

// Three of the four stages of a 16 x 16 transpose of 32-bit lanes (the 256-bit stage is
// done by the caller's pairing of rows, see the int8 dequantize): v[j] holds channel
// slot j's pairs 0..7 in lanes 0..7 and slot j + 8's in lanes 8..15, v[8 + j] their pairs
// 8..15; out: v[r] lane s = slot lane_slot(s)'s pair r.
inline void transpose16_3(__m512i (&v)[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    v[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(v[8 * i + j], v[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(v[8 * i + j], v[8 * i + 4 + j], 0xDD);
    }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

// The slot whose pairs transpose16_3 leaves in lane s (bits 2 and 3 of s swapped; its own
// inverse): loading channel lane_slot(j) into slot j puts channel s in lane s.
constexpr int lane_slot(int s) { return (s & 3) | ((s & 4) << 1) | ((s & 8) >> 1); }

// int8: w = q s in float32 (as Int8Groups.dequantize_rows), rounded to bf16. Each
// channel's 32 columns as bf16 pairs, two channels' halves per register (the conversion
// pairs them: the transpose's 256-bit stage), then transposed into the tile's pair rows;
// missing channels (the last block's) zero. The block's 16 rows are contiguous: each group
// prefetches its share of the block kQ8BlocksAhead blocks on, in order.
inline void dequantize(const Q8Block& b, int64_t g, uint16_t* tile) {
  const int64_t sg = b.K / b.group;
  prefetch_span(b.q + g * kBlockN * kGroup, kBlockN * kGroup, kQ8BlocksAhead * kBlockN * b.K);
  const int64_t spg = kGroup / b.group;  // scales per row and group of 32
  prefetch_span(b.s + g * kBlockN * spg, kBlockN * spg * 4, kQ8BlocksAhead * kBlockN * sg * 4);
  // channel c's columns 0..15 (lo) and 16..31 (hi) as float32 q s; zero past the rows
  auto row = [&](int c, __m512& lo, __m512& hi) {
    if (c >= b.rows) {
      lo = hi = _mm512_setzero_ps();
      return;
    }
    const int8_t* src = b.q + c * b.K + g * kGroup;
    const float* s = b.s + c * sg;
    const __m512 s0 = _mm512_set1_ps(s[spg * g]);            // columns 0..15
    const __m512 s1 = _mm512_set1_ps(s[spg * g + spg - 1]);  // columns 16..31
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)))), s0);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16)))), s1);
  };
  __m512i v[16];
  for (int j = 0; j < 8; ++j) {
    __m512 lo0, hi0, lo1, hi1;
    row(lane_slot(j), lo0, hi0);
    row(lane_slot(j + 8), lo1, hi1);
    v[j] = (__m512i)_mm512_cvtne2ps_pbh(lo1, lo0);
    v[8 + j] = (__m512i)_mm512_cvtne2ps_pbh(hi1, hi0);
  }
  transpose16_3(v);
  for (int r = 0; r < 16; ++r) _mm512_storeu_si512(tile + 32 * r, v[r]);
}

// A pass over packed tiles w0, w1 (NB blocks, r1 rows in A tile 1).
template <int NB>
inline void pass_tiles(const uint16_t* xa, int64_t K, const uint16_t* w0, const uint16_t* w1,
                       int r1, bool prefetch) {
  if (NB > 1 && r1 > 0)
    pass_2x2(xa, K, w0, w1, prefetch);
  else
    pass_partial<NB>(xa, K, w0, w1, r1, prefetch);
}

// The first 32-row pass of a quantized unit (NB blocks, r1 rows in A tile 1): each
// group's B tiles dequantized into the unit's scratch (every group's tile kept for the
// unit's later passes), then multiplied; the vector units dequantize group g + 1 while the
// tile unit multiplies group g.
template <int NB, typename Block>
void pass_dequant(const uint16_t* xa, int64_t K, const DequantUnit<Block>& w, int r1) {
  const int64_t ng = K / kGroup;
  for (int64_t g = 0; g < ng; ++g) {
    dequantize(w.blocks[0], g, w.tiles[0] + g * kTile);
    if constexpr (NB > 1) dequantize(w.blocks[1], g, w.tiles[1] + g * kTile);
    group_products<NB>(xa, K, g, w.tiles[0] + g * kTile, w.tiles[1] + g * kTile, r1);
  }
}

// One unit (NB = 1 or 2 blocks from b0) for R rows of x into res [R, kResStride], 32 rows
// a pass. prefetch: the weight is read from memory in this call (the first row chunk);
// configured: the tile shape this thread loaded last.
// w0, w1: the unit's two blocks' tiles (w1 unused when NB = 1). With dq (a quantized unit
// whose scratch tiles are w0, w1), the first pass dequantizes them (pass_dequant) and
// later passes read them there.
template <int NB, typename Block = NoDequant>
void unit_dot(const uint16_t* x, int64_t R, int64_t K, const uint16_t* w0, const uint16_t* w1,
              float* res, bool prefetch, int& configured,
              const DequantUnit<Block>* dq = nullptr) {
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
    if constexpr (!std::is_same_v<Block, NoDequant>) {
      if (m0 == 0)
        pass_dequant<NB>(xa, K, *dq, r1);
      else
        pass_tiles<NB>(xa, K, w0, w1, r1, false);
    } else {
      pass_tiles<NB>(xa, K, w0, w1, r1, prefetch && m0 == 0);
    }
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

// A quantized unit of blocks b0 and b1 (NB of them) dequantized into the thread's tiles.
template <int NB, typename Block>
void dequant_unit_dot(const Block& b0, const Block& b1, const uint16_t* x, int64_t R,
                      int64_t K, float* res, int& configured, uint16_t* tiles) {
  const DequantUnit<Block> unit{{b0, b1}, {tiles, tiles + (K / kGroup) * kTile}};
  unit_dot<NB, Block>(x, R, K, unit.tiles[0], unit.tiles[1], res, false, configured, &unit);
}

template <int NB>
void unit_dot_of(const Q4Weight& w, int64_t b0, int64_t b1, const uint16_t* x, int64_t R,
                 int64_t K, float* res, bool, int& configured, uint16_t* tiles) {
  auto run = [&](auto exact) {
    using Block = Q4Block<decltype(exact)::value>;
    auto block = [&](int64_t b) {
      return Block{w.q + b * w.qstride, w.d + b * w.sstride, w.m + b * w.sstride};
    };
    dequant_unit_dot<NB>(block(b0), block(b1), x, R, K, res, configured, tiles);
  };
  if (w.exact_c)
    run(std::true_type{});
  else
    run(std::false_type{});
}

template <int NB>
void unit_dot_of(const Q5Weight& w, int64_t b0, int64_t b1, const uint16_t* x, int64_t R,
                 int64_t K, float* res, bool, int& configured, uint16_t* tiles) {
  auto block = [&](int64_t b) { return Q5Block{w.q + b * w.qstride, w.d + b * w.sstride}; };
  dequant_unit_dot<NB>(block(b0), block(b1), x, R, K, res, configured, tiles);
}

template <int NB>
void unit_dot_of(const Q8Weight& w, int64_t b0, int64_t b1, const uint16_t* x, int64_t R,
                 int64_t K, float* res, bool, int& configured, uint16_t* tiles) {
  auto block = [&](int64_t b) {
    const int64_t n0 = b * kBlockN;
    const int rows = static_cast<int>(std::clamp<int64_t>(w.N - n0, 0, kBlockN));
    return Q8Block{w.q + n0 * w.K, w.s + n0 * (w.K / w.group), w.K, w.group, rows};
  };
  dequant_unit_dot<NB>(block(b0), block(b1), x, R, K, res, configured, tiles);
}

// Scratch tiles per thread a weight source needs (a quantized source: a unit's 2 x ng).
inline int64_t scratch_tiles(const Bf16Weight&, int64_t) { return 0; }
template <typename W>
int64_t scratch_tiles(const W&, int64_t K) { return 2 * (K / kGroup); }

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

// The 5-bit entry points' checks: x, and N channels in the q5_bf16 layout: q
// [ceil(N / 16), K / 32 * 320] uint8, d [ceil(N / 16), K / 32, 16] float16.
static void check_q5(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                     int64_t N, const char* what) {
  check_x(x, what);
  const int64_t nb = (N + kBlockN - 1) / kBlockN, ng = x.size(1) / kGroup;
  TORCH_CHECK(q.scalar_type() == torch::kByte && q.is_contiguous() &&
                  q.numel() == nb * ng * kQ5GroupBytes,
              what, ": q [ceil(N / 16), K / 32 * 320] uint8 contiguous");
  TORCH_CHECK(d.scalar_type() == torch::kHalf && d.is_contiguous() && d.numel() == nb * ng * kBlockN,
              what, ": d [ceil(N / 16), K / 32, 16] float16 contiguous");
}

// The int8 entry points' checks: x, q [N, K] int8 and s [N, K / group] float32, group 16
// or 32.
static void check_q8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& s,
                     int64_t group, const char* what) {
  check_x(x, what);
  TORCH_CHECK(group == 16 || group == 32, what, ": groups of 16 or 32");
  TORCH_CHECK(q.scalar_type() == torch::kChar && q.is_contiguous() && q.dim() == 2 &&
                  q.size(1) == x.size(1),
              what, ": q [N, K] int8 contiguous");
  TORCH_CHECK(s.scalar_type() == torch::kFloat && s.is_contiguous() && s.dim() == 2 &&
                  s.size(0) == q.size(0) && s.size(1) == x.size(1) / group,
              what, ": s [N, K / group] float32 contiguous");
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

static Q5Weight q5_weight(const torch::Tensor& q, const torch::Tensor& d, int64_t K) {
  return {q.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr()),
          K / kGroup * kQ5GroupBytes, (K / kGroup) * kBlockN};
}

static Q8Weight q8_weight(const torch::Tensor& q, const torch::Tensor& s, int64_t group) {
  return {q.data_ptr<int8_t>(), s.data_ptr<float>(), q.size(1), q.size(0), group};
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

torch::Tensor bf16_tiles_q5_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor d, int64_t N,
                                   c10::optional<torch::Tensor> bias) {
  check_q5(x, q, d, N, "bf16_tiles_q5_matmul");
  return matmul_of(x, q5_weight(q, d, x.size(1)), N, bias, "bf16_tiles_q5_matmul");
}

torch::Tensor bf16_tiles_q5_gated(torch::Tensor x, torch::Tensor q, torch::Tensor d, int64_t H,
                                  bool gelu) {
  TORCH_CHECK(H > 0 && H % kBlockN == 0, "bf16_tiles_q5_gated: H a positive multiple of 16");
  check_q5(x, q, d, 2 * H, "bf16_tiles_q5_gated");
  return gated_of(x, q5_weight(q, d, x.size(1)), H, gelu);
}

torch::Tensor bf16_tiles_q8_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor s,
                                   int64_t group, c10::optional<torch::Tensor> bias) {
  check_q8(x, q, s, group, "bf16_tiles_q8_matmul");
  return matmul_of(x, q8_weight(q, s, group), q.size(0), bias, "bf16_tiles_q8_matmul");
}

torch::Tensor bf16_tiles_q8_gated(torch::Tensor x, torch::Tensor q, torch::Tensor s, int64_t group,
                                  bool gelu) {
  check_q8(x, q, s, group, "bf16_tiles_q8_gated");
  const int64_t H = q.size(0) / 2;
  TORCH_CHECK(H > 0 && q.size(0) == 2 * H && H % kBlockN == 0,
              "bf16_tiles_q8_gated: 2 H rows, H a positive multiple of 16");
  return gated_of(x, q8_weight(q, s, group), H, gelu);
}

#if RADIXLM_TORCH_OPS
// The entries as torch ops for compiled decode graphs (schemas: models/linear/*.py).
TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("bf16_tiles_matmul", &bf16_tiles_matmul);
  m.impl("int4_tiles_matmul", &bf16_tiles_q4_matmul);
  m.impl("q5_tiles_matmul", &bf16_tiles_q5_matmul);
  m.impl("int8_tiles_matmul", &bf16_tiles_q8_matmul);
}
#endif

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
  mod.def("bf16_tiles_q5_matmul", &bf16_tiles_q5_matmul,
        "bf16_tiles_matmul for a 5-bit weight in the q5_bf16 layout (q, d), its B tiles "
        "dequantized per call.",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("n"), py::arg("bias") = py::none());
  mod.def("bf16_tiles_q5_gated", &bf16_tiles_q5_gated,
        "bf16_tiles_gated for a 5-bit [gate; up] weight in the q5_bf16 layout.",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("h"), py::arg("gelu") = false);
  mod.def("bf16_tiles_q8_matmul", &bf16_tiles_q8_matmul,
        "bf16_tiles_matmul for int8 groups (q [N, K] int8, s [N, K / group] float32), its B "
        "tiles dequantized per call.",
        py::arg("x"), py::arg("q"), py::arg("s"), py::arg("group"), py::arg("bias") = py::none());
  mod.def("bf16_tiles_q8_gated", &bf16_tiles_q8_gated,
        "bf16_tiles_gated for int8 groups of a [gate; up] weight.",
        py::arg("x"), py::arg("q"), py::arg("s"), py::arg("group"), py::arg("gelu") = false);
  mod.def("bf16_tiles_path", &bf16_tiles_path, "1: AMX-BF16 tiles usable here, 0: not.");
}
