// The 8-bit float formats an fp8 KV cache stores (--kv-cache-dtype fp8_e4m3 / fp8_e5m2), read
// and written W values at a time: rounded to nearest even and saturated at the format's largest
// finite value, as torch converts after a clamp. No step takes a float subnormal (fp8's
// subnormals are small integers times a power of two): x86 runs those through a microcode
// assist, which made a bf16 decode step read from an fp8 cache 1.7x slower than from bf16.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "vec.h"

namespace rc {

struct Fp8 {
  int mantissa;  // bits
  int bias;
  float max;  // largest finite value
};

constexpr Fp8 E4M3{3, 7, 448.0f};
constexpr Fp8 E5M2{2, 15, 57344.0f};

// 2**n as a float (|n| < 127)
constexpr float pow2(int n) { return n >= 0 ? (n == 0 ? 1.0f : 2.0f * pow2(n - 1)) : 0.5f * pow2(n + 1); }

// the exponent rebias between the float's bits and the fp8's (both normal)
template <Fp8 FORMAT>
constexpr uint32_t REBIAS = uint32_t(127 - FORMAT.bias) << 23;
// an fp8 subnormal's value is its mantissa bits times this
template <Fp8 FORMAT>
constexpr float SUBNORMAL_UNIT = pow2(1 - FORMAT.bias - FORMAT.mantissa);

template <Fp8 FORMAT>
inline float decode_fp8(uint32_t b) {
  const uint32_t magnitude = b & 0x7fu;
  float x;
  if (magnitude >> FORMAT.mantissa == 0) {
    x = float(magnitude) * SUBNORMAL_UNIT<FORMAT>;
  } else {
    const uint32_t bits = (magnitude << (23 - FORMAT.mantissa)) + REBIAS<FORMAT>;
    std::memcpy(&x, &bits, 4);
  }
  return b & 0x80u ? -x : x;
}

template <Fp8 FORMAT>
RC_INLINE F load_fp8(const uint8_t* p) {
#if defined(RC_ISA_AVX512)
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i magnitude = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
  const __m512i normal =
      _mm512_add_epi32(_mm512_slli_epi32(magnitude, 23 - FORMAT.mantissa), _mm512_set1_epi32(int(REBIAS<FORMAT>)));
  const __m512 subnormal = _mm512_mul_ps(_mm512_cvtepi32_ps(magnitude), _mm512_set1_ps(SUBNORMAL_UNIT<FORMAT>));
  const __mmask16 small = _mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32(1 << FORMAT.mantissa));
  const __m512i bits = _mm512_mask_mov_epi32(normal, small, _mm512_castps_si512(subnormal));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
#elif defined(RC_ISA_AVX2)
  // as above in eight lanes (element by element, an AVX2 decode step from an fp8 cache ran 2.3x
  // slower than from fp32)
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  const __m256i normal =
      _mm256_add_epi32(_mm256_slli_epi32(magnitude, 23 - FORMAT.mantissa), _mm256_set1_epi32(int(REBIAS<FORMAT>)));
  const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(magnitude), _mm256_set1_ps(SUBNORMAL_UNIT<FORMAT>));
  const __m256 small = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(1 << FORMAT.mantissa), magnitude));
  const __m256 value = _mm256_blendv_ps(_mm256_castsi256_ps(normal), subnormal, small);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  return _mm256_or_ps(value, _mm256_castsi256_ps(sign));
#else
  alignas(64) float out[W];
  for (int i = 0; i < W; ++i) out[i] = decode_fp8<FORMAT>(p[i]);
  return Vec::load(out);
#endif
}

// W values as bfloat16 bits: exact (fp8's mantissa fits bf16's, its exponents bf16's range)
template <Fp8 FORMAT>
RC_INLINE void load_fp8_bf16(const uint8_t* p, uint16_t* out) {
#if defined(RC_ISA_AVX512)
  // in 16-bit lanes, without the float detour (a third of the instructions): a normal value's
  // bits rebiased, a subnormal's looked up by its mantissa
  alignas(32) static constexpr auto SUBNORMALS = [] {
    std::array<uint16_t, 16> bits{};
    for (uint32_t m = 0; m < (1u << FORMAT.mantissa); ++m) {
      const float x = float(m) * SUBNORMAL_UNIT<FORMAT>;
      bits[m] = uint16_t(std::bit_cast<uint32_t>(x) >> 16);
    }
    return bits;
  }();
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
  const __m256i normal = _mm256_add_epi16(_mm256_slli_epi16(magnitude, 7 - FORMAT.mantissa),
                                          _mm256_set1_epi16(int16_t((127 - FORMAT.bias) << 7)));
  const __m256i subnormal = _mm256_permutexvar_epi16(magnitude, _mm256_load_si256(reinterpret_cast<const __m256i*>(SUBNORMALS.data())));
  const __mmask16 small = _mm256_cmplt_epu16_mask(magnitude, _mm256_set1_epi16(int16_t(1 << FORMAT.mantissa)));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(_mm256_mask_mov_epi16(normal, small, subnormal), sign));
#else
  alignas(64) float wide[W];
  Vec::store(wide, load_fp8<FORMAT>(p));
  for (int i = 0; i < W; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &wide[i], 4);
    out[i] = uint16_t(bits >> 16);
  }
