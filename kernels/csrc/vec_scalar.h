// Portable vector traits: four float lanes in plain C++ (the compiler vectorises what it can).
// The fallback on any CPU, and the reference the SIMD traits are tested against.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "vec_no_bf16.h"

namespace rc {

// no bfloat16 dot products here: bf16 rows are widened to fp32 first
struct Vec : NoBf16Dot {
  static constexpr int W = 4;
  struct F {
    float v[W];
  };

  static F zero() { return set1(0.0f); }
  static F set1(float x) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = x;
    return r;
  }
  static F load(const float* p) {
    F r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static void store(float* p, F a) { std::memcpy(p, a.v, sizeof(a.v)); }
  static F load_bf16(const uint16_t* p) {
    F r;
    for (int i = 0; i < W; ++i) {
      uint32_t bits = uint32_t(p[i]) << 16;
      std::memcpy(&r.v[i], &bits, 4);
    }
    return r;
  }
  static F round_bf16(F a) {
    F r;
    for (int i = 0; i < W; ++i) {
      uint32_t bits = uint32_t(bf16_bits(a.v[i])) << 16;
      std::memcpy(&r.v[i], &bits, 4);
      if (a.v[i] != a.v[i]) r.v[i] = a.v[i];
    }
    return r;
  }
  static void store_bf16(uint16_t* p, F a) {
    for (int i = 0; i < W; ++i) p[i] = bf16_bits(a.v[i]);
  }
#define RC_LANEWISE(name, expr)     \
  static F name(F a, F b) {         \
    F r;                            \
    for (int i = 0; i < W; ++i) {   \
      float x = a.v[i], y = b.v[i]; \
      r.v[i] = (expr);              \
    }                               \
    return r;                       \
  }
  RC_LANEWISE(add, x + y)
  RC_LANEWISE(sub, x - y)
  RC_LANEWISE(mul, x * y)
  RC_LANEWISE(div, x / y)
  RC_LANEWISE(max, x > y ? x : y)
  RC_LANEWISE(min, x < y ? x : y)
#undef RC_LANEWISE
  static F fma(F a, F b, F c) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  // a > b ? x : y, lane by lane
  static F select_gt(F a, F b, F x, F y) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] > b.v[i] ? x.v[i] : y.v[i];
    return r;
  }
  static F round(F a) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = std::nearbyint(a.v[i]);
    return r;
  }
  // lane i = a[order[i]]
  static F permute(F a, const int32_t* order) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[order[i]];
    return r;
  }
  // 2**n for integral n in [-126, 127]
  static F pow2i(F n) {
    F r;
    for (int i = 0; i < W; ++i) {
      uint32_t bits = uint32_t(int32_t(n.v[i]) + 127) << 23;
      std::memcpy(&r.v[i], &bits, 4);
    }
    return r;
  }
  static float hsum(F a) { return (a.v[0] + a.v[2]) + (a.v[1] + a.v[3]); }
  static float hmax(F a) {
    float m = a.v[0];
    for (int i = 1; i < W; ++i) m = a.v[i] > m ? a.v[i] : m;
    return m;
  }
  // lane r = hsum(acc[r]) for r < N, 0 beyond
  template <int N>
  RC_INLINE static F hsum_rows(const F* acc) {
    F r = zero();
    for (int i = 0; i < N; ++i) r.v[i] = hsum(acc[i]);
    return r;
  }
  static float lane(F a, int i) { return a.v[i]; }

  static uint16_t bf16_bits(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (x != x) return 0x7fc0;
    return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
};

}  // namespace rc
