// The torch binding: the `radixcluster::` operators, their argument checks, and the choice of
// kernel library by what this CPU supports (cpuid), made once and changeable for tests.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <initializer_list>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_api.h"
#include "plan.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

extern "C" {
const rc_kernel_table* rc_kernels_scalar();
#if defined(RC_X86)
const rc_kernel_table* rc_kernels_avx2();
const rc_kernel_table* rc_kernels_avx512();
const rc_kernel_table* rc_kernels_avx512bf16();
const rc_kernel_table* rc_kernels_amx();
#endif
}

namespace {

struct Isa {
  const char* name;
  const rc_kernel_table* (*table)();
  bool (*supported)();
};

#if defined(RC_X86)
bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
}
bool has_avx512bf16() { return has_avx512() && __builtin_cpu_supports("avx512bf16"); }
// AMX also needs the kernel's leave to use the tile state, asked once for the whole process
bool has_amx() {
  static const bool granted = [] {
    if (!has_avx512bf16() || !__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
#if defined(__linux__)
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
  }();
  return granted;
}
bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif
bool always() { return true; }

// best first
const Isa ISAS[] = {
#if defined(RC_X86)
    {"amx", rc_kernels_amx, has_amx},
    {"avx512bf16", rc_kernels_avx512bf16, has_avx512bf16},
    {"avx512", rc_kernels_avx512, has_avx512},
    {"avx2", rc_kernels_avx2, has_avx2},
#endif
    {"scalar", rc_kernels_scalar, always},
};

const rc_kernel_table* best_table() {
  for (const Isa& isa : ISAS)
    if (isa.supported()) return isa.table();
  return rc_kernels_scalar();
}

std::atomic<const rc_kernel_table*> current{nullptr};

const rc_kernel_table& kernels() {
  const rc_kernel_table* t = current.load();
  if (t == nullptr) {
    t = best_table();
    current.store(t);
  }
  return *t;
}

std::string kernel_isa() { return kernels().isa; }

int64_t matvec_block() { return kernels().matvec_block; }

std::vector<std::string> supported_isas() {
  std::vector<std::string> names;
  for (const Isa& isa : ISAS)
    if (isa.supported()) names.emplace_back(isa.name);
  return names;
}

void use_isa(const std::string& name) {
  for (const Isa& isa : ISAS)
    if (name == isa.name) {
      TORCH_CHECK(isa.supported(), "this CPU cannot run the ", name, " kernels");
      current.store(isa.table());
      return;
    }
  TORCH_CHECK(false, "no kernels for instruction set '", name, "'");
}

rc_dtype dtype_of(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  if (t.scalar_type() == at::kFloat) return RC_FLOAT32;
  if (t.scalar_type() == at::kBFloat16) return RC_BFLOAT16;
  TORCH_CHECK(false, what, " must be float32 or bfloat16, not ", t.scalar_type());
}

// A KV cache holds the activations' dtype, or an fp8 format (--kv-cache-dtype)
rc_dtype cache_dtype_of(const at::Tensor& act, const at::Tensor& cache, const char* what) {
  if (cache.scalar_type() == at::kFloat8_e4m3fn) return RC_FP8_E4M3;
  if (cache.scalar_type() == at::kFloat8_e5m2) return RC_FP8_E5M2;
  TORCH_CHECK(cache.scalar_type() == act.scalar_type(), what, " must have the activations' dtype ", act.scalar_type(),
              " or an fp8 one (float8_e4m3fn, float8_e5m2), not ", cache.scalar_type());
  return dtype_of(cache, what);
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what, " must have the activations' dtype ", a.scalar_type(), ", not ",
              b.scalar_type());
}

void check_index(const at::Tensor& t, at::ScalarType type, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous(), what, " must be a contiguous CPU ",
              type, " tensor");
}

