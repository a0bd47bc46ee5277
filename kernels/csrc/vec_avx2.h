// AVX2 + FMA vector traits: eight float lanes in a ymm register.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "vec_no_bf16.h"

namespace rc {

// no bfloat16 dot products here: bf16 rows are widened to fp32 first
struct Vec : NoBf16Dot {
  static constexpr int W = 8;
  using F = __m256;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F a) { _mm256_storeu_ps(p, a); }
  static F load_bf16(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // x rounded to bfloat16 (nearest even) and widened back; NaN stays NaN
  static F round_bf16(F a) {
    __m256i bits = _mm256_castps_si256(a);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    F rounded = _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(int(0xffff0000u))));
    return _mm256_blendv_ps(rounded, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  // as c10::BFloat16 stores it: nearest even, NaN as the canonical quiet NaN
  static void store_bf16(uint16_t* p, F a) {
    __m256i high = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(a)), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    high = _mm256_blendv_epi8(high, _mm256_set1_epi32(0x7fc0), nan);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F select_gt(F a, F b, F x, F y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // lane i = a[order[i]]
  static F permute(F a, const int32_t* order) {
    return _mm256_permutevar8x32_ps(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(order)));
  }
  static F pow2i(F n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static float hsum(F a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static float hmax(F a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
  }
  // lane r = hsum(acc[r]) for r < N, 0 beyond: a transposing tree of horizontal adds
  template <int N>
  RC_INLINE static F hsum_rows(const F* acc) {
    F v[8];
    for (int i = 0; i < 8; ++i) v[i] = i < N ? acc[i] : zero();
    F t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    F t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    F u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
  }
  static float lane(F a, int i) {
    alignas(32) float tmp[W];
    _mm256_store_ps(tmp, a);
    return tmp[i];
  }
};

}  // namespace rc
