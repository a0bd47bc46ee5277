// One block of query rows against one block of keys: scores, the online-softmax update and
// the weighted sum of values, with the running (max, sum, output) kept per row in fp32.
//
// Scores are held transposed, one lane per query row: a block of NR rows takes S lanes (NR
// rounded up to a power of two), so one vector holds the scores of W / S keys and the row
// maxima, exponentials and sums of a whole block are plain vector operations. A few rows (a
// decode's GQA group) thus share one exponential among several keys, not one per key.
#pragma once

#include <algorithm>
#include <array>
#include <type_traits>

#include "vec.h"

namespace rc {

constexpr int KEY_BLOCK = 32;

// Query rows and their outputs are stored in blocks of W rows, chunk-major within a block
// ([head_dim / W][W rows][W lanes]), so one base pointer reaches every row's chunk c.
inline int64_t blocked(int row, int c, int head_dim) { return int64_t(row / W) * W * head_dim + int64_t(c) * W + (row % W) * W; }

// What one block needs: NR query rows (blocked, already scaled), their running state, and nk
// keys whose K and V rows (fp32, or bf16 as uint16_t) are at k[j] and v[j].
struct TileRows {
  const float* q;
  // with bfloat16 dot products: the rows unscaled in bf16, in blocks of W rows, each
  // [head_dim / 32][W rows][32]; their scores are scaled after the dot
  const uint16_t* q_bf16;
  float scale;
  float* acc;  // unnormalised output, blocked like q
  float* max;  // [W]
  float* sum;  // [W]
  const float* limit;  // [W]: row r sees keys < limit[r] (0 for padding lanes)
};

template <class T>
struct KeyBlock {
  const T* const* k;
  const T* const* v;
  int nk;
  int first;  // position of key 0
  int head_dim;
  float* scratch;  // [KEY_BLOCK, W]: the scores, [key][S]
  // the next block's K and V rows (byte addresses), fetched while this one computes so the
  // scattered rows of a paged cache arrive before they are needed
  const char* const* next_k;
  const char* const* next_v;
  int next_n;
  int row_bytes;
};

// always inlined, as its caller score_keys is: GCC 12 dropped the prefetches of an inline
// function called from an always-inline one
RC_INLINE void prefetch_row(const char* row, int bytes) {
  // into L2 (a block ahead would not fit L1 beside the block being read)
  for (int line = 0; line < bytes; line += 64) __builtin_prefetch(row + line, 0, 2);
}

// Lanes per key for NR rows, and so W / lanes_per_key(NR) keys a vector.
constexpr int lanes_per_key(int nr) {
  int s = 1;
  while (s < nr) s *= 2;
  return s;
}

// acc[r] = alpha[r] * acc[r] + sum over the block's keys j of p[j][r] * V[j] (p's row j: S
// lanes), for CG chunks of W dimensions from c on. PAIRS: bf16 dot products over two keys at a
// time, the weights of keys 2i and 2i + 1 packed in p's row i (store_pairs); an odd last key is
// paired with zeros.
template <int NR, int CG, bool PAIRS, class T, int S = lanes_per_key(NR)>
inline void weigh_values(const TileRows& rows, const KeyBlock<T>& keys, const float* alpha, int c) {
  F o[CG][NR];
  float* ac = rows.acc + c * W;
  for (int g = 0; g < CG; ++g)
    for (int r = 0; r < NR; ++r) o[g][r] = Vec::mul(Vec::load(ac + (g * W + r) * W), Vec::set1(alpha[r]));
  const float* pw = keys.scratch;
  if constexpr (PAIRS) {
    static constexpr uint16_t zeros[W] = {};
    const int32_t* pairs = reinterpret_cast<const int32_t*>(pw);
    for (int j = 0; j < keys.nk; j += 2)
      for (int g = 0; g < CG; ++g) {
        const T* second = j + 1 < keys.nk ? keys.v[j + 1] + c + g * W : zeros;
        Vec::dot_pairs<NR>(o[g], keys.v[j] + c + g * W, second, pairs + j / 2 * S);
      }
  } else {
    for (int j = 0; j < keys.nk; ++j) {
      F weight[NR];
      for (int r = 0; r < NR; ++r) weight[r] = Vec::set1(pw[j * S + r]);
      for (int g = 0; g < CG; ++g) {
        const F vc = load_row(keys.v[j] + c + g * W);
        for (int r = 0; r < NR; ++r) o[g][r] = Vec::fma(weight[r], vc, o[g][r]);
      }
    }
  }
  for (int g = 0; g < CG; ++g)
    for (int r = 0; r < NR; ++r) Vec::store(ac + (g * W + r) * W, o[g][r]);
}

// Lane permutations of the S-lane layout: SPREAD[i] = i % S (row r's value in every key's
// lane r), SWAP[i] = i ^ d (the lanes d apart, to fold the keys of a vector into each row).
template <int S>
inline constexpr auto SPREAD = [] {
  std::array<int32_t, W> order{};
  for (int i = 0; i < W; ++i) order[i] = i % S;
  return order;
}();
template <int D>
inline constexpr auto SWAP = [] {
  std::array<int32_t, W> order{};
  for (int i = 0; i < W; ++i) order[i] = i ^ D;
  return order;
}();
// lane i = i / S: which of the vector's keys lane i scores
template <int S>
inline constexpr auto KEY_OF_LANE = [] {
  std::array<float, W> key{};
  for (int i = 0; i < W; ++i) key[i] = float(i / S);
  return key;
}();

// Every lane's value combined by ``op`` (max, add) with those of the other keys' lanes of its row.
template <int S, int D = S, class Op>
RC_INLINE F fold(F a, Op op) {
  if constexpr (D >= W) return a;
  else return fold<S, D * 2>(op(a, Vec::permute(a, SWAP<D>.data())), op);
}

// row r's value (lane r of a) in lane r of every key
template <int S>
RC_INLINE F spread(F a) {
  if constexpr (S == W) return a;
  else return Vec::permute(a, SPREAD<S>.data());
}

// The scores of keys j .. j + W / S - 1 (one vector, lane k S + r: key j + k, row r), scaled and
// masked to -inf where the row does not see the key (MASKED) or the key is past the block (TAIL).
template <int NR, bool MASKED, bool TAIL, class T, int S = lanes_per_key(NR)>
RC_INLINE F score_keys(const TileRows& rows, const KeyBlock<T>& keys, int j, F limit) {
  constexpr int KEYS = W / S;
  const int d = keys.head_dim;
  // past the block's end the last key is scored again; those lanes are masked
  const T* k[KEYS];
  for (int i = 0; i < KEYS; ++i) k[i] = keys.k[TAIL ? std::min(j + i, keys.nk - 1) : j + i];
  F dot[KEYS][NR];
  for (int i = 0; i < KEYS; ++i)
    for (int r = 0; r < NR; ++r) dot[i][r] = Vec::zero();
  if constexpr (std::is_same_v<T, uint16_t> && Vec::BF16_DOT) {
    for (int c = 0; c < d; c += 32) {
      const uint16_t* qc = rows.q_bf16 + c * W;
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < KEYS; ++i) dot[i][r] = Vec::dot_bf16(dot[i][r], qc + r * 32, k[i] + c);
    }
  } else {
    for (int c = 0; c < d; c += W) {
      const float* qc = rows.q + c * W;
      for (int i = 0; i < KEYS; ++i) {
        const F kc = load_row(k[i] + c);
        for (int r = 0; r < NR; ++r) dot[i][r] = Vec::fma(Vec::load(qc + r * W), kc, dot[i][r]);
      }
    }
  }
  for (int i = 0; i < KEYS; ++i)
    if (j + i < keys.next_n) {
      prefetch_row(keys.next_k[j + i], keys.row_bytes);
      prefetch_row(keys.next_v[j + i], keys.row_bytes);
    }
  F lanes[W];
  for (int i = 0; i < KEYS; ++i)
    for (int r = 0; r < S; ++r) lanes[i * S + r] = r < NR ? dot[i][r] : Vec::zero();
  F s = Vec::hsum_rows<W>(lanes);
  if constexpr (std::is_same_v<T, uint16_t> && Vec::BF16_DOT) s = Vec::mul(s, Vec::set1(rows.scale));
  if constexpr (MASKED || TAIL) {
    const F key = Vec::load(KEY_OF_LANE<S>.data());
    if constexpr (MASKED) s = Vec::select_gt(limit, Vec::add(key, Vec::set1(float(keys.first + j))), s, Vec::set1(NEG_INF));
    if constexpr (TAIL) s = Vec::select_gt(Vec::set1(float(keys.nk - j)), key, s, Vec::set1(NEG_INF));
  }
  return s;
}

