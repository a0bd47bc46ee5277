// A linear layer's product with a few rows (the decode step of a few requests, their LM head):
// bound by reading the weight once, which BLAS does here at a half to a third of the memory
// bandwidth. Threads split the weight's rows; each takes ROWS weight rows at a time and runs
// them against the input rows in groups of up to XROWS (ROWS x XROWS sums in registers, the
// weight rows re-read from L1 for each group after the first), in fp32.
#include <algorithm>

#include "kernels.h"
#include "vec.h"

namespace rc {
namespace {

// weight rows per pass, and input rows per group: ROWS x XROWS accumulators, XROWS input chunks and
// one weight chunk fill AVX2's sixteen registers (3 x 4) or AVX-512's thirty-two (4 x 6; on the
// AVX-512 EPYC 1.15-1.25x faster at one row than 3 x 4, level at 4-32 rows)
constexpr int ROWS = W == 16 ? 4 : 3;
constexpr int XROWS = W == 16 ? 6 : 4;
// below this many weight elements a fork-join costs more than it saves
constexpr int64_t PARALLEL_MIN = 1 << 15;

// out[m][first + r] for r < R and m in [m0, m0 + M)
template <class T, int R, int M>
void dot_block(const rc_matvec_args& a, int64_t first, int64_t m0) {
  const int64_t k = a.k, body = k / W * W;
  const T* x = static_cast<const T*>(a.x) + m0 * k;
  const T* w = static_cast<const T*>(a.weight) + first * k;
  F acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = Vec::zero();
  // the first group fetches the next pass's weight rows while it computes, so the later groups'
  // arithmetic overlaps the memory's latency too
  const bool fetch = m0 == 0;
  for (int64_t c = 0; c < body; c += W) {
    if (fetch)
      for (int r = 0; r < R; ++r) __builtin_prefetch(w + (R + r) * k + c, 0, 3);
    F xc[M];
    for (int m = 0; m < M; ++m) xc[m] = load_row(x + m * k + c);
    for (int r = 0; r < R; ++r) {
      const F wc = load_row(w + r * k + c);
      for (int m = 0; m < M; ++m) acc[r][m] = Vec::fma(wc, xc[m], acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float sum = Vec::hsum(acc[r][m]);
      for (int64_t c = body; c < k; ++c) sum += to_float(x[m * k + c]) * to_float(w[r * k + c]);
      store1(a.out, (m0 + m) * a.n + first + r, sum, a.dtype);
    }
}

// dot_block for a run-time group size 1..XROWS
template <class T, int R, int M = 1>
void dot_rows(const rc_matvec_args& a, int64_t first, int64_t m0, int64_t rows) {
  if constexpr (M <= XROWS) {
    if (rows != M) return dot_rows<T, R, M + 1>(a, first, m0, rows);
    dot_block<T, R, M>(a, first, m0);
  }
}

template <class T, int R>
void all_rows(const rc_matvec_args& a, int64_t first) {
  for (int64_t m0 = 0; m0 < a.m; m0 += XROWS) dot_rows<T, R>(a, first, m0, std::min<int64_t>(XROWS, a.m - m0));
}

template <class T>
void matvec_as(const rc_matvec_args& a) {
  const int64_t passes = a.n / ROWS;
#pragma omp parallel for schedule(static) if (a.m * a.n * a.k >= PARALLEL_MIN)
  for (int64_t p = 0; p < passes; ++p) all_rows<T, ROWS>(a, p * ROWS);
  for (int64_t row = passes * ROWS; row < a.n; ++row) all_rows<T, 1>(a, row);
}

}  // namespace

void matvec(const rc_matvec_args* args) {
  if (args->dtype == RC_BFLOAT16)
    matvec_as<uint16_t>(*args);
  else
    matvec_as<float>(*args);
}

}  // namespace rc
