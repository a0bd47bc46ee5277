// A linear layer's product with one row (the decode step of a single request, its LM head):
// bound by reading the weight once, which BLAS gemv does here at half the memory bandwidth.
// Threads split the weight's rows; each streams ROWS rows at a time against x, in fp32.
#include "kernels.h"
#include "vec.h"

namespace rc {
namespace {

constexpr int64_t ROWS = 4;  // weight rows per pass: four streams, each x chunk loaded once for them
// below this many weight elements a fork-join costs more than it saves
constexpr int64_t PARALLEL_MIN = 1 << 15;

template <class T, int R>
void dot_rows(const rc_matvec_args& a, int64_t first) {
  const int64_t k = a.k, body = k / W * W;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight) + first * k;
  F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec::zero();
  for (int64_t c = 0; c < body; c += W) {
    const F xc = load_row(x + c);
    for (int r = 0; r < R; ++r) acc[r] = Vec::fma(load_row(w + r * k + c), xc, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float sum = Vec::hsum(acc[r]);
    for (int64_t c = body; c < k; ++c) sum += to_float(x[c]) * to_float(w[r * k + c]);
    store1(a.out, first + r, sum, a.dtype);
  }
}

template <class T>
void matvec_as(const rc_matvec_args& a) {
  const int64_t passes = a.n / ROWS;
#pragma omp parallel for schedule(static) if (a.n * a.k >= PARALLEL_MIN)
  for (int64_t p = 0; p < passes; ++p) dot_rows<T, ROWS>(a, p * ROWS);
  for (int64_t row = passes * ROWS; row < a.n; ++row) dot_rows<T, 1>(a, row);
}

}  // namespace

void matvec(const rc_matvec_args* args) {
  if (args->dtype == RC_BFLOAT16)
    matvec_as<uint16_t>(*args);
  else
    matvec_as<float>(*args);
}

}  // namespace rc