// MASKED: some row does not see every key of the block (causal), so scores are masked.
template <int NR, bool MASKED, class T>
inline void attend_tile(const TileRows& rows, const KeyBlock<T>& keys) {
  constexpr int S = lanes_per_key(NR), KEYS = W / S;
  const int d = keys.head_dim;
  F* p = reinterpret_cast<F*>(keys.scratch);
  const F limit = spread<S>(Vec::load(rows.limit));
  F block_max = Vec::set1(NEG_INF);
  const int full = keys.nk / KEYS, vectors = (keys.nk + KEYS - 1) / KEYS;
  for (int m = 0; m < vectors; ++m) {
    const F s = m < full ? score_keys<NR, MASKED, false>(rows, keys, m * KEYS, limit)
                         : score_keys<NR, MASKED, true>(rows, keys, m * KEYS, limit);
    Vec::store(reinterpret_cast<float*>(p + m), s);
    block_max = Vec::max(block_max, s);
  }
  const F old_max = spread<S>(Vec::load(rows.max));
  const F new_max = Vec::max(old_max, fold<S>(block_max, Vec::max));
  // a row that has seen no visible key yet keeps max -inf; measure it from 0 (no NaN)
  const F base = Vec::select_gt(new_max, Vec::set1(NEG_INF), new_max, Vec::zero());
  const F alpha = exp(Vec::sub(old_max, base));
  F block_sum = Vec::zero();
  for (int m = 0; m < vectors; ++m) {
    F e = exp(Vec::sub(Vec::load(reinterpret_cast<float*>(p + m)), base));
    Vec::store(reinterpret_cast<float*>(p + m), e);
    block_sum = Vec::add(block_sum, e);
  }
  Vec::store(rows.max, new_max);
  Vec::store(rows.sum, Vec::fma(spread<S>(Vec::load(rows.sum)), alpha, fold<S>(block_sum, Vec::add)));
  float a[W];
  Vec::store(a, alpha);
  // bf16 rows with bf16 dot products: P V by them too, each weight rounded to bf16 first (as
  // FlashAttention rounds P); the pairs of two vectors overwrite the first after both are read
  constexpr bool PAIRS = std::is_same_v<T, uint16_t> && Vec::BF16_DOT;
  if constexpr (PAIRS)
    for (int m = 0; m < vectors; m += 2)
      Vec::store_pairs<S>(reinterpret_cast<int32_t*>(keys.scratch) + m / 2 * W, Vec::load(keys.scratch + m * W),
                          m + 1 < vectors ? Vec::load(keys.scratch + (m + 1) * W) : Vec::zero());
  // P V in groups of CG head_dim chunks: CG * NR independent sums, enough to hide the FMA's
  // latency (one chunk at a time left NR chains of nk dependent FMAs)
  constexpr int CG = NR <= 3 ? 4 : NR <= 6 ? 2 : 1;
  int c = 0;
  for (; c + CG * W <= d; c += CG * W) weigh_values<NR, CG, PAIRS>(rows, keys, a, c);
  for (; c < d; c += W) weigh_values<NR, 1, PAIRS>(rows, keys, a, c);
}

// attend_tile for a run-time row count 1..W
template <class T, int N = 1>
inline void attend_rows(int nr, bool masked, const TileRows& rows, const KeyBlock<T>& keys) {
  if constexpr (N <= W) {
    if (nr != N) return attend_rows<T, N + 1>(nr, masked, rows, keys);
    if (masked) return attend_tile<N, true>(rows, keys);
    attend_tile<N, false>(rows, keys);
  }
}

}  // namespace rc
