// The bfloat16 dot products' names for an instruction set without them (BF16_DOT false): the
// kernels' bf16 branches are discarded at compile time, but must still name these.
#pragma once

#include <cstdint>

namespace rc {

struct NoBf16Dot {
  static constexpr bool BF16_DOT = false;
  template <class F>
  static F dot_bf16(F acc, const uint16_t*, const uint16_t*) {
    return acc;
  }
  template <class F>
  static F dot_bf16_pair(F acc, const uint16_t*, const uint16_t*) {
    return acc;
  }
  template <int N, class F>
  static void dot_pairs(F*, const uint16_t*, const uint16_t*, const int32_t*) {}
  template <int S, class F>
  static void store_pairs(int32_t*, F, F) {}
};

}  // namespace rc
