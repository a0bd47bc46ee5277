// The C interface between the torch binding (ops.cpp, built once) and each per-ISA kernel
// library (built once per instruction set, loaded only on CPUs that have it). Plain structs
// of pointers and sizes: the kernel libraries include no torch header.
#pragma once

#include <cstdint>

extern "C" {

// activations are float32 or bfloat16; a KV cache holds the activations' dtype or an fp8 format
enum rc_dtype : int32_t { RC_FLOAT32 = 0, RC_BFLOAT16 = 1, RC_FP8_E4M3 = 2, RC_FP8_E5M2 = 3 };

// One unit of attention work, for every KV head: the query rows of `seg_end - seg_begin`
// segments against keys [key_begin, key_end) of request `key_req` (read through its page
// table). `partial_row` < 0: the task covers its queries' whole context and writes the
// output; otherwise its (max, sum, unnormalised output) go to partial rows from there on.
struct rc_task {
  int32_t key_req;
  int32_t key_begin;
  int32_t key_end;
  int32_t seg_begin;
  int32_t seg_end;
  int32_t tokens;  // query tokens over its segments
  int32_t partial_row;
  int32_t unused;
};

// New tokens [token_begin, token_end) of request `req` (token i sees keys < prefix + i + 1).
struct rc_segment {
  int32_t req;
  int32_t token_begin;
  int32_t token_end;
};

// A query token whose context was cut into several tasks: combine partial rows
// contribs[contrib_begin:contrib_end] into output row `row`.
struct rc_merge {
  int32_t row;
  int32_t contrib_begin;
  int32_t contrib_end;
};

struct rc_attention_args {
  const void* q;  // [T, heads, head_dim], head_dim contiguous
  int64_t q_token_stride;
  int64_t q_head_stride;
  const void* k_cache;  // [rows, kv_heads, head_dim], contiguous
  const void* v_cache;
  void* out;  // [T, heads, head_dim], contiguous
  const int32_t* page_table;  // [B, page_table_stride]
  int64_t page_table_stride;
  int32_t page_size;
  const int32_t* q_starts;  // [B]
  const int32_t* prefix_lens;  // [B]
  const rc_task* tasks;
  int32_t num_tasks;
  const rc_segment* segments;
  const rc_merge* merges;
  int32_t num_merges;
  const int32_t* contribs;  // partial rows
  float* partials;  // [partial rows, kv_heads, group, head_dim + 2]
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  float scale;
  rc_dtype dtype;
  rc_dtype cache_dtype;
};

// Writes rows slots[t] of both caches: k, v are [T, kv_heads * head_dim] with a token stride.
struct rc_store_args {
  void* k_cache;
  void* v_cache;
  const int64_t* slots;
  const void* k;
  const void* v;
  int64_t k_stride;
  int64_t v_stride;
  int64_t tokens;
  int64_t row;  // kv_heads * head_dim
  rc_dtype dtype;
  rc_dtype cache_dtype;
};

// Rotates q and k in place inside the fused projection output qkv [T, (heads + 2 kv_heads) * d]
// (row stride qkv_stride), then stores k and v into the caches' rows slots[t].
struct rc_rope_args {
  void* qkv;
  int64_t qkv_stride;
  const void* cos;  // [T, head_dim / 2], contiguous, activation dtype
  const void* sin;
  void* k_cache;
  void* v_cache;
  const int64_t* slots;
  int64_t tokens;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  rc_dtype dtype;
  rc_dtype cache_dtype;
};

// RMSNorm of x [rows, hidden] (row stride x_stride) into out (contiguous); with a residual
// [rows, hidden] (contiguous), first residual += x, then out = norm(residual).
struct rc_norm_args {
  const void* x;
  int64_t x_stride;
  void* residual;
  void* out;
  const void* weight;
  int64_t rows;
  int64_t hidden;
  float eps;
  rc_dtype dtype;
};

// out [rows, width] = silu(x[:, :width]) * x[:, width:], x with row stride x_stride.
struct rc_act_args {
  const void* x;
  int64_t x_stride;
  void* out;
  int64_t rows;
  int64_t width;
  rc_dtype dtype;
};

// out [m, n] = x [m, k] (row-major) times a weight [n, k] transposed, the weight in the blocked
// layout [n / matvec_block, k, matvec_block] (rc_kernel_table): a linear layer's product.
struct rc_matvec_args {
  const void* x;
  const void* weight;
  void* out;
  int64_t m;
  int64_t n;
  int64_t k;
  rc_dtype dtype;
};

struct rc_kernel_table {
  const char* isa;
  void (*paged_attention)(const rc_attention_args*);
  void (*store_kv)(const rc_store_args*);
  void (*rope_store_kv)(const rc_rope_args*);
  void (*rms_norm)(const rc_norm_args*);
  void (*silu_and_mul)(const rc_act_args*);
  void (*matvec)(const rc_matvec_args*);
  int matvec_block;       // output features per block of matvec's weight layout
  int matvec_bf16_pairs;  // whether a bf16 block holds its input features in pairs (matvec.cpp)
};

}  // extern "C"
