// The 64-byte chunks of the int4_bf16 weight layout (models/linear/int4_bf16_blocks.py),
// shared by the kernels that read it: int4_bf16.cpp (x @ W.T on the groups' exact sums)
// and bf16_tiles.cpp (the groups dequantized into AMX B tiles).
//
// Invariants: a chunk unpacks into 4 registers of 32 16-bit lanes, lane 2 j + e = channel
// j, column 2 r + e of the chunk (register r): the rows 4 ch + r of a B tile; each lane
// holds the bf16 of 128 + q (0x43 in its high byte, q in 0..15 in its low byte: exact).
#pragma once

#if defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

#include "prefetch.h"

// The chunk at src (read kPrefetchBytes ahead) as its 4 registers.
inline void unpack_chunk(const uint8_t* src, __m512i (&w)[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i hi43 = _mm512_set1_epi8(0x43);
  prefetch_ahead(src);
  const __m512i p = _mm512_loadu_si512(src);
  const __m512i lo = _mm512_and_si512(p, low4);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
  w[0] = _mm512_unpacklo_epi8(lo, hi43);
  w[1] = _mm512_unpackhi_epi8(lo, hi43);
  w[2] = _mm512_unpacklo_epi8(hi, hi43);
  w[3] = _mm512_unpackhi_epi8(hi, hi43);
}
#endif
