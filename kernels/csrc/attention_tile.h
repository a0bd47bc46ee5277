// One block of query rows against one block of keys: scores, the online-softmax update and
// the weighted sum of values, with the running (max, sum, output) kept per row in fp32.
//
// The block's keys arrive transposed (one vector per head dimension, one lane per key), so a
// row's scores come out of broadcast FMAs as vectors over keys: no horizontal sum per key, and
// the softmax runs on full vectors whatever the number of rows. Both products (Q K^T and P V)
// are register tiles of a few rows by a few vectors, each loaded vector used by every row.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "vec.h"

namespace rc {

constexpr int KEY_BLOCK = 32;
constexpr int KEY_VECTORS = KEY_BLOCK / W;
// accumulators a register tile holds, leaving registers for the operands it loads
constexpr int TILE_ACCUMULATORS = Vec::REGISTERS * 3 / 4;
constexpr int PV_VECTORS = 4;  // head-dim vectors of one P V tile, at most

// What one block needs: NR query rows, row-major, and their running state.
struct TileRows {
  // [NR][steps]: fp32 rows already scaled, or (PAIRS: bfloat16 dot products) the bf16 rows
  // unscaled, two values to a float slot; their scores are scaled after the dot
  const float* q;
  float scale;
  float* acc;  // unnormalised output [NR][head_dim]
  float* max;  // [W], rows past NR padding
  float* sum;  // [W]
  const float* limit;  // [NR]: row r sees keys < limit[r]
};

// nk keys from position `first`: K transposed, [steps][KEY_BLOCK] (steps: head_dim, or head_dim
// / 2 when PAIRS: each 32-bit lane holds two neighbouring bf16 dimensions), lanes past nk
// unused; V rows (fp32, or bf16 as uint16_t) at v[j].
template <class T>
struct KeyBlock {
  const float* kt;
  int steps;
  const T* const* v;
  int nk;
  int first;
  int head_dim;
  float* p;  // [NR][KEY_BLOCK]: scores, then probabilities
  // rows (byte addresses) of a later block, fetched while this one computes so the scattered
  // rows of a paged cache arrive before they are needed
  const char* const* next;
  int next_n;
  int row_bytes;
};

inline void prefetch_row(const char* row, int bytes) {
  // into L2 (a block ahead would not fit L1 beside the block being read)
  for (int line = 0; line < bytes; line += 64) __builtin_prefetch(row + line, 0, 2);
}

inline F load_row(const float* p) { return Vec::load(p); }
inline F load_row(const uint16_t* p) { return Vec::load_bf16(p); }

// fn.template operator()<BEGIN, N>() for consecutive pieces of [0, END) of at most MAX rows:
// a compile-time row count cut into register tiles.
template <int END, int MAX, int BEGIN = 0, class Fn>
inline void row_pieces(Fn&& fn) {
  if constexpr (BEGIN < END) {
    constexpr int N = std::min(MAX, END - BEGIN);
    fn.template operator()<BEGIN, N>();
    row_pieces<END, MAX, BEGIN + N>(fn);
  }
}

// fn.template operator()<N>() for a run-time n in 1..MAX
template <int MAX, class Fn>
inline void with_count(int n, Fn&& fn) {
  if constexpr (MAX > 0) {
    if (n == MAX) return fn.template operator()<MAX>();
    with_count<MAX - 1>(n, fn);
  }
}

// Scores of R rows against the block's keys, to p (row stride KEY_BLOCK); the rows next[0,
// next_n) fetched a few per step, spread over the work.
template <int R, bool PAIRS, class T>
inline void score_rows(const float* q, const KeyBlock<T>& keys, int next_n, float* p) {
  const int steps = keys.steps, per_step = (next_n + steps - 1) / steps;
  const float* kt = keys.kt;
  F s[R][KEY_VECTORS];
  for (auto& row : s)
    for (F& x : row) x = Vec::zero();
  for (int i = 0; i < steps; ++i) {
    for (int x = i * per_step; x < std::min(next_n, (i + 1) * per_step); ++x) prefetch_row(keys.next[x], keys.row_bytes);
    F k[KEY_VECTORS];
    for (int n = 0; n < KEY_VECTORS; ++n) k[n] = Vec::load(kt + i * KEY_BLOCK + n * W);
    for (int r = 0; r < R; ++r) {
      const F a = Vec::set1(q[r * steps + i]);
      for (int n = 0; n < KEY_VECTORS; ++n) {
        if constexpr (PAIRS)
          s[r][n] = Vec::dot_bf16(s[r][n], a, k[n]);
        else
          s[r][n] = Vec::fma(a, k[n], s[r][n]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < KEY_VECTORS; ++n) Vec::store(p + r * KEY_BLOCK + n * W, s[r][n]);
}

constexpr std::array<float, KEY_BLOCK> key_offsets() {
  std::array<float, KEY_BLOCK> out{};
  for (int j = 0; j < KEY_BLOCK; ++j) out[j] = float(j);
  return out;
}

// Each row's scores in p become e**(score - its new max), keys it does not see (causal, or
// past the block) 0; its max and sum take the block in, and alpha[r] is what its output so
// far is worth against the new max. The per-row state is updated W rows at once.
template <int NR, bool PAIRS, class T>
inline void softmax_rows(const TileRows& rows, const KeyBlock<T>& keys, float* alpha) {
  static constexpr std::array<float, KEY_BLOCK> offsets = key_offsets();
  float top[W], base[W], total[W];
  for (int r = 0; r < NR; ++r) {
    float* p = keys.p + r * KEY_BLOCK;
    const F visible = Vec::set1(std::min(rows.limit[r] - float(keys.first), float(keys.nk)));
    F m = Vec::set1(NEG_INF);
    for (int n = 0; n < KEY_VECTORS; ++n) {
      F s = Vec::load(p + n * W);
      if constexpr (PAIRS) s = Vec::mul(s, Vec::set1(rows.scale));
      s = Vec::select_gt(visible, Vec::load(offsets.data() + n * W), s, Vec::set1(NEG_INF));
      Vec::store(p + n * W, s);
      m = Vec::max(m, s);
    }
    top[r] = Vec::hmax(m);
  }
  std::fill(top + NR, top + W, NEG_INF);
  const F old_max = Vec::load(rows.max);
  const F new_max = Vec::max(old_max, Vec::load(top));
  // a row that has seen no visible key yet keeps max -inf; measure it from 0 (no NaN)
  const F from = Vec::select_gt(new_max, Vec::set1(NEG_INF), new_max, Vec::zero());
  Vec::store(base, from);
  Vec::store(alpha, exp(Vec::sub(old_max, from)));
  for (int r = 0; r < NR; ++r) {
    float* p = keys.p + r * KEY_BLOCK;
    F sum = Vec::zero();
    for (int n = 0; n < KEY_VECTORS; ++n) {
      const F e = exp(Vec::sub(Vec::load(p + n * W), Vec::set1(base[r])));
      Vec::store(p + n * W, e);
      sum = Vec::add(sum, e);
    }
    total[r] = Vec::hsum(sum);
  }
  std::fill(total + NR, total + W, 0.0f);
  Vec::store(rows.max, new_max);
  Vec::store(rows.sum, Vec::fma(Vec::load(rows.sum), Vec::load(alpha), Vec::load(total)));
}

// acc[r][c0, c0 + N W) of R rows: scaled by alpha[r], plus the block's probabilities times V.
template <int R, int N, class T>
inline void accumulate_rows(const float* p, const float* alpha, const T* const* v, int nk, int c0, float* acc, int d) {
  F o[R][N];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < N; ++n) o[r][n] = Vec::mul(Vec::load(acc + r * d + c0 + n * W), Vec::set1(alpha[r]));
  for (int j = 0; j < nk; ++j) {
    F x[N];
    for (int n = 0; n < N; ++n) x[n] = load_row(v[j] + c0 + n * W);
    for (int r = 0; r < R; ++r) {
      const F a = Vec::set1(p[r * KEY_BLOCK + j]);
      for (int n = 0; n < N; ++n) o[r][n] = Vec::fma(a, x[n], o[r][n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < N; ++n) Vec::store(acc + r * d + c0 + n * W, o[r][n]);
}

template <int NR, bool PAIRS, class T>
inline void attend_tile(const TileRows& rows, const KeyBlock<T>& keys) {
  row_pieces<NR, std::max(1, TILE_ACCUMULATORS / KEY_VECTORS)>([&]<int R0, int R>() {
    score_rows<R, PAIRS>(rows.q + R0 * keys.steps, keys, R0 == 0 ? keys.next_n : 0, keys.p + R0 * KEY_BLOCK);
  });
  float alpha[W];
  softmax_rows<NR, PAIRS>(rows, keys, alpha);
  // as few row pieces as fit the registers, so each V vector is loaded (and widened) once
  constexpr int N = std::clamp(TILE_ACCUMULATORS / NR, 2, PV_VECTORS);
  const int d = keys.head_dim;
  for (int c0 = 0; c0 < d; c0 += N * W) {
    with_count<N>(std::min(N, (d - c0) / W), [&]<int n>() {
      row_pieces<NR, std::max(1, TILE_ACCUMULATORS / n)>([&]<int R0, int R>() {
        accumulate_rows<R, n>(keys.p + R0 * KEY_BLOCK, alpha + R0, keys.v, keys.nk, c0, rows.acc + R0 * d, d);
      });
    });
  }
}

// attend_tile for a run-time row count 1..W
template <bool PAIRS, class T, int N = 1>
inline void attend_rows(int nr, const TileRows& rows, const KeyBlock<T>& keys) {
  if constexpr (N <= W) {
    if (nr != N) return attend_rows<PAIRS, T, N + 1>(nr, rows, keys);
    attend_tile<N, PAIRS>(rows, keys);
  }
}

}  // namespace rc
