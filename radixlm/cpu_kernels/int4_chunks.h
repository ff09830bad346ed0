// The 64-byte chunks of the int4_bf16 weight layout (models/linear/int4_bf16_blocks.py),
// shared by the kernels that read it: int4_bf16.cpp (x @ W.T on the groups' exact sums)
// and bf16_tiles.cpp (the groups dequantized into AMX B tiles).
//
// The 5-bit layout (models/linear/q5_bf16_blocks.py, read by q5_bf16.cpp and bf16_tiles.cpp)
// is these chunks plus two 64-bit masks each, the values' bit 4 (unpack_q5_chunk).
//
// Invariants: a chunk unpacks into 4 registers of 32 16-bit lanes, lane 2 j + e = channel
// j, column 2 r + e of the chunk (register r): the rows 4 ch + r of a B tile; each lane
// holds the bf16 of 128 + q (0x43 in its high byte, q in 0..15 in its low byte: exact).
#pragma once

#if defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "prefetch.h"

// The registers of a chunk's low-nibble bytes lo and high-nibble bytes hi (values < 128):
// each byte v becomes the 16-bit lane 0x43 << 8 | v, the bf16 of 128 + v.
inline void bf16_lanes(__m512i lo, __m512i hi, __m512i (&w)[4]) {
  const __m512i hi43 = _mm512_set1_epi8(0x43);
  w[0] = _mm512_unpacklo_epi8(lo, hi43);
  w[1] = _mm512_unpackhi_epi8(lo, hi43);
  w[2] = _mm512_unpacklo_epi8(hi, hi43);
  w[3] = _mm512_unpackhi_epi8(hi, hi43);
}

// The chunk at src (read kPrefetchBytes ahead) as its 4 registers.
inline void unpack_chunk(const uint8_t* src, __m512i (&w)[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  prefetch_ahead(src);
  const __m512i p = _mm512_loadu_si512(src);
  const __m512i lo = _mm512_and_si512(p, low4);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
  bf16_lanes(lo, hi, w);
}

// A 5-bit chunk: the nibbles at src, bit 4 of each value from the two 64-bit masks at
// `masks` (the first: byte b's low nibble, the second: its high nibble); lanes as
// unpack_chunk's, holding the bf16 of 128 + q for q in 0..31 (exact).
inline void unpack_q5_chunk(const uint8_t* src, const uint8_t* masks, __m512i (&w)[4]) {
  uint64_t mlo, mhi;
  std::memcpy(&mlo, masks, 8);
  std::memcpy(&mhi, masks + 8, 8);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  prefetch_ahead(src);
  const __m512i p = _mm512_loadu_si512(src);
  __m512i lo = _mm512_and_si512(p, low4);
  __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
  lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(mlo), lo, bit4);
  hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(mhi), hi, bit4);
  bf16_lanes(lo, hi, w);
}
#endif
