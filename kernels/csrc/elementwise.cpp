// The fused elementwise ops of a decoder layer: RMSNorm (+ the residual add), rotary embedding
// with the K/V store, SiLU·mul. Each rounds where the torch reference rounds (after every
// operation in the activation dtype), so fp32 results stay those of the reference.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "fp8.h"
#include "kernels.h"

namespace rc {
namespace {

// below this many elements a fork-join costs more than it saves: for the copies of the K/V
// store, and for RoPE, the norms and SiLU, whose elements cost more (a decode step's 32 x 1,536
// SiLU took 18 us in fp32 and 35 us in bf16 on one thread, its 32 x 576 norm 5 and 12 us)
constexpr int64_t PARALLEL_MIN = 1 << 16;
constexpr int64_t ARITHMETIC_PARALLEL_MIN = 1 << 13;

F keep(F x, rc_dtype dtype) { return dtype == RC_BFLOAT16 ? Vec::round_bf16(x) : x; }
float keep(float x, rc_dtype dtype) { return dtype == RC_BFLOAT16 ? round_bf16(x) : x; }

// n values of a token's K or V into its cache row: copied, or converted to the cache's fp8 format
// (n is kv_heads * head_dim, a multiple of W)
void put_row(void* cache, int64_t cache_at, rc_dtype cache_dtype, const void* src, int64_t src_at, int64_t n,
             rc_dtype dtype) {
  if (cache_dtype == dtype) {
    const int64_t size = dtype_size(dtype);
    std::memcpy(static_cast<char*>(cache) + cache_at * size, static_cast<const char*>(src) + src_at * size, n * size);
    return;
  }
  for (int64_t c = 0; c < n; c += W) store_cache(cache, cache_at + c, load(src, src_at + c, dtype), cache_dtype);
}

// x1 * cos - x2 * sin and x2 * cos + x1 * sin, each product and sum rounded as torch does
void rotate(void* x, int64_t at, const void* cos, const void* sin, int64_t cs_at, int half, rc_dtype dtype) {
  int c = 0;
  for (; c + W <= half; c += W) {
    const F x1 = load(x, at + c, dtype), x2 = load(x, at + half + c, dtype);
    const F co = load(cos, cs_at + c, dtype), si = load(sin, cs_at + c, dtype);
    const F lo = Vec::sub(keep(Vec::mul(x1, co), dtype), keep(Vec::mul(x2, si), dtype));
    const F hi = Vec::add(keep(Vec::mul(x2, co), dtype), keep(Vec::mul(x1, si), dtype));
    store(x, at + c, lo, dtype);
    store(x, at + half + c, hi, dtype);
  }
  for (; c < half; ++c) {
    const float x1 = load1(x, at + c, dtype), x2 = load1(x, at + half + c, dtype);
    const float co = load1(cos, cs_at + c, dtype), si = load1(sin, cs_at + c, dtype);
    store1(x, at + c, keep(x1 * co, dtype) - keep(x2 * si, dtype), dtype);
    store1(x, at + half + c, keep(x2 * co, dtype) + keep(x1 * si, dtype), dtype);
  }
}

}  // namespace

void store_kv(const rc_store_args* args) {
  const rc_store_args& a = *args;
#pragma omp parallel for if (a.tokens * a.row >= PARALLEL_MIN) schedule(static)
  for (int64_t t = 0; t < a.tokens; ++t) {
    put_row(a.k_cache, a.slots[t] * a.row, a.cache_dtype, a.k, t * a.k_stride, a.row, a.dtype);
    put_row(a.v_cache, a.slots[t] * a.row, a.cache_dtype, a.v, t * a.v_stride, a.row, a.dtype);
  }
}

void rope_store_kv(const rc_rope_args* args) {
  const rc_rope_args& a = *args;
  const int d = a.head_dim, half = d / 2;
  const int64_t kv_row = int64_t(a.num_kv_heads) * d;
  const int64_t k_at = int64_t(a.num_heads) * d, v_at = k_at + kv_row;
#pragma omp parallel for if (a.tokens * (k_at + 2 * kv_row) >= ARITHMETIC_PARALLEL_MIN) schedule(static)
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t row = t * a.qkv_stride;
    for (int h = 0; h < a.num_heads + a.num_kv_heads; ++h) rotate(a.qkv, row + h * d, a.cos, a.sin, t * half, half, a.dtype);
    put_row(a.k_cache, a.slots[t] * kv_row, a.cache_dtype, a.qkv, row + k_at, kv_row, a.dtype);
    put_row(a.v_cache, a.slots[t] * kv_row, a.cache_dtype, a.qkv, row + v_at, kv_row, a.dtype);
  }
}