std::vector<at::Tensor> attention_plan(const at::Tensor& q_starts, const at::Tensor& prefix_lens,
                                       const at::Tensor& extend_lens, const at::Tensor& page_table, int64_t page_size,
                                       int64_t num_pages, const std::optional<at::Tensor>& groups,
                                       const std::optional<at::Tensor>& group_lens, int64_t num_tokens,
                                       int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&q_starts, &prefix_lens, &extend_lens}) check_index(*t, at::kInt, "request lengths");
  TORCH_CHECK(page_table.dim() == 2 && page_table.scalar_type() == at::kInt && page_table.stride(1) == 1 &&
                  page_table.size(0) == q_starts.size(0),
              "page_table must be an int32 [batch, pages] tensor with contiguous rows");
  TORCH_CHECK(groups.has_value() == group_lens.has_value(), "groups and group_lens come together");
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(head_dim % 16 == 0, "the native kernels need head_dim to be a multiple of 16, not ", head_dim);
  rc::PlanInput in{q_starts.data_ptr<int32_t>(), prefix_lens.data_ptr<int32_t>(), extend_lens.data_ptr<int32_t>(),
                   int32_t(q_starts.size(0)), num_tokens, page_table.data_ptr<int32_t>(), page_table.stride(0),
                   page_table.size(1), int32_t(page_size), num_pages, nullptr, nullptr, 0,
                   int32_t(num_heads / num_kv_heads), int32_t(num_kv_heads), at::get_num_threads()};
  if (groups.has_value()) {
    check_index(*groups, at::kInt, "groups");
    check_index(*group_lens, at::kInt, "group_lens");
    TORCH_CHECK(groups->size(0) == q_starts.size(0), "groups must have one entry per request");
    in.groups = groups->data_ptr<int32_t>();
    in.group_lens = group_lens->data_ptr<int32_t>();
    in.num_groups = int32_t(group_lens->size(0));
  }
  rc::Plan plan;
  try {
    plan = rc::make_plan(in);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  auto ints = [](const void* data, int64_t rows, int64_t cols) {
    at::Tensor t = at::empty({rows, cols}, at::kInt);
    std::memcpy(t.data_ptr(), data, rows * cols * sizeof(int32_t));
    return t;
  };
  constexpr int64_t task_fields = sizeof(rc_task) / sizeof(int32_t);
  constexpr int64_t seg_fields = sizeof(rc_segment) / sizeof(int32_t);
  constexpr int64_t merge_fields = sizeof(rc_merge) / sizeof(int32_t);
  return {ints(plan.tasks.data(), int64_t(plan.tasks.size()), task_fields),
          ints(plan.segments.data(), int64_t(plan.segments.size()), seg_fields),
          ints(plan.merges.data(), int64_t(plan.merges.size()), merge_fields),
          ints(plan.contribs.data(), int64_t(plan.contribs.size()), 1).view({-1}),
          at::empty({int64_t(plan.partial_rows) * num_heads * (head_dim + 2)}, at::kFloat)};
}

void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, at::Tensor& out,
                     const at::Tensor& page_table, int64_t page_size, const at::Tensor& q_starts,
                     const at::Tensor& prefix_lens, const at::Tensor& tasks, const at::Tensor& segments,
                     const at::Tensor& merges, const at::Tensor& contribs, at::Tensor& partials, double scale) {
  const rc_dtype dtype = dtype_of(q, "q");
  const rc_dtype cache_dtype = cache_dtype_of(q, k_cache, "the K cache");
  TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type(), "the K and V caches must have one dtype");
  check_same(q, out, "out");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [tokens, heads, head_dim] with head_dim contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
              "the K and V caches must be contiguous and of one shape");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes(), "out must be contiguous and shaped like q");
  const int64_t heads = q.size(1), head_dim = q.size(2), kv_heads = k_cache.size(-2);
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(1) == page_size, "the caches must be [pages, page_size, kv_heads, head_dim]");
  TORCH_CHECK(k_cache.size(-1) == head_dim && heads % kv_heads == 0, "q and the caches disagree on heads");
  TORCH_CHECK(page_table.dim() == 2 && page_table.scalar_type() == at::kInt && page_table.stride(1) == 1,
              "page_table must be int32 [batch, pages] with contiguous rows");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&tasks, &segments, &merges, &contribs}) check_index(*t, at::kInt, "the plan");
  check_index(q_starts, at::kInt, "q_starts");
  check_index(prefix_lens, at::kInt, "prefix_lens");
  TORCH_CHECK(partials.is_contiguous() && partials.scalar_type() == at::kFloat, "partials must be float32");
  rc_attention_args args{q.data_ptr(),
                         q.stride(0),
                         q.stride(1),
                         k_cache.data_ptr(),
                         v_cache.data_ptr(),
                         out.data_ptr(),
                         page_table.data_ptr<int32_t>(),
                         page_table.stride(0),
                         int32_t(page_size),
                         q_starts.data_ptr<int32_t>(),
                         prefix_lens.data_ptr<int32_t>(),
                         reinterpret_cast<const rc_task*>(tasks.data_ptr<int32_t>()),
                         int32_t(tasks.size(0)),
                         reinterpret_cast<const rc_segment*>(segments.data_ptr<int32_t>()),
                         reinterpret_cast<const rc_merge*>(merges.data_ptr<int32_t>()),
                         int32_t(merges.size(0)),
                         contribs.data_ptr<int32_t>(),
                         partials.data_ptr<float>(),
                         int32_t(heads),
                         int32_t(kv_heads),
                         int32_t(head_dim),
                         float(scale),
                         dtype,
                         cache_dtype};
  kernels().paged_attention(&args);
}

