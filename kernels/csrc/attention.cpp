// Paged attention over a planned step (plan.cpp): every task's query rows against its key
// range, K/V rows read in place through the page table; then the log-sum-exp merge of the
// tasks that share a query token (a shared prefix, a split context). Built once per ISA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention_tile.h"
#include "fp8.h"
#include "kernels.h"
#if defined(RC_ISA_AMX)
#include "attention_amx.h"
#endif

namespace rc {
namespace {

// Per-thread buffers, grown to the largest task seen and then reused: no allocation per step.
struct Scratch {
  std::vector<float> q;  // [rows, head_dim], scaled
  std::vector<uint16_t> q_bf16;  // [rows, head_dim], unscaled (bfloat16 dot products)
  std::vector<float> acc;  // [rows, head_dim]
  std::vector<float> state;  // max, sum, limit: [3, rows]
  std::vector<float> staged;  // fp32 K then V rows of one key block (bf16 or fp8 caches)
  std::vector<uint16_t> staged_bf16;  // bf16 K then V rows of one key block (fp8 caches)
  std::vector<float> scores;  // [KEY_BLOCK, W]
  std::vector<int64_t> offsets;  // element offsets of three key blocks (this one, the next two)
  std::vector<float> weights;  // one merged row's weight of each contribution
  std::vector<uint32_t> staged_k;  // a key block laid out for AMX tiles (attention_amx.h)
  std::vector<uint16_t> staged_v;
  std::vector<uint16_t> weights_bf16;  // [16][KEY_BLOCK]: a row block's softmax weights
};

#if defined(RC_ISA_AMX)
constexpr bool AMX = true;
#else
constexpr bool AMX = false;
#endif
// Fewer rows leave most of a 16-row tile product idle: on the AMX Xeon (one layer, 2 threads) a
// decode of 3 rows a task (one request's query heads of a KV head) ran 1.7x slower on tiles than
// on bf16 dot products, a shared prefix's 12 rows 1.4x faster, prefills 2.8-3.0x faster.
constexpr int AMX_MIN_ROWS = 8;

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <class T>
T* grown(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// where a key block's rows are staged in the element type T the tile reads
template <class T>
std::vector<T>& staged_rows(Scratch& s) {
  if constexpr (std::is_same_v<T, float>) return s.staged;
  else return s.staged_bf16;
}

int64_t cache_row(const rc_attention_args& a, int req, int pos) {
  const int32_t* table = a.page_table + int64_t(req) * a.page_table_stride;
  if (a.page_size == 1) return table[pos];
  return int64_t(table[pos / a.page_size]) * a.page_size + pos % a.page_size;
}

// Element offsets of keys [first, first + n) of one KV head in the caches.
void locate_keys(const rc_attention_args& a, int req, int first, int n, int kv_head, int64_t* out) {
  const int64_t row = int64_t(a.num_kv_heads) * a.head_dim, head = int64_t(kv_head) * a.head_dim;
  for (int j = 0; j < n; ++j) out[j] = cache_row(a, req, first + j) * row + head;
}

// Gathers the task's query rows (token by token, the KV head's query heads inside): scaled
// fp32, or (q_bf16 not null) the bf16 rows as they are.
int gather_queries(const rc_attention_args& a, const rc_task& task, int kv_head, float* q, uint16_t* q_bf16,
                   float* limit) {
  const int d = a.head_dim, group = a.num_heads / a.num_kv_heads;
  int r = 0;
  for (int si = task.seg_begin; si < task.seg_end; ++si) {
    const rc_segment& seg = a.segments[si];
    for (int i = seg.token_begin; i < seg.token_end; ++i) {
      const int64_t token = a.q_starts[seg.req] + i;
      const float visible = float(a.prefix_lens[seg.req] + i + 1);
      for (int j = 0; j < group; ++j, ++r) {
        const int64_t at = token * a.q_token_stride + int64_t(kv_head * group + j) * a.q_head_stride;
        if (q_bf16 != nullptr) {
          const uint16_t* src = static_cast<const uint16_t*>(a.q) + at;
          for (int c = 0; c < d; c += 32)
            std::memcpy(q_bf16 + int64_t(r / W) * W * d + int64_t(c) * W + (r % W) * 32, src + c, 64);
        } else {
          for (int c = 0; c < d; c += W)
            Vec::store(q + blocked(r, c, d), Vec::mul(load(a.q, at + c, a.dtype), Vec::set1(a.scale)));
        }
        limit[r] = visible;
      }
    }
  }
  return r;
}

void finish_task(const rc_attention_args& a, const rc_task& task, int kv_head, const float* acc, const float* max,
                 const float* sum) {
  const int d = a.head_dim, group = a.num_heads / a.num_kv_heads;
  int r = 0, token_index = 0;
  for (int si = task.seg_begin; si < task.seg_end; ++si) {
    const rc_segment& seg = a.segments[si];
    for (int i = seg.token_begin; i < seg.token_end; ++i, ++token_index) {
      const int64_t token = a.q_starts[seg.req] + i;
      for (int j = 0; j < group; ++j, ++r) {
        if (task.partial_row < 0) {
          const int64_t at = (token * a.num_heads + kv_head * group + j) * int64_t(d);
          const F total = Vec::set1(sum[r]);
          for (int c = 0; c < d; c += W) store(a.out, at + c, Vec::div(Vec::load(acc + blocked(r, c, d)), total), a.dtype);
        } else {
          const int64_t row = (int64_t(task.partial_row + token_index) * a.num_kv_heads + kv_head) * group + j;
          float* part = a.partials + row * (d + 2);
          for (int c = 0; c < d; c += W) Vec::store(part + c, Vec::load(acc + blocked(r, c, d)));
          part[d] = max[r];
          part[d + 1] = sum[r];
        }
      }
    }
  }
}

// Keys of the task in blocks, each block's rows located once (the next block's fetched
// while this one computes), then every block of W query rows against them. T is what the
// tile reads: the cache itself (float, or bf16 when a single row block would not repay a
// conversion), or a cache of another dtype (bf16 as fp32, fp8 as either) staged as T once
// for every row block.
template <class T>
void attend_keys(const rc_attention_args& a, const rc_task& task, int kv_head, const float* q, const uint16_t* q_bf16,
                 float* acc, float* max, float* sum, const float* limit, int rows, bool tiles) {
  const int d = a.head_dim;
  Scratch& s = scratch();
#if defined(RC_ISA_AMX)
  const amx::Staged tiled{grown(s.staged_k, amx::staged_k_size(d)), grown(s.staged_v, amx::staged_v_size(d))};
  uint16_t* weights = grown(s.weights_bf16, size_t(16) * KEY_BLOCK);
#endif
  float* scores = grown(s.scores, size_t(KEY_BLOCK) * W);
  int64_t* offsets = grown(s.offsets, size_t(3) * KEY_BLOCK);
  const bool stage = a.cache_dtype != (std::is_same_v<T, float> ? RC_FLOAT32 : RC_BFLOAT16);
  T* staged = stage ? grown(staged_rows<T>(s), size_t(2) * KEY_BLOCK * d) : nullptr;
  const T* k_rows[KEY_BLOCK];
  const T* v_rows[KEY_BLOCK];
  const char* next_k[KEY_BLOCK];
  const char* next_v[KEY_BLOCK];
  const int64_t size = dtype_size(a.cache_dtype);
  const char* k_bytes = static_cast<const char*>(a.k_cache);
  const char* v_bytes = static_cast<const char*>(a.v_cache);
  // blocks are located two ahead: block i + 2's rows are fetched while block i computes
  constexpr int AHEAD = 2;
  auto block_size = [&](int b) { return std::max(0, std::min(KEY_BLOCK, task.key_end - task.key_begin - b * KEY_BLOCK)); };
  for (int b = 0; b < AHEAD; ++b) {
    int64_t* at = offsets + b * KEY_BLOCK;
    locate_keys(a, task.key_req, task.key_begin + b * KEY_BLOCK, block_size(b), kv_head, at);
    for (int j = 0; j < block_size(b); ++j) {
      prefetch_row(k_bytes + at[j] * size, int(d * size));
      prefetch_row(v_bytes + at[j] * size, int(d * size));
    }
  }
  for (int first = task.key_begin, block = 0; first < task.key_end; first += KEY_BLOCK, ++block) {
    const int64_t* here = offsets + (block % (AHEAD + 1)) * KEY_BLOCK;
    int64_t* ahead = offsets + ((block + AHEAD) % (AHEAD + 1)) * KEY_BLOCK;
    const int nk = block_size(block);
    const int n = block_size(block + AHEAD);
    locate_keys(a, task.key_req, first + AHEAD * KEY_BLOCK, n, kv_head, ahead);
    for (int j = 0; j < n; ++j) {
      next_k[j] = k_bytes + ahead[j] * size;
      next_v[j] = v_bytes + ahead[j] * size;
    }
    for (int j = 0; j < nk; ++j) {
      if (stage) {
        T* k = staged + j * d;
        T* v = staged + (KEY_BLOCK + j) * d;
        for (int c = 0; c < d; c += W) {
          stage_cache(k + c, a.k_cache, here[j] + c, a.cache_dtype);
          stage_cache(v + c, a.v_cache, here[j] + c, a.cache_dtype);
        }
        k_rows[j] = k;
        v_rows[j] = v;
      } else {
        k_rows[j] = reinterpret_cast<const T*>(k_bytes + here[j] * size);
        v_rows[j] = reinterpret_cast<const T*>(v_bytes + here[j] * size);
      }
    }
    KeyBlock<T> keys{k_rows, v_rows, nk, first, d, scores, next_k, next_v, n, int(d * size)};
#if defined(RC_ISA_AMX)
    if constexpr (std::is_same_v<T, uint16_t>)
      if (tiles) {
        amx::stage(keys, tiled);
        keys.next_n = 0;
      }
#endif
    for (int rb = 0; rb < rows; rb += W) {
      const int nr = std::min(W, rows - rb);
      const auto [low, high] = std::minmax_element(limit + rb, limit + rb + nr);
      // rows that see none of these keys (causal) skip the block; rows that see all need no mask
      if (*high <= float(first)) continue;
      const bool masked = *low < float(first + nk);
      const TileRows tile{q + rb * d, q_bf16 == nullptr ? nullptr : q_bf16 + rb * d, a.scale, acc + rb * d, max + rb, sum + rb, limit + rb};
#if defined(RC_ISA_AMX)
      if constexpr (std::is_same_v<T, uint16_t>)
        if (tiles) {
          amx::attend(tile, keys, tiled, scores, weights);
          continue;
        }
#endif
      attend_rows(nr, masked, tile, keys);
      keys.next_n = 0;  // fetched once, by the first row block
    }
  }
}

void run_task(const rc_attention_args& a, const rc_task& task, int kv_head) {
  const int d = a.head_dim, group = a.num_heads / a.num_kv_heads;
  const int rows = task.tokens * group, padded = (rows + W - 1) / W * W;
  Scratch& s = scratch();
  float* q = grown(s.q, size_t(padded) * d);
  float* acc = grown(s.acc, size_t(padded) * d);
  float* max = grown(s.state, size_t(3) * padded);
  float* sum = max + padded;
  float* limit = sum + padded;
  // bf16 activations: their cache read by bf16 dot products where the CPU has them (an fp8 cache
  // staged as bf16), else a bf16 cache widened row by row when one row block reads it; staged as
  // fp32 once for many row blocks (an fp8 cache always)
  const bool bf16 = a.dtype == RC_BFLOAT16;
  const bool dot = Vec::BF16_DOT && bf16 && d % 32 == 0;
  uint16_t* q_bf16 = dot ? grown(s.q_bf16, size_t(padded) * d) : nullptr;
  gather_queries(a, task, kv_head, q, q_bf16, limit);
  std::fill(limit + rows, limit + padded, 0.0f);
  std::fill(max, max + padded, NEG_INF);
  std::fill(sum, sum + padded, 0.0f);
  std::fill(acc, acc + size_t(padded) * d, 0.0f);
  // AMX tiles (where this library has them) for bf16 dot products of at least AMX_MIN_ROWS rows
  const bool tiles = AMX && dot && rows >= AMX_MIN_ROWS;
  if (dot || (a.cache_dtype == RC_BFLOAT16 && !Vec::BF16_DOT && rows <= W))
    attend_keys<uint16_t>(a, task, kv_head, q, q_bf16, acc, max, sum, limit, rows, tiles);
  else
    attend_keys<float>(a, task, kv_head, q, q_bf16, acc, max, sum, limit, rows, tiles);
  finish_task(a, task, kv_head, acc, max, sum);
}

// One query token and KV head whose context several tasks covered: their outputs weighted by
// each one's share of the softmax denominator.
void merge_token(const rc_attention_args& a, const rc_merge& m, int kv_head) {
  const int d = a.head_dim, group = a.num_heads / a.num_kv_heads;
  const int n = m.contrib_end - m.contrib_begin;
  // each weight is an exponential: computed once per row, not once per W dimensions
  float* weight = grown(scratch().weights, size_t(n));
  for (int j = 0; j < group; ++j) {
    auto part = [&](int c) {
      const int64_t row = (int64_t(a.contribs[m.contrib_begin + c]) * a.num_kv_heads + kv_head) * group + j;
      return a.partials + row * (d + 2);
    };
    float top = NEG_INF;
    for (int c = 0; c < n; ++c) top = std::max(top, part(c)[d]);
    float total = 0.0f;
    for (int c = 0; c < n; ++c) {
      // a part that saw no visible key has max -inf and sum 0: it weighs nothing
      weight[c] = part(c)[d] == NEG_INF ? 0.0f : std::exp(part(c)[d] - top);
      total += weight[c] * part(c)[d + 1];
    }
    const int64_t at = (int64_t(m.row) * a.num_heads + kv_head * group + j) * d;
    for (int c0 = 0; c0 < d; c0 += W) {
      F o = Vec::zero();
      for (int c = 0; c < n; ++c) o = Vec::fma(Vec::set1(weight[c]), Vec::load(part(c) + c0), o);
      store(a.out, at + c0, Vec::div(o, Vec::set1(total)), a.dtype);
    }
  }
}

}  // namespace

void paged_attention(const rc_attention_args* args) {
  const rc_attention_args& a = *args;
  const int64_t merges = int64_t(a.num_merges) * a.num_kv_heads;
#pragma omp parallel
  {
#if defined(RC_ISA_AMX)
    amx::configure();  // once per thread and call, for the tasks that run on tiles
#endif
    // a task's KV heads one after another on one thread: a cache row holds every KV head's K (V),
    // so the rows the first head pulls in serve the others from the thread's own cache (a decode
    // from memory ran 8-15 % faster than with the heads spread over the threads)
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < a.num_tasks; ++t)
      for (int h = 0; h < a.num_kv_heads; ++h) run_task(a, a.tasks[t], h);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < merges; ++i) merge_token(a, a.merges[i / a.num_kv_heads], int(i % a.num_kv_heads));
#if defined(RC_ISA_AMX)
    _tile_release();
#endif
  }
}

}  // namespace rc
