// AMX tiles, shared by the kernels that use them (the amx kernel library only): every tile is
// configured as 16 rows of 64 bytes, per thread, before its first tile instruction. GCC's tile
// intrinsics take the tile registers as literal numbers.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace rc::amx {

inline void configure() {
  struct alignas(64) {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

}  // namespace rc::amx
