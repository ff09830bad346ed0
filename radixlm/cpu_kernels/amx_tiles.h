// AMX tile state for the kernels that run tile products (int4_bf16.cpp, bf16_tiles.cpp):
// the OS permission a process must ask for once, and the tile configuration record.
//
// Invariants: amx_permitted() asks once per process (the result is cached); a thread
// loads a configuration before its first tile instruction and releases the tiles when
// its work ends (_tile_release), so that the OS need not save them.
// Compiled only where the compiler targets AMX-BF16 (the kernels' own condition).
#pragma once

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace amx_tiles {

// Linux hands a process AMX's tile state only when asked (false: no AMX path).
inline bool amx_permitted() {
  static const bool ok = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// The 64-byte record _tile_loadconfig reads (palette 1): per tile its rows and bytes per
// row; a tile with 0 rows is unused.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Load a configuration record. GCC's _tile_loadconfig names only the record's first 8
// bytes as read by its asm: the barrier keeps the compiler from dropping the stores to
// the rest (it did, for a record filled with constants).
inline void load_config(const TileConfig& cfg) {
  asm volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// Load a configuration of tiles 0..n-1 with rows[t] rows of 64 bytes (0: unused).
inline void configure(const int* rows, int n) {
  TileConfig cfg;
  for (int t = 0; t < n; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(rows[t]);
    cfg.colsb[t] = rows[t] > 0 ? 64 : 0;
  }
  load_config(cfg);
}

}  // namespace amx_tiles
#endif
