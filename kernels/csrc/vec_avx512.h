// AVX-512 (F, BW, VL, DQ) vector traits: sixteen float lanes in a zmm register; with
// RC_ISA_AVX512_BF16, bfloat16 dot products too (AVX512_BF16).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace rc {

struct Vec {
  static constexpr int W = 16;
  using F = __m512;
#if defined(RC_ISA_AVX512_BF16)
  static constexpr bool BF16_DOT = true;
  // acc lane i += a[2i] b[2i] + a[2i+1] b[2i+1], a and b each holding 32 bfloat16 values
  static F dot_bf16(F acc, F a, F b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(a), (__m512bh)_mm512_castps_si512(b));
  }
#else
  static constexpr bool BF16_DOT = false;
  static F dot_bf16(F acc, F, F) { return acc; }
#endif
  static constexpr int REGISTERS = 32;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
  // 2 W bf16 values as they are, two to a lane
  static F load_bits(const uint16_t* p) { return _mm512_castsi512_ps(_mm512_loadu_si512(p)); }
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
  static F pow2i(F n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static float hsum(F a) { return _mm512_reduce_add_ps(a); }
  static float hmax(F a) { return _mm512_reduce_max_ps(a); }
  // rows[i] lane j becomes rows[j] lane i: pairs of rows interleaved, then pairs of pairs,
  // then 128-bit quarters exchanged twice
  static void transpose(F* rows) {
    F t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      rows[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      rows[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      rows[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      rows[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 16; h += 8)
      for (int i = 0; i < 4; ++i) {
        t[h + i] = _mm512_shuffle_f32x4(rows[h + i], rows[h + i + 4], 0x88);
        t[h + i + 4] = _mm512_shuffle_f32x4(rows[h + i], rows[h + i + 4], 0xdd);
      }
    for (int i = 0; i < 8; ++i) {
      rows[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
      rows[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
  }
};

}  // namespace rc
