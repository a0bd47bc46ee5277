// Sixteen query rows against one key block on AMX tiles (the amx kernel library only): the
// scores Q K^T and the weighted values P V are tile products over bfloat16 with fp32 sums; the
// online softmax runs on AVX-512 over each row's scores. A key block's K and V are laid out
// once for the tile products (staged) and then serve every row block of the task.
#pragma once

#include <cmath>
#include <cstdint>

#include "amx.h"
#include "attention_tile.h"

namespace rc::amx {

// keys per score tile: a tile row holds 16 fp32 sums, so a key block takes two
constexpr int HALF = 16;
static_assert(KEY_BLOCK == 2 * HALF && W == 16, "a key block is two score tiles of 16 keys");

// The tile registers (amx.h): tmm0 a query tile (16 rows x 32 dims), tmm1 the keys of a score
// tile (16 dim pairs x 16 keys), tmm2 / tmm3 the block's two score tiles, tmm4 the weights (16
// rows x 32 keys), tmm5 the values (16 key pairs x 16 dims), tmm6 16 rows x 16 dims of the output.

// One key block as the tile products read it: for every 32 dimensions c and half h of the
// block, K^T as [16 dim pairs][16 keys] (a pair of bf16 in each dword), and for every 16
// dimensions, V as [16 key pairs][16 dims][2]. Missing keys of a short block are zeros.
struct Staged {
  uint32_t* k;  // [head_dim / 32][2][16][16]
  uint16_t* v;  // [head_dim / 16][16][32]
};

inline size_t staged_k_size(int head_dim) { return size_t(head_dim / 32) * 2 * 16 * 16; }
inline size_t staged_v_size(int head_dim) { return size_t(head_dim / 16) * 16 * 32; }

// rows[i] (16 dwords each) transposed in place: rows[j] lane i = old rows[i] lane j
RC_INLINE void transpose16(__m512i* rows) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  // within each 128-bit lane L, u[4i + m] now holds column 4L + m of rows 4i .. 4i + 3
  __m512i u[16];
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i x_lo = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i x_hi = _mm512_shuffle_i32x4(u[m], u[4 + m], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i y_lo = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i y_hi = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], _MM_SHUFFLE(3, 2, 3, 2));
    rows[m] = _mm512_shuffle_i32x4(x_lo, y_lo, _MM_SHUFFLE(2, 0, 2, 0));
    rows[4 + m] = _mm512_shuffle_i32x4(x_lo, y_lo, _MM_SHUFFLE(3, 1, 3, 1));
    rows[8 + m] = _mm512_shuffle_i32x4(x_hi, y_hi, _MM_SHUFFLE(2, 0, 2, 0));
    rows[12 + m] = _mm512_shuffle_i32x4(x_hi, y_hi, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Lays the block's keys out as Staged (once for every row block of the task) and fetches the
// next block's rows meanwhile.
inline void stage(const KeyBlock<uint16_t>& keys, const Staged& out) {
  const int d = keys.head_dim;
  for (int j = 0; j < keys.next_n; ++j) {
    prefetch_row(keys.next_k[j], keys.row_bytes);
    prefetch_row(keys.next_v[j], keys.row_bytes);
  }
  for (int c = 0; c < d / 32; ++c)
    for (int h = 0; h < 2; ++h) {
      __m512i rows[16];
      for (int i = 0; i < 16; ++i) {
        const int j = h * HALF + i;
        rows[i] = j < keys.nk ? _mm512_loadu_si512(keys.k[j] + c * 32) : _mm512_setzero_si512();
      }
      transpose16(rows);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out.k + ((c * 2 + h) * 16 + i) * 16, rows[i]);
    }
  const __m512i order = Vec::pair_order<16>();
  for (int c = 0; c < d / 16; ++c)
    for (int pair = 0; pair < 16; ++pair) {
      const int j = 2 * pair;
      const __m256i zero = _mm256_setzero_si256();
      const __m256i first = j < keys.nk ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys.v[j] + c * 16)) : zero;
      const __m256i second =
          j + 1 < keys.nk ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys.v[j + 1] + c * 16)) : zero;
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
      _mm512_storeu_si512(out.v + (c * 16 + pair) * 32, _mm512_permutexvar_epi16(order, both));
    }
}

// e**x for the weights P, which the tile product takes rounded to bfloat16 (8 bits): a degree-5
// polynomial after a one-constant range reduction (relative error ~3e-6) scaled by 2**n in one
// vscalefps, about half the instructions of rc::exp (1 ulp); 0 below e**-87, e**-inf included.
RC_INLINE __m512 exp_weight(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945f), x);
  __m512 p = _mm512_set1_ps(1.0f / 120);
  for (const float c : {1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ), p, n);
}