void rms_norm(const rc_norm_args* args) {
  const rc_norm_args& a = *args;
  const int64_t n = a.hidden, body = n / W * W;
#pragma omp parallel for if (a.rows * n >= ARITHMETIC_PARALLEL_MIN) schedule(static)
  for (int64_t row = 0; row < a.rows; ++row) {
    // the stream to normalise: x, or residual += x (rounded to the activation dtype)
    const void* src = a.x;
    int64_t at = row * a.x_stride;
    F squares = Vec::zero();
    float tail = 0.0f;
    if (a.residual != nullptr) {
      const int64_t r = row * n;
      for (int64_t c = 0; c < body; c += W) {
        const F s = keep(Vec::add(load(a.x, at + c, a.dtype), load(a.residual, r + c, a.dtype)), a.dtype);
        store(a.residual, r + c, s, a.dtype);
        squares = Vec::fma(s, s, squares);
      }
      for (int64_t c = body; c < n; ++c) {
        const float s = keep(load1(a.x, at + c, a.dtype) + load1(a.residual, r + c, a.dtype), a.dtype);
        store1(a.residual, r + c, s, a.dtype);
        tail += s * s;
      }
      src = a.residual;
      at = r;
    } else {
      for (int64_t c = 0; c < body; c += W) {
        const F s = load(a.x, at + c, a.dtype);
        squares = Vec::fma(s, s, squares);
      }
      for (int64_t c = body; c < n; ++c) tail += load1(a.x, at + c, a.dtype) * load1(a.x, at + c, a.dtype);
    }
    // normalised in fp32, rounded to the activation dtype, then scaled by the weight
    const float inv = 1.0f / std::sqrt((Vec::hsum(squares) + tail) / float(n) + a.eps);
    const int64_t out = row * n;
    for (int64_t c = 0; c < body; c += W) {
      const F y = keep(Vec::mul(load(src, at + c, a.dtype), Vec::set1(inv)), a.dtype);
      store(a.out, out + c, Vec::mul(load(a.weight, c, a.dtype), y), a.dtype);
    }
    for (int64_t c = body; c < n; ++c)
      store1(a.out, out + c, load1(a.weight, c, a.dtype) * keep(load1(src, at + c, a.dtype) * inv, a.dtype), a.dtype);
  }
}

void silu_and_mul(const rc_act_args* args) {
  const rc_act_args& a = *args;
  const int64_t n = a.width, body = n / W * W;
  const F one = Vec::set1(1.0f);
#pragma omp parallel for if (a.rows * n >= ARITHMETIC_PARALLEL_MIN) schedule(static)
  for (int64_t row = 0; row < a.rows; ++row) {
    const int64_t at = row * a.x_stride, out = row * n;
    for (int64_t c = 0; c < body; c += W) {
      const F g = load(a.x, at + c, a.dtype);
      const F silu = keep(Vec::div(g, Vec::add(one, exp(Vec::sub(Vec::zero(), g)))), a.dtype);
      store(a.out, out + c, Vec::mul(silu, load(a.x, at + n + c, a.dtype)), a.dtype);
    }
    for (int64_t c = body; c < n; ++c) {
      const float g = load1(a.x, at + c, a.dtype);
      store1(a.out, out + c, keep(g / (1.0f + std::exp(-g)), a.dtype) * load1(a.x, at + n + c, a.dtype), a.dtype);
    }
  }
}

}  // namespace rc
