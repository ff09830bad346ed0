// Software prefetch for the kernels that stream a weight from memory once per call. A
// core's hardware prefetcher alone keeps too few cache misses in flight: on a 2-vCPU Xeon
// (AMX) the int8 head read at 21-25 GB/s where oneDNN's bf16 reads reached 34 and a read
// announced 4 KiB ahead reached 41-45 (docs/benchmarks.md, "Software prefetch").
//
// Invariants: a hint only: no fault at any address (past a buffer's end included), no
// change in any result. The distance is in bytes of the stream the pointer walks.
#pragma once

#include <cstdint>

#ifndef RADIXLM_PREFETCH_BYTES  // -DRADIXLM_PREFETCH_BYTES=N: another distance (0: none)
#define RADIXLM_PREFETCH_BYTES 4096
#endif
constexpr int64_t kPrefetchBytes = RADIXLM_PREFETCH_BYTES;

// Ask for the cache line `bytes` past p (read, keep in every cache level).
inline void prefetch_ahead(const void* p, int64_t bytes = kPrefetchBytes) {
  if (kPrefetchBytes > 0)
    __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + bytes), 0, 3);
}

// Every cache line of the `bytes` bytes that start `ahead` bytes past p.
inline void prefetch_span(const void* p, int64_t bytes, int64_t ahead) {
  for (int64_t off = 0; off < bytes; off += 64) prefetch_ahead(p, ahead + off);
}