void check_slots(const at::Tensor& slots, int64_t tokens, const at::Tensor& cache) {
  check_index(slots, at::kLong, "slot_mapping");
  TORCH_CHECK(slots.size(0) == tokens, "slot_mapping must have one row per token");
  const int64_t rows = cache.size(0) * cache.size(1);
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK_VALUE(s[t] >= 0 && s[t] < rows, "slot ", s[t], " is outside the cache");
}

rc_dtype check_cache(const at::Tensor& act, const at::Tensor& k_cache, const at::Tensor& v_cache) {
  const rc_dtype cache_dtype = cache_dtype_of(act, k_cache, "the K cache");
  TORCH_CHECK(v_cache.scalar_type() == k_cache.scalar_type(), "the K and V caches must have one dtype");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.sizes() == v_cache.sizes(),
              "the caches must be contiguous [pages, page_size, kv_heads, head_dim] tensors of one shape");
  return cache_dtype;
}

void store_kv(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& k,
              const at::Tensor& v) {
  const rc_dtype dtype = dtype_of(k, "k");
  const rc_dtype cache_dtype = check_cache(k, k_cache, v_cache);
  check_same(k, v, "v");
  const int64_t row = k_cache.size(2) * k_cache.size(3);
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&k, &v})
    TORCH_CHECK(t->dim() == 3 && t->size(1) * t->size(2) == row && t->stride(2) == 1 && t->stride(1) == t->size(2),
                "k and v must be [tokens, kv_heads, head_dim] with contiguous rows");
  check_slots(slot_mapping, k.size(0), k_cache);
  rc_store_args args{k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr<int64_t>(),
                     k.data_ptr(),       v.data_ptr(),       k.stride(0),
                     v.stride(0),        k.size(0),          row,
                     dtype,              cache_dtype};
  kernels().store_kv(&args);
}

void rope_store_kv(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                   at::Tensor& v_cache, const at::Tensor& slot_mapping, int64_t num_heads, int64_t num_kv_heads) {
  const rc_dtype dtype = dtype_of(qkv, "qkv");
  const rc_dtype cache_dtype = check_cache(qkv, k_cache, v_cache);
  const int64_t head_dim = k_cache.size(3);
  TORCH_CHECK(k_cache.size(2) == num_kv_heads, "the caches hold ", k_cache.size(2), " KV heads, not ", num_kv_heads);
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && qkv.size(1) == (num_heads + 2 * num_kv_heads) * head_dim,
              "qkv must be [tokens, (heads + 2 kv_heads) * head_dim] with contiguous rows");
  TORCH_CHECK(head_dim % 2 == 0, "head_dim must be even");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&cos, &sin}) {
    check_same(qkv, *t, "cos and sin");
    TORCH_CHECK(t->is_contiguous() && t->dim() == 2 && t->size(0) == qkv.size(0) && t->size(1) == head_dim / 2,
                "cos and sin must be contiguous [tokens, head_dim / 2]");
  }
  check_slots(slot_mapping, qkv.size(0), k_cache);
  rc_rope_args args{qkv.data_ptr(),
                    qkv.stride(0),
                    cos.data_ptr(),
                    sin.data_ptr(),
                    k_cache.data_ptr(),
                    v_cache.data_ptr(),
                    slot_mapping.data_ptr<int64_t>(),
                    qkv.size(0),
                    int32_t(num_heads),
                    int32_t(num_kv_heads),
                    int32_t(head_dim),
                    dtype,
                    cache_dtype};
  kernels().rope_store_kv(&args);
}

rc_norm_args norm_args(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const rc_dtype dtype = dtype_of(x, "x");
  check_same(x, weight, "weight");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [rows, hidden] with contiguous rows");
  TORCH_CHECK(weight.is_contiguous() && weight.dim() == 1 && weight.size(0) == x.size(1), "weight must be [hidden]");
  return rc_norm_args{x.data_ptr(), x.stride(0), nullptr, nullptr, weight.data_ptr(), x.size(0), x.size(1),
                      float(eps),   dtype};
}

