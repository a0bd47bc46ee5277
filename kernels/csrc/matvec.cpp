// A linear layer's product with the rows of a step, on the weight in the blocked layout
// [n / W, k, W] (W output features side by side for every input feature: one sequential
// stream per block, as oneDNN packs it; with bf16 dot products a bf16 block holds its input
// features in pairs, [k / 2, W, 2], an odd last one after them). Threads split the blocks;
// each takes NB blocks at a time and runs them against the input rows in groups of up to
// XROWS: NB weight vectors times one broadcast input value feed NB x XROWS sums in registers,
// with no horizontal sums.
// On the AVX-512 EPYC (SmolLM2's linear work, 2 threads) it read the weights at 1.3-1.6x the
// speed of the row-major product at 1-32 rows and matched oneDNN's packed product at 64-2,048.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "vec.h"
#if defined(RC_ISA_AMX)
#include "amx.h"
#endif

namespace rc {
namespace {

// blocks per pass, and input rows per group: NB x XROWS accumulators, NB weight vectors and one
// broadcast within AVX-512's thirty-two registers (3 x 8) or AVX2's sixteen (2 x 5: on the AVX-512
// EPYC, AVX2 code, 3 x 4 and 2 x 6 spilled and ran 1.3-1.8x slower than 2 x 5 from 16 rows)
constexpr int NB = W == 16 ? 3 : 2;
constexpr int XROWS = W == 16 ? 8 : 5;
// below this many weight elements a fork-join costs more than it saves
constexpr int64_t PARALLEL_MIN = 1 << 15;
// how far ahead of the first group (in elements of the stream) the next weight values are fetched
constexpr int64_t PREFETCH = 32 * W;

// out[m][(block0 + j) * W + lane] for j < B, m in [m0, m0 + M)
template <class T, int B, int M>
void block_tile(const rc_matvec_args& a, int64_t block0, int64_t m0) {
  const int64_t k = a.k;
  const T* x = static_cast<const T*>(a.x) + m0 * k;
  const T* w = static_cast<const T*>(a.weight) + block0 * W * k;
  F acc[B][M];
  for (int j = 0; j < B; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = Vec::zero();
  // the first group streams the weight from memory; the later ones find it in the caches
  const bool fetch = m0 == 0;
  int64_t c = 0;
  if constexpr (std::is_same_v<T, uint16_t> && Vec::BF16_DOT) {
    // bf16 weights in pairs of input features (block_weight): one dot product takes two
    for (; c + 2 <= k; c += 2) {
      if (fetch)
        for (int j = 0; j < B; ++j) __builtin_prefetch(w + j * W * k + c * W + PREFETCH, 0, 3);
      for (int m = 0; m < M; ++m)
        for (int j = 0; j < B; ++j) acc[j][m] = Vec::dot_bf16_pair(acc[j][m], w + j * W * k + c * W, x + m * k + c);
    }
  }
  for (; c < k; ++c) {
    if (fetch)
      for (int j = 0; j < B; ++j) __builtin_prefetch(w + j * W * k + c * W + PREFETCH, 0, 3);
    F wc[B];
    for (int j = 0; j < B; ++j) wc[j] = load_row(w + j * W * k + c * W);
    for (int m = 0; m < M; ++m) {
      const F xm = Vec::set1(to_float(x[m * k + c]));
      for (int j = 0; j < B; ++j) acc[j][m] = Vec::fma(wc[j], xm, acc[j][m]);
    }
  }
  for (int j = 0; j < B; ++j)
    for (int m = 0; m < M; ++m) store(a.out, (m0 + m) * a.n + (block0 + j) * W, acc[j][m], a.dtype);
}

// block_tile for a run-time group size 1..XROWS
template <class T, int B, int M = 1>
void tile_rows(const rc_matvec_args& a, int64_t block0, int64_t m0, int64_t rows) {
  if constexpr (M <= XROWS) {
    if (rows != M) return tile_rows<T, B, M + 1>(a, block0, m0, rows);
    block_tile<T, B, M>(a, block0, m0);
  }
}

template <class T, int B>
void all_rows(const rc_matvec_args& a, int64_t block0) {
  for (int64_t m0 = 0; m0 < a.m; m0 += XROWS) tile_rows<T, B>(a, block0, m0, std::min<int64_t>(XROWS, a.m - m0));
}

template <class T>
void matvec_as(const rc_matvec_args& a) {
  const int64_t blocks = a.n / W, passes = blocks / NB;
#pragma omp parallel for schedule(static) if (a.m * a.n * a.k >= PARALLEL_MIN)
  for (int64_t p = 0; p < passes; ++p) all_rows<T, NB>(a, p * NB);
  for (int64_t block = passes * NB; block < blocks; ++block) all_rows<T, 1>(a, block);
}

#if defined(RC_ISA_AMX)
// bf16 rows on AMX tiles, on the same blocked weight: 32 input features of a block, [16 pairs][16
// outputs][2] as they lie, are the B operand of a tile product. A pass takes 16 rows (one tile,
// zero-padded) against three blocks, or 32 rows (two tiles) against two: sums in tmm0-2 (block j)
// or tmm0-3 (block j, rows g: 2 j + g), the rows in tmm3 (tmm4, tmm5), the blocks' weights after.
// On the AMX Xeon (SmolLM2's linear work, 2 threads, benchmarks/bench_few_rows.py) one row tile
// and three weight streams took 11.8-12.0 ms at 8-16 rows, two row tiles and two streams 14.2-14.6
// (and at 32 rows 14.4 ms, where two passes of 16 rows took 15.3).
// From this many rows on tiles are as fast as the bf16 dot products or faster: 11.6 ms against
// 11.6-11.8 at 4 rows, 11.8 against 14.0 at 8, 14.4 against 43.7 at 32; at 1 row 11.6 against
// 10.7-11.7.
constexpr int64_t AMX_MIN_ROWS = 4;

// out rows [row0, row0 + 16) of block `block` from a tile's sums
void emit_tile(const rc_matvec_args& a, const float* sums, int64_t row0, int64_t block) {
  for (int64_t r = 0; r < 16 && row0 + r < a.m; ++r)
    store(a.out, (row0 + r) * a.n + block * W, Vec::load(sums + r * W), RC_BFLOAT16);
}

// ROWS rows from x (padded) against the blocks from `block` on: three blocks for 16 rows, two for 32
template <int ROWS>
void tile_pass(const rc_matvec_args& a, const uint16_t* x, int64_t row0, int64_t block, float* sums) {
  const int64_t k = a.k;
  const uint16_t* w = static_cast<const uint16_t*>(a.weight) + block * W * k;
  if constexpr (ROWS == 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    for (int64_t c = 0; c < k; c += 32) {
      _tile_loadd(3, x + c, k * 2);
      _tile_loadd(4, w + c * W, 64);
      _tile_loadd(5, w + W * k + c * W, 64);
      _tile_loadd(6, w + 2 * W * k + c * W, 64);
      _tile_dpbf16ps(0, 3, 4);
      _tile_dpbf16ps(1, 3, 5);
      _tile_dpbf16ps(2, 3, 6);
    }
    _tile_stored(0, sums, 64);
    emit_tile(a, sums, row0, block);
    _tile_stored(1, sums, 64);
    emit_tile(a, sums, row0, block + 1);
    _tile_stored(2, sums, 64);
    emit_tile(a, sums, row0, block + 2);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < k; c += 32) {
      _tile_loadd(4, x + c, k * 2);
      _tile_loadd(5, x + 16 * k + c, k * 2);
      _tile_loadd(6, w + c * W, 64);
      _tile_loadd(7, w + W * k + c * W, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 5, 6);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, sums, 64);
    emit_tile(a, sums, row0, block);
    _tile_stored(1, sums, 64);
    emit_tile(a, sums, row0 + 16, block);
    _tile_stored(2, sums, 64);
    emit_tile(a, sums, row0, block + 1);
    _tile_stored(3, sums, 64);
    emit_tile(a, sums, row0 + 16, block + 1);
  }
}

template <int ROWS>
void matvec_amx(const rc_matvec_args& a) {
  constexpr int64_t BLOCKS = ROWS == 16 ? 3 : 2;
  const int64_t k = a.k, groups = (a.m + ROWS - 1) / ROWS, passes = a.n / W / BLOCKS;
  // the rows, padded with zeros to whole tiles, once for every thread
  thread_local std::vector<uint16_t> buffer;
  buffer.resize(size_t(groups * ROWS * k));
  std::copy_n(static_cast<const uint16_t*>(a.x), a.m * k, buffer.data());
  std::fill(buffer.begin() + a.m * k, buffer.end(), 0);
  const uint16_t* padded = buffer.data();  // the calling thread's buffer, read by every thread
#pragma omp parallel if (a.m * a.n * a.k >= PARALLEL_MIN)
  {
    amx::configure();
    alignas(64) float sums[16 * W];
#pragma omp for schedule(static)
    for (int64_t p = 0; p < passes * groups; ++p) {
      const int64_t group = p % groups;
      tile_pass<ROWS>(a, padded + group * ROWS * k, group * ROWS, p / groups * BLOCKS, sums);
    }
    _tile_release();
  }
  // the blocks left over from the passes
  for (int64_t block = passes * BLOCKS; block < a.n / W; ++block) all_rows<uint16_t, 1>(a, block);
}
#endif

}  // namespace

void matvec(const rc_matvec_args* args) {
#if defined(RC_ISA_AMX)
  if (args->dtype == RC_BFLOAT16 && args->k % 32 == 0 && args->m >= AMX_MIN_ROWS)
    return args->m <= 16 ? matvec_amx<16>(*args) : matvec_amx<32>(*args);
#endif
  if (args->dtype == RC_BFLOAT16)
    matvec_as<uint16_t>(*args);
  else
    matvec_as<float>(*args);
}

}  // namespace rc