// The 16 rows of ``rows`` (q_bf16 and acc blocked as in attention_tile.h) against the staged
// block: scores, the online-softmax update of max and sum, P V added into acc. ``scores``:
// [16][32] fp32, ``weights``: [16][32] bf16 of scratch.
inline void attend(const TileRows& rows, const KeyBlock<uint16_t>& keys, const Staged& staged, float* scores,
                   uint16_t* weights) {
  const int d = keys.head_dim;
  _tile_zero(2);
  _tile_zero(3);
  for (int c = 0; c < d / 32; ++c) {
    _tile_loadd(0, rows.q_bf16 + c * 32 * W, 64);
    _tile_loadd(1, staged.k + (c * 2) * 256, 64);
    _tile_dpbf16ps(2, 0, 1);
    _tile_loadd(1, staged.k + (c * 2 + 1) * 256, 64);
    _tile_dpbf16ps(3, 0, 1);
  }
  _tile_stored(2, scores, 128);
  _tile_stored(3, scores + HALF, 128);
  // each row's scores scaled and masked (row r sees the block's keys before visible[r]: causal,
  // and a short block's end), and their maximum (the 16 rows' in one transposing reduction)
  const __m512 scale = _mm512_set1_ps(rows.scale), ninf = _mm512_set1_ps(NEG_INF);
  const __m512i key = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  alignas(64) float base[16], alpha[16];
  __m512 row_max[16], row_sum[16];
  for (int r = 0; r < 16; ++r) {
    const __m512i seen = _mm512_set1_epi32(std::clamp(int(rows.limit[r]) - keys.first, 0, keys.nk));
    float* row = scores + r * 2 * HALF;
    const __m512 s0 = _mm512_mask_mul_ps(ninf, _mm512_cmplt_epi32_mask(key, seen), _mm512_loadu_ps(row), scale);
    const __m512 s1 = _mm512_mask_mul_ps(ninf, _mm512_cmplt_epi32_mask(_mm512_add_epi32(key, _mm512_set1_epi32(HALF)), seen),
                                         _mm512_loadu_ps(row + HALF), scale);
    _mm512_storeu_ps(row, s0);
    _mm512_storeu_ps(row + HALF, s1);
    row_max[r] = _mm512_max_ps(s0, s1);
  }
  // the 16 rows' running maxima at once; a row that has seen no visible key yet keeps max -inf
  // and is measured from 0 (no NaN)
  const __m512 old_max = _mm512_loadu_ps(rows.max);
  const __m512 new_max = _mm512_max_ps(old_max, Vec::hmax_rows(row_max));
  const __m512 from = _mm512_mask_mov_ps(_mm512_setzero_ps(), _mm512_cmp_ps_mask(new_max, ninf, _CMP_GT_OQ), new_max);
  const __m512 scaled = exp(_mm512_sub_ps(old_max, from));
  _mm512_store_ps(base, from);
  _mm512_store_ps(alpha, scaled);
  _mm512_storeu_ps(rows.max, new_max);
  for (int r = 0; r < 16; ++r) {
    const float* row = scores + r * 2 * HALF;
    const __m512 p0 = exp_weight(_mm512_sub_ps(_mm512_loadu_ps(row), _mm512_set1_ps(base[r])));
    const __m512 p1 = exp_weight(_mm512_sub_ps(_mm512_loadu_ps(row + HALF), _mm512_set1_ps(base[r])));
    row_sum[r] = _mm512_add_ps(p0, p1);
    // rounded to bf16 (nearest even) for the product, as FlashAttention rounds P
    _mm512_storeu_si512(weights + r * 2 * HALF, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
  }
  _mm512_storeu_ps(rows.sum, _mm512_fmadd_ps(_mm512_loadu_ps(rows.sum), scaled, Vec::hsum_rows<16>(row_sum)));
  const bool rescale = _mm512_cmp_ps_mask(scaled, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) != 0;
  if (rescale)
    for (int c = 0; c < d / W; ++c)
      for (int r = 0; r < 16; ++r) {
        float* row = rows.acc + (c * 16 + r) * W;
        _mm512_storeu_ps(row, _mm512_mul_ps(_mm512_loadu_ps(row), _mm512_set1_ps(alpha[r])));
      }
  _tile_loadd(4, weights, 64);
  for (int c = 0; c < d / W; ++c) {
    float* out = rows.acc + c * 16 * W;
    _tile_loadd(6, out, 64);
    _tile_loadd(5, staged.v + c * 16 * 32, 64);
    _tile_dpbf16ps(6, 4, 5);
    _tile_stored(6, out, 64);
  }
}

}  // namespace rc::amx