void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  rc_norm_args args = norm_args(x, weight, eps);
  check_same(x, out, "out");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == x.sizes(), "out must be contiguous and shaped like x");
  args.out = out.data_ptr();
  kernels().rms_norm(&args);
}

void add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  rc_norm_args args = norm_args(x, weight, eps);
  check_same(x, residual, "residual");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && residual.sizes() == x.sizes(),
              "x and residual must be contiguous and of one shape");
  args.residual = residual.data_ptr();
  args.out = x.data_ptr();
  kernels().rms_norm(&args);
}

void silu_and_mul(const at::Tensor& x, at::Tensor& out) {
  const rc_dtype dtype = dtype_of(x, "x");
  check_same(x, out, "out");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0, "x must be [rows, 2 * width], rows contiguous");
  TORCH_CHECK(out.is_contiguous() && out.size(0) == x.size(0) && out.size(1) * 2 == x.size(1),
              "out must be contiguous [rows, width]");
  rc_act_args args{x.data_ptr(), x.stride(0), out.data_ptr(), x.size(0), out.size(1), dtype};
  kernels().silu_and_mul(&args);
}

// the output features of a blocked weight
int64_t blocked_rows(const at::Tensor& weight) { return weight.size(0) * weight.size(2); }

// weight [n, k] in matvec's layout: [n / W, k, W], W output features side by side; a bf16
// weight, where the kernels have bf16 dot products, with its input features in pairs
// ([k / 2, W, 2] per block, an odd last one after them as [1, W])
at::Tensor block_weight(const at::Tensor& weight) {
  dtype_of(weight, "weight");
  const int64_t block = kernels().matvec_block;
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % block == 0, "weight must be [out, in] with out a multiple of ",
              block, " (matvec_block)");
  const int64_t n = weight.size(0), k = weight.size(1), blocks = n / block;
  const at::Tensor rows = weight.contiguous().view({blocks, block, k});
  if (!(kernels().matvec_bf16_pairs && weight.scalar_type() == at::kBFloat16))
    return rows.transpose(1, 2).contiguous();
  const int64_t even = k / 2 * 2;
  const at::Tensor pairs = rows.narrow(2, 0, even).reshape({blocks, block, even / 2, 2}).permute({0, 2, 1, 3});
  const at::Tensor last = rows.narrow(2, even, k - even).transpose(1, 2);
  return at::cat({pairs.reshape({blocks, even * block}), last.reshape({blocks, (k - even) * block})}, 1)
      .view({blocks, k, block});
}

void matvec(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out) {
  const rc_dtype dtype = dtype_of(x, "x");
  check_same(x, weight, "weight");
  check_same(x, out, "out");
  const int64_t block = kernels().matvec_block;
  TORCH_CHECK(weight.dim() == 3 && weight.is_contiguous() && weight.size(2) == block,
              "weight must be a contiguous blocked matrix [out / ", block, ", in, ", block, "] (matvec_block)");
  const int64_t n = blocked_rows(weight);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) == weight.size(1), "x must be contiguous rows of ",
              weight.size(1), " values");
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == n,
              "out must be contiguous [", x.size(0), ", ", n, "]");
  rc_matvec_args args{x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.size(0), n, weight.size(1), dtype};
  kernels().matvec(&args);
}