#endif
}

// The inverse, after a clamp: an fp8 subnormal as the nearest multiple of its unit (by the
// float's own nearest-even rounding of x + 2**23), a normal as the float's bits rebiased and
// rounded to the fp8 mantissa (nearest even; a carry moves into the exponent, as it should).
template <Fp8 FORMAT>
RC_INLINE void store_fp8(uint8_t* p, F x) {
  const F clamped = Vec::min(Vec::max(x, Vec::set1(-FORMAT.max)), Vec::set1(FORMAT.max));
  constexpr int SHIFT = 23 - FORMAT.mantissa;
  constexpr uint32_t HALF = (1u << (SHIFT - 1)) - 1;
#if defined(RC_ISA_AVX512)
  const __m512i bits = _mm512_castps_si512(clamped);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __m512 absolute = _mm512_castsi512_ps(magnitude);
  // the default rounding mode is nearest even
  const __m512i subnormal = _mm512_cvtps_epi32(_mm512_mul_ps(absolute, _mm512_set1_ps(1.0f / SUBNORMAL_UNIT<FORMAT>)));
  const __m512i rebiased = _mm512_sub_epi32(magnitude, _mm512_set1_epi32(int(REBIAS<FORMAT>)));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(rebiased, SHIFT), _mm512_set1_epi32(1));
  const __m512i normal =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(rebiased, _mm512_set1_epi32(int(HALF))), odd), SHIFT);
  const __mmask16 small = _mm512_cmp_ps_mask(absolute, _mm512_set1_ps(pow2(1 - FORMAT.bias)), _CMP_LT_OQ);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  const __m512i code = _mm512_or_si512(_mm512_mask_mov_epi32(normal, small, subnormal), sign);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(code));
#elif defined(RC_ISA_AVX2)
  const __m256i bits = _mm256_castps_si256(clamped);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256 absolute = _mm256_castsi256_ps(magnitude);
  const __m256i subnormal = _mm256_cvtps_epi32(_mm256_mul_ps(absolute, _mm256_set1_ps(1.0f / SUBNORMAL_UNIT<FORMAT>)));
  const __m256i rebiased = _mm256_sub_epi32(magnitude, _mm256_set1_epi32(int(REBIAS<FORMAT>)));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(rebiased, SHIFT), _mm256_set1_epi32(1));
  const __m256i normal =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(rebiased, _mm256_set1_epi32(int(HALF))), odd), SHIFT);
  const __m256i small =
      _mm256_castps_si256(_mm256_cmp_ps(absolute, _mm256_set1_ps(pow2(1 - FORMAT.bias)), _CMP_LT_OQ));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  const __m256i code = _mm256_or_si256(_mm256_blendv_epi8(normal, subnormal, small), sign);
  // eight codes (each < 256) narrowed to bytes
  const __m128i halves = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(halves, halves));
#else
  alignas(64) float in[W];
  Vec::store(in, clamped);
  for (int i = 0; i < W; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &in[i], 4);
    const uint32_t magnitude = bits & 0x7fffffffu;
    float absolute;
    std::memcpy(&absolute, &magnitude, 4);
    uint32_t code;
    if (absolute < pow2(1 - FORMAT.bias)) {
      code = uint32_t((absolute / SUBNORMAL_UNIT<FORMAT> + 8388608.0f) - 8388608.0f);
    } else {
      const uint32_t rebiased = magnitude - REBIAS<FORMAT>;
      code = (rebiased + HALF + ((rebiased >> SHIFT) & 1u)) >> SHIFT;
    }
    p[i] = uint8_t(((bits >> 24) & 0x80u) | code);
  }
#endif
}

// Loads and stores of W elements of a KV cache, whatever its dtype: the activations' or fp8.
inline F load_cache(const void* base, int64_t i, rc_dtype dtype) {
  if (dtype == RC_FP8_E4M3) return load_fp8<E4M3>(static_cast<const uint8_t*>(base) + i);
  if (dtype == RC_FP8_E5M2) return load_fp8<E5M2>(static_cast<const uint8_t*>(base) + i);
  return load(base, i, dtype);
}

inline void store_cache(void* base, int64_t i, F x, rc_dtype dtype) {
  if (dtype == RC_FP8_E4M3) return store_fp8<E4M3>(static_cast<uint8_t*>(base) + i, x);
  if (dtype == RC_FP8_E5M2) return store_fp8<E5M2>(static_cast<uint8_t*>(base) + i, x);
  store(base, i, x, dtype);
}

// W values of a cache row into a staged row of the element type T (float, or bf16 as uint16_t)
inline void stage_cache(float* out, const void* base, int64_t i, rc_dtype dtype) { Vec::store(out, load_cache(base, i, dtype)); }
inline void stage_cache(uint16_t* out, const void* base, int64_t i, rc_dtype dtype) {
  if (dtype == RC_FP8_E4M3) return load_fp8_bf16<E4M3>(static_cast<const uint8_t*>(base) + i, out);
  if (dtype == RC_FP8_E5M2) return load_fp8_bf16<E5M2>(static_cast<const uint8_t*>(base) + i, out);
  Vec::store_bf16(out, load_cache(base, i, dtype));
}

}  // namespace rc
