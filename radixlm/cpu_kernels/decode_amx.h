// The AMX decode attention kernel (AMX-BF16 tiles), included by decode_attention.cpp.
// RADIXLM_DECODE_AMX says whether it is compiled in; the caller checks
// amx_tiles::amx_permitted() before calling it.
//
// Invariants: bf16 queries and KV, head_dim 64, 128 or 256; the output equals softmax(q K^T
// scale) V up to bf16 rounding of the probabilities (their sum is of the rounded values).
#pragma once

#include "decode_dpbf16.h"

// Needs the dp kernel's helpers and AMX-BF16; -DRADIXLM_DECODE_AMX=0 leaves it out (a test
// builds the dp kernel so).
#if !defined(RADIXLM_DECODE_AMX)
#if RADIXLM_DECODE_DPBF16 && defined(__AMX_BF16__) && defined(__AMX_TILE__)
#define RADIXLM_DECODE_AMX 1
#else
#define RADIXLM_DECODE_AMX 0
#endif
#endif

#if RADIXLM_DECODE_AMX
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "amx_tiles.h"
#include "decode_task.h"
#include "fast_exp.h"
#include "simd.h"

// The AMX kernel: bf16 queries and KV, head_dim DC (64, 128 or 256), GC query heads per KV
// head, on AMX-BF16 tiles, in passes over the task's positions (no online rescaling):
//   1. scores: per 16 positions their K rows (copied into a contiguous block) times q^T
//      (GC columns: the query in the tile's pair layout), a tile of 16 positions x GC
//      scores stored interleaved; a round of 4 blocks (2 for 128 dims) in as many C
//      tiles, two K buffers alternating, so that the tile products overlap the copies;
//   2. the running max per lane over the interleaved scores, then per head (de-interleaved
//      once per block) exp(scale (s - max)) rounded to bf16 (as flash attention's P V
//      product does; the sum is of the rounded weights), zero past the end;
//   3. P V: per 32 positions P (GC rows) times V (two positions' rows interleaved by
//      16-bit word, as the dp kernel does) into four GC x 16-dim float tiles (64 dims a
//      sweep) kept across the positions; the unpack's dim order is undone at the output.
// Every K and V row is read once; a task reads and writes only its own rows (the step's
// own, when fused, first); scratch is the thread's.
namespace amx_decode {

using decode_task::KvWrite;
using decode_task::begin_task;
using decode_task::prefetch_row;
using decode_task::visible_slots;

// Tile numbers (the intrinsics take literals). Pass 1: 2..5 the q^T chunks (2, 3 for 64
// dims; for 256 dims 2 and 3 reloaded per block with the even and odd chunks), 1 and 6 a K
// block's even and odd 32-dim chunks, the scores of a round's blocks in 0, 7 (and 4, 5 for
// 64 and 256 dims). Pass 3: 0..3 P V's float tiles, 4 P, 5..7 V pairs (rotating).
inline void configure_scores(int gc, int r_count) {
  amx_tiles::TileConfig cfg;
  for (int t : {0, 7, 4, 5}) {
    if (t >= 2 && t < 2 + r_count) continue;
    cfg.rows[t] = 16, cfg.colsb[t] = static_cast<uint16_t>(4 * gc);
  }
  for (int t : {1, 6}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  for (int r = 0; r < r_count; ++r) cfg.rows[2 + r] = 16, cfg.colsb[2 + r] = static_cast<uint16_t>(4 * gc);
  amx_tiles::load_config(cfg);
}

inline void configure_values(int gc) {
  amx_tiles::TileConfig cfg;
  for (int t = 0; t < 5; ++t) cfg.rows[t] = static_cast<uint8_t>(gc), cfg.colsb[t] = 64;
  for (int t = 5; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  amx_tiles::load_config(cfg);
}

// Lane indices that de-interleave GC vectors of 16 floats (element e = GC p + g) into head
// g's vector of 16 positions: step s (1..GC-1) takes the lanes from vector s into the
// result of step s - 1 (vector 0 for s = 1); a lane not from vector s keeps its value.
// pos[k]: lane i of interleaved vector k holds a score of the block's position (16 k + i) / GC.
template <int GC>
struct Deinterleave {
  __m512i idx[GC][GC > 1 ? GC - 1 : 1];
  __m512i pos[GC];
  Deinterleave() {
    for (int k = 0; k < GC; ++k) {
      alignas(64) int32_t lanes[16];
      for (int i = 0; i < 16; ++i) lanes[i] = (16 * k + i) / GC;
      pos[k] = _mm512_load_si512(lanes);
    }
    for (int g = 0; g < GC; ++g)
      for (int s = 1; s < GC; ++s) {
        alignas(64) int32_t lanes[16];
        for (int p = 0; p < 16; ++p) {
          const int e = GC * p + g;
          if (s == 1 && e < 16) lanes[p] = e;
          else if (e >= 16 * s && e < 16 * (s + 1)) lanes[p] = 16 + e - 16 * s;
          else lanes[p] = p;
        }
        idx[g][s - 1] = _mm512_load_si512(lanes);
      }
  }
  __m512 head(const __m512* v, int g) const {
    if constexpr (GC == 1) return v[0];
    __m512 t = _mm512_permutex2var_ps(v[0], idx[g][0], v[1]);
    for (int s = 2; s < GC; ++s) t = _mm512_permutex2var_ps(t, idx[g][s - 1], v[s]);
    return t;
  }
};

struct alignas(64) Row64 { uint16_t w[32]; };  // one 64-byte tile row

template <int DC, int GC>
struct Scratch {
  std::vector<Row64> kblock = std::vector<Row64>(2 * 64 * DC / 32);  // two rounds of K rows
  std::vector<Row64> qt = std::vector<Row64>(DC / 32 * 16);          // q^T chunks (4 GC bytes a row)
  std::vector<Row64> vpairs = std::vector<Row64>(2 * 4 * 16);        // two sets of 4 V-pair tiles
  std::vector<float> inter, acc = std::vector<float>(GC * DC);        // [L16][GC] scores, [GC][DC]
  std::vector<uint16_t> p;                                              // [GC][L32] bf16
  std::vector<c10::BFloat16> zero = std::vector<c10::BFloat16>(DC, c10::BFloat16(0.f));
};

template <int DC, int GC>
void decode_amx(const c10::BFloat16* q, c10::BFloat16* kb, c10::BFloat16* vb, const int32_t* r2t,
                int64_t r2t_stride, const int64_t* rows, const int64_t* lens,
                c10::BFloat16* out, int64_t B, int64_t KVH, float scale, int64_t window,
                KvWrite<c10::BFloat16> kv) {
  static_assert((DC == 64 || DC == 128 || DC == 256) && GC >= 1 && GC <= 16, "head_dim 64, 128, 256");
  using bf16 = c10::BFloat16;
  constexpr int64_t D = DC;
  constexpr int R = DC / 32;  // 32-dim chunks of a row
  // q^T stays in tiles 2..1+R up to 128 dims; 256 reloads it per block through tiles 2, 3.
  constexpr bool kQtResident = R <= 4;
  constexpr int kRound = R == 4 ? 2 : 4;  // blocks of 16 positions a round (C tiles free)
  const int64_t HQ = GC * KVH;
  const Deinterleave<GC> deint;
  const decode_dp::UndoUnpack undo;
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    Scratch<DC, GC> s;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / KVH, h = task % KVH;
      int64_t L;
      const int32_t* slots = begin_task(b, h, KVH, D, kb, vb, r2t, r2t_stride, rows, lens,
                                        window, kv, &L);
      const auto row = [&](bf16* buf, int64_t l) -> const bf16* {
        return l < L ? buf + (static_cast<int64_t>(slots[l]) * KVH + h) * D : s.zero.data();
      };
      const int64_t L16 = (L + 15) / 16 * 16, L32 = (L + 31) / 32 * 32;
      s.inter.resize(GC * L16);
      s.p.resize(GC * L32);
      // q^T: chunk r, row i (dim pair), column g: q[g][32 r + 2 i], q[g][32 r + 2 i + 1].
      const uint32_t* qb = reinterpret_cast<const uint32_t*>(q + (b * HQ + h * GC) * D);
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < 16; ++i)
          for (int g = 0; g < GC; ++g)
            reinterpret_cast<uint32_t*>(s.qt[r * 16 + i].w)[g] = qb[(g * D + 32 * r) / 2 + i];
      // 1. Scores.
      configure_scores(GC, kQtResident ? R : 2);
      if constexpr (kQtResident) {
        _tile_loadd(2, s.qt.data(), 64);
        if constexpr (R > 1) _tile_loadd(3, s.qt.data() + 16, 64);
        if constexpr (R > 2) _tile_loadd(4, s.qt.data() + 32, 64);
        if constexpr (R > 3) _tile_loadd(5, s.qt.data() + 48, 64);
      }
      for (int64_t l0 = 0; l0 < L; l0 += 16 * kRound) {
        Row64* blk = s.kblock.data() + ((l0 / (16 * kRound)) & 1) * kRound * 16 * R;
        const int64_t nb = std::min<int64_t>(kRound, (L - l0 + 15) / 16);
        for (int64_t j = 0; j < 16 * nb; ++j) {
          if (l0 + 16 * kRound + j < L) prefetch_row(row(kb, l0 + 16 * kRound + j), D);
          const bf16* kr = row(kb, l0 + j);
          for (int r = 0; r < R; ++r)
            _mm512_store_si512(blk + j * R + r, _mm512_loadu_si512(kr + 32 * r));
        }
        // Block bi of the round into C tile CT; then the tiles stored.
#define RADIXLM_SCORE_BLOCK(CT, bi)                                                       \
  if (bi < nb) {                                                                          \
    const Row64* kbk = blk + bi * 16 * R;                                                 \
    _tile_zero(CT);                                                                       \
    if constexpr (kQtResident) {                                                          \
      _tile_loadd(1, kbk, 64 * R);                                                        \
      _tile_dpbf16ps(CT, 1, 2);                                                           \
      if constexpr (R > 1) { _tile_loadd(6, kbk + 1, 64 * R); _tile_dpbf16ps(CT, 6, 3); } \
      if constexpr (R > 2) { _tile_loadd(1, kbk + 2, 64 * R); _tile_dpbf16ps(CT, 1, 4); } \
      if constexpr (R > 3) { _tile_loadd(6, kbk + 3, 64 * R); _tile_dpbf16ps(CT, 6, 5); } \
    } else {                                                                              \
      for (int r = 0; r < R; r += 2) {                                                    \
        _tile_loadd(1, kbk + r, 64 * R);                                                  \
        _tile_loadd(2, s.qt.data() + 16 * r, 64);                                         \
        _tile_dpbf16ps(CT, 1, 2);                                                         \
        _tile_loadd(6, kbk + r + 1, 64 * R);                                              \
        _tile_loadd(3, s.qt.data() + 16 * (r + 1), 64);                                   \
        _tile_dpbf16ps(CT, 6, 3);                                                         \
      }                                                                                   \
    }                                                                                     \
  }
#define RADIXLM_SCORE_STORE(CT, bi) \
  if (bi < nb) _tile_stored(CT, s.inter.data() + (l0 + 16 * bi) * GC, 4 * GC);
        RADIXLM_SCORE_BLOCK(0, 0)
        RADIXLM_SCORE_BLOCK(7, 1)
        if constexpr (kRound == 4) {
          RADIXLM_SCORE_BLOCK(4, 2)
          RADIXLM_SCORE_BLOCK(5, 3)
        }
        RADIXLM_SCORE_STORE(0, 0)
        RADIXLM_SCORE_STORE(7, 1)
        if constexpr (kRound == 4) {
          RADIXLM_SCORE_STORE(4, 2)
          RADIXLM_SCORE_STORE(5, 3)
        }
#undef RADIXLM_SCORE_BLOCK
#undef RADIXLM_SCORE_STORE
      }
      // 2. Softmax: the max per interleaved lane (past L: -inf), then per head. The first
      // V rows are asked for first (pass 3 asks for the rest a round ahead).
      for (int64_t l = 0; l < std::min<int64_t>(L, 32); ++l) prefetch_row(row(vb, l), D);
      __m512 mx[GC];
      for (int k = 0; k < GC; ++k) mx[k] = _mm512_set1_ps(-INFINITY);
      for (int64_t l0 = 0; l0 < L16; l0 += 16) {
        for (int k = 0; k < GC; ++k) {
          const __m512 v = _mm512_loadu_ps(s.inter.data() + l0 * GC + 16 * k);
          const __mmask16 ok = l0 + 16 <= L ? __mmask16(0xFFFF)
              : _mm512_cmp_epi32_mask(deint.pos[k], _mm512_set1_epi32(static_cast<int>(L - l0)), _MM_CMPINT_LT);
          mx[k] = _mm512_mask_max_ps(mx[k], ok, mx[k], v);
        }
      }
      float lsum[GC];
      for (int g = 0; g < GC; ++g) {
        const float m = _mm512_reduce_max_ps(deint.head(mx, g));
        const __m512 ms = _mm512_set1_ps(m * scale);
        vf sum{};
        uint16_t* pg = s.p.data() + g * L32;
        for (int64_t l0 = 0; l0 < L16; l0 += 16) {
          __m512 v[GC];
          for (int k = 0; k < GC; ++k) v[k] = _mm512_loadu_ps(s.inter.data() + l0 * GC + 16 * k);
          const __m512 x = _mm512_fmsub_ps(deint.head(v, g), _mm512_set1_ps(scale), ms);
          vf pr = round_bf16(exp_vec(reinterpret_cast<const vf&>(x)));
          if (l0 + 16 > L) pr = (lane_index() + static_cast<float>(l0)) < static_cast<float>(L) ? pr : vf{};
          sum += pr;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(pg + l0),
                              _mm512_cvtepi32_epi16(_mm512_srli_epi32((__m512i)pr, 16)));
        }
        for (int64_t l = L16; l < L32; ++l) pg[l] = 0;
        lsum[g] = hsum(sum);
      }
      // 3. P V, 64 dims a sweep; meanwhile the next task's first K rows are asked for.
      int64_t L_next = 0;
      const int32_t* slots_next = nullptr;
      int64_t h_next = 0;
      if (task + 1 < end) {
        slots_next = visible_slots((task + 1) / KVH, r2t, r2t_stride, rows, lens, window, &L_next);
        h_next = (task + 1) % KVH;
        L_next = std::min<int64_t>(L_next, 16 * kRound);
      }
      configure_values(GC);
      for (int64_t d0 = 0; d0 < D; d0 += 64) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t l0 = 0; l0 < L; l0 += 32) {
          Row64* vp = s.vpairs.data() + ((l0 / 32) & 1) * 64;
          for (int i = 0; i < 16; ++i) {
            // Whole rows in the first sweep (128 dims: the second finds its halves cached).
            for (int64_t l = l0 + 32 + 2 * i; l < std::min<int64_t>(L, l0 + 34 + 2 * i); ++l)
              prefetch_row(row(vb, l) + d0, d0 == 0 ? D : 64);
            if (const int64_t l = l0 / 2 + i; d0 == 0 && l < L_next)  // 16 a round
              prefetch_row(kb + (static_cast<int64_t>(slots_next[l]) * KVH + h_next) * D, D);
            const bf16* x = row(vb, l0 + 2 * i) + d0;
            const bf16* y = row(vb, l0 + 2 * i + 1) + d0;
            for (int c = 0; c < 2; ++c) {
              const __m512i xv = _mm512_loadu_si512(x + 32 * c), yv = _mm512_loadu_si512(y + 32 * c);
              _mm512_store_si512(vp + (2 * c) * 16 + i, _mm512_unpacklo_epi16(xv, yv));
              _mm512_store_si512(vp + (2 * c + 1) * 16 + i, _mm512_unpackhi_epi16(xv, yv));
            }
          }
          _tile_loadd(4, s.p.data() + l0, 2 * L32);
          _tile_loadd(5, vp, 64);
          _tile_loadd(6, vp + 16, 64);
          _tile_loadd(7, vp + 32, 64);
          _tile_dpbf16ps(0, 4, 5);
          _tile_dpbf16ps(1, 4, 6);
          _tile_dpbf16ps(2, 4, 7);
          _tile_loadd(5, vp + 48, 64);
          _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, s.acc.data() + d0 + 0, 4 * D);
        _tile_stored(1, s.acc.data() + d0 + 16, 4 * D);
        _tile_stored(2, s.acc.data() + d0 + 32, 4 * D);
        _tile_stored(3, s.acc.data() + d0 + 48, 4 * D);
      }
      // The four tiles of a sweep hold its 64 dims in the unpack's order (as the dp kernel's sums).
      bf16* ob = out + (b * HQ + h * GC) * D;
      for (int g = 0; g < GC; ++g)
        decode_dp::write_unpacked(s.acc.data() + g * D, lsum[g] > 0.f ? 1.f / lsum[g] : 0.f, D,
                                  undo, ob + g * D);
    }
    _tile_release();
  });
}

}  // namespace amx_decode
#endif