// Every decoder layer of a step in one call, when all its linear products are few-row ones
// (one rank, no biases): the Python between the kernels (module calls, allocations, dispatch)
// cost ~0.1 ms a layer, a tenth of one request's decode step. The kernels and their order are
// worker/llama.py's, so the results are the same bit for bit. weights: per layer the input
// norm, qkv, o, post-attention norm, gate_up and down (the four products' weights blocked). x: the embedded tokens in, the last
// layer's output out; residual: the residual stream out.
void decoder_layers(at::Tensor& x, at::Tensor& residual, at::TensorList weights, const at::Tensor& cos,
                    const at::Tensor& sin, at::TensorList k_caches, at::TensorList v_caches,
                    const at::Tensor& slot_mapping, const at::Tensor& page_table, int64_t page_size,
                    const at::Tensor& q_starts, const at::Tensor& prefix_lens, const at::Tensor& tasks,
                    const at::Tensor& segments, const at::Tensor& merges, const at::Tensor& contribs,
                    at::Tensor& partials, int64_t num_heads, int64_t num_kv_heads, double scale, double eps) {
  constexpr size_t PER_LAYER = 6;
  const size_t layers = k_caches.size();
  TORCH_CHECK(layers > 0 && v_caches.size() == layers && weights.size() == PER_LAYER * layers,
              "decoder_layers needs K and V caches and ", PER_LAYER, " weights for every layer");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.is_contiguous() && residual.sizes() == x.sizes(),
              "x and residual must be contiguous [tokens, hidden] tensors of one shape");
  const int64_t tokens = x.size(0), head_dim = k_caches[0].size(-1);
  at::Tensor qkv = at::empty({tokens, blocked_rows(weights[1])}, x.options());
  at::Tensor attended = at::empty({tokens, num_heads, head_dim}, x.options());
  at::Tensor gate_up = at::empty({tokens, blocked_rows(weights[4])}, x.options());
  at::Tensor act = at::empty({tokens, blocked_rows(weights[4]) / 2}, x.options());
  residual.copy_(x);
  rms_norm(residual, weights[0], eps, x);
  for (size_t layer = 0; layer < layers; ++layer) {
    const at::Tensor* w = weights.data() + PER_LAYER * layer;
    at::Tensor k_cache = k_caches[layer], v_cache = v_caches[layer];
    if (layer > 0) add_rms_norm(x, residual, w[0], eps);
    matvec(x, w[1], qkv);
    rope_store_kv(qkv, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads);
    const at::Tensor q = qkv.narrow(1, 0, num_heads * head_dim).view({tokens, num_heads, head_dim});
    paged_attention(q, k_cache, v_cache, attended, page_table, page_size, q_starts, prefix_lens, tasks, segments,
                    merges, contribs, partials, scale);
    matvec(attended.view({tokens, num_heads * head_dim}), w[2], x);
    add_rms_norm(x, residual, w[3], eps);
    matvec(x, w[4], gate_up);
    silu_and_mul(gate_up, act);
    matvec(act, w[5], x);
  }
}

}  // namespace

TORCH_LIBRARY(radixcluster, m) {
  m.def("kernel_isa() -> str", &kernel_isa);
  m.def("matvec_block() -> int", &matvec_block);
  m.def("supported_isas() -> str[]", &supported_isas);
  m.def("use_isa(str isa) -> ()", &use_isa);
  m.def(
      "attention_plan(Tensor q_starts, Tensor prefix_lens, Tensor extend_lens, Tensor page_table, int page_size, "
      "int num_pages, Tensor? groups, Tensor? group_lens, int num_tokens, int num_heads, int num_kv_heads, "
      "int head_dim) -> Tensor[]");
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, Tensor page_table, int page_size, "
      "Tensor q_starts, Tensor prefix_lens, Tensor tasks, Tensor segments, Tensor merges, Tensor contribs, "
      "Tensor(b!) partials, float scale) -> ()");
  m.def("store_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, Tensor k, Tensor v) -> ()");
  m.def(
      "rope_store_kv(Tensor(a!) qkv, Tensor cos, Tensor sin, Tensor(b!) k_cache, Tensor(c!) v_cache, "
      "Tensor slot_mapping, int num_heads, int num_kv_heads) -> ()");
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()");
  m.def("add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("silu_and_mul(Tensor x, Tensor(a!) out) -> ()");
  m.def("block_weight(Tensor weight) -> Tensor");
  m.def("matvec(Tensor x, Tensor weight, Tensor(a!) out) -> ()");
  m.def(
      "decoder_layers(Tensor(a!) x, Tensor(b!) residual, Tensor[] weights, Tensor cos, Tensor sin, "
      "Tensor(c!)[] k_caches, Tensor(d!)[] v_caches, Tensor slot_mapping, Tensor page_table, int page_size, "
      "Tensor q_starts, Tensor prefix_lens, Tensor tasks, Tensor segments, Tensor merges, Tensor contribs, "
      "Tensor(e!) partials, int num_heads, int num_kv_heads, float scale, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(radixcluster, CPU, m) {
  m.impl("attention_plan", &attention_plan);
  m.impl("paged_attention", &paged_attention);
  m.impl("store_kv", &store_kv);
  m.impl("rope_store_kv", &rope_store_kv);
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("block_weight", &block_weight);
  m.impl("matvec", &matvec);
  m.impl("decoder_layers", &decoder_layers);
}
