// The vector traits of the instruction set this translation unit is built for (RC_ISA_AVX512,
// with or without RC_ISA_AVX512_BF16, RC_ISA_AVX2, or the portable fallback), and the math
// every kernel shares on top of them.
#pragma once

// for helpers an inner loop calls with many vectors (hsum_rows, exp): left out of line, the
// compiler passed their vectors through memory (a fifth of a decode step's attention time)
#define RC_INLINE inline __attribute__((always_inline))

#if defined(RC_ISA_AVX512)
#include "vec_avx512.h"
#elif defined(RC_ISA_AVX2)
#include "vec_avx2.h"
#else
#include "vec_scalar.h"
#endif

#include <cstdint>
#include <cstring>
#include <limits>

#include "kernel_api.h"

namespace rc {

using F = Vec::F;
constexpr int W = Vec::W;
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// e**x with Cephes' range reduction and polynomial (about 1 ulp); e**-inf is 0.
RC_INLINE F exp(F x) {
  const F lo = Vec::set1(-87.3365478515625f), hi = Vec::set1(88.3762626647949f);
  F clamped = Vec::min(Vec::max(x, lo), hi);
  F n = Vec::round(Vec::mul(clamped, Vec::set1(1.44269504088896341f)));
  F r = Vec::fma(n, Vec::set1(-0.693359375f), clamped);
  r = Vec::fma(n, Vec::set1(2.12194440e-4f), r);
  F p = Vec::set1(1.9875691500e-4f);
  p = Vec::fma(p, r, Vec::set1(1.3981999507e-3f));
  p = Vec::fma(p, r, Vec::set1(8.3334519073e-3f));
  p = Vec::fma(p, r, Vec::set1(4.1665795894e-2f));
  p = Vec::fma(p, r, Vec::set1(1.6666665459e-1f));
  p = Vec::fma(p, r, Vec::set1(5.0000001201e-1f));
  p = Vec::fma(p, Vec::mul(r, r), Vec::add(r, Vec::set1(1.0f)));
  F y = Vec::mul(p, Vec::pow2i(n));
  return Vec::select_gt(x, lo, y, Vec::zero());
}

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

inline uint16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (x != x) return 0x7fc0;
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// x rounded to bfloat16 and back: what one bfloat16 operation leaves of an exact result
inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// Loads and stores of W elements of an activation or cache tensor, whatever its dtype.
inline F load(const void* base, int64_t i, rc_dtype dtype) {
  if (dtype == RC_BFLOAT16) return Vec::load_bf16(static_cast<const uint16_t*>(base) + i);
  return Vec::load(static_cast<const float*>(base) + i);
}

inline void store(void* base, int64_t i, F x, rc_dtype dtype) {
  if (dtype == RC_BFLOAT16)
    Vec::store_bf16(static_cast<uint16_t*>(base) + i, x);
  else
    Vec::store(static_cast<float*>(base) + i, x);
}

// W elements of a row whose element type is known at compile time (fp32, or bf16 as uint16_t)
inline F load_row(const float* p) { return Vec::load(p); }
inline F load_row(const uint16_t* p) { return Vec::load_bf16(p); }
inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return bf16_to_float(x); }

inline float load1(const void* base, int64_t i, rc_dtype dtype) {
  if (dtype == RC_BFLOAT16) return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

inline void store1(void* base, int64_t i, float x, rc_dtype dtype) {
  if (dtype == RC_BFLOAT16)
    static_cast<uint16_t*>(base)[i] = float_to_bf16(x);
  else
    static_cast<float*>(base)[i] = x;
}

inline int64_t dtype_size(rc_dtype dtype) { return dtype == RC_FLOAT32 ? 4 : dtype == RC_BFLOAT16 ? 2 : 1; }

}  // namespace rc
