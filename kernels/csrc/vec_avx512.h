// AVX-512 (F, BW, VL, DQ) vector traits: sixteen float lanes in a zmm register; with
// RC_ISA_AVX512_BF16, bfloat16 dot products too (AVX512_BF16).
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "vec_no_bf16.h"

namespace rc {

#if defined(RC_ISA_AVX512_BF16)
struct Vec {
#else
struct Vec : NoBf16Dot {
#endif
  static constexpr int W = 16;
  using F = __m512;
#if defined(RC_ISA_AVX512_BF16)
  static constexpr bool BF16_DOT = true;
  // acc lane i += a[2i] b[2i] + a[2i+1] b[2i+1], for 32 bfloat16 values of a and b
  static F dot_bf16(F acc, const uint16_t* a, const uint16_t* b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
  }
  // acc lane i += a[2i] pair[0] + a[2i+1] pair[1]
  static F dot_bf16_pair(F acc, const uint16_t* a, const uint16_t* pair) {
    int32_t both;
    std::memcpy(&both, pair, 4);
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a),
                            (__m512bh)_mm512_broadcastd_epi32(_mm_cvtsi32_si128(both)));
  }
  // acc[r] lane i += a[i] w[r].first + b[i] w[r].second for r < N: 16 values of two rows
  // weighed by N pairs of bfloat16 weights (store_pairs), the rows interleaved once for all N
  template <int N>
  RC_INLINE static void dot_pairs(F* acc, const uint16_t* a, const uint16_t* b, const int32_t* w) {
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
    const __m512i pairs = _mm512_permutexvar_epi16(pair_order<16>(), both);
    for (int r = 0; r < N; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)pairs, (__m512bh)_mm512_set1_epi32(w[r]));
  }
  // Two vectors of scores (W / S keys of S lanes each, b's keys after a's) rounded to bfloat16
  // (nearest even) and stored in pairs of keys: p[i S + r] = (key 2i, key 2i + 1) of lane r
  template <int S>
  static void store_pairs(int32_t* p, F a, F b) {
    _mm512_storeu_si512(p, _mm512_permutexvar_epi16(pair_order<S>(), (__m512i)_mm512_cvtne2ps_pbh(b, a)));
  }
  // the 16-bit lanes of two vectors of S-lane keys, keys 2i and 2i + 1's lane r side by side
  // (S = 16: two rows' 16 values alternating)
  template <int S>
  static __m512i pair_order() {
    alignas(64) static constexpr auto order = [] {
      std::array<uint16_t, 32> o{};
      for (int t = 0; t < 16; ++t) {
        o[2 * t] = uint16_t(2 * (t / S) * S + t % S);
        o[2 * t + 1] = uint16_t((2 * (t / S) + 1) * S + t % S);
      }
      return o;
    }();
    return _mm512_load_si512(order.data());
  }
#endif

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
  static F load_bf16(const uint16_t* p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  // x rounded to bfloat16 (nearest even) and widened back; NaN stays NaN
  static F round_bf16(F a) {
    __m512i bits = _mm512_castps_si512(a);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    F rounded = _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32(int(0xffff0000u))));
    return _mm512_mask_mov_ps(rounded, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  // as c10::BFloat16 stores it: nearest even, NaN as the canonical quiet NaN
  static void store_bf16(uint16_t* p, F a) {
    __m512i high = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(a)), 16);
    high = _mm512_mask_mov_epi32(high, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
  }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F select_gt(F a, F b, F x, F y) { return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), x); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // lane i = a[order[i]]
  static F permute(F a, const int32_t* order) { return _mm512_permutexvar_ps(_mm512_loadu_si512(order), a); }
  static F pow2i(F n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static float hsum(F a) { return _mm512_reduce_add_ps(a); }
  static float hmax(F a) { return _mm512_reduce_max_ps(a); }
  // lane r = hsum(acc[r]) for r < N, 0 beyond
  template <int N>
  RC_INLINE static F hsum_rows(const F* acc) {
    return reduce_rows<N>(acc, [](F a, F b) { return _mm512_add_ps(a, b); });
  }
  // lane r = hmax(acc[r]), for all 16 rows
  RC_INLINE static F hmax_rows(const F* acc) {
    return reduce_rows<16>(acc, [](F a, F b) { return _mm512_max_ps(a, b); });
  }
  // lane r = op over acc[r]'s lanes for r < N (0 beyond: a sum's padding). Each stage halves the
  // vectors, pairing (a, b) so a's partial results fill one half and b's the other; the last
  // stage leaves vector k + 4 m in lane 4 k + m, which one permutation puts back in order.
  template <int N, class Op>
  RC_INLINE static F reduce_rows(const F* acc, Op op) {
    F v[16];
    for (int i = 0; i < 16; ++i) v[i] = i < N ? acc[i] : zero();
    F h[8], q[4], w[2];
    for (int i = 0; i < 8; ++i)
      h[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; ++i)
      q[i] = op(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; ++i) w[i] = op(_mm512_unpacklo_ps(q[2 * i], q[2 * i + 1]), _mm512_unpackhi_ps(q[2 * i], q[2 * i + 1]));
    F z = op(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, z);
  }
  static float lane(F a, int i) {
    alignas(64) float tmp[W];
    _mm512_store_ps(tmp, a);
    return tmp[i];
  }
};

}  // namespace rc
