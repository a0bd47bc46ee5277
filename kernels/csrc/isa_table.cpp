// The one exported symbol of a per-ISA kernel library: its table of kernels. RC_ISA names the
// instruction set (amx, avx512bf16, avx512, avx2, scalar); the build gives each library its own -m flags.
#include "kernels.h"
#include "vec.h"

#define RC_JOIN(a, b) a##b
#define RC_TABLE(isa) RC_JOIN(rc_kernels_, isa)
#define RC_STR(x) #x
#define RC_NAME(x) RC_STR(x)

extern "C" __attribute__((visibility("default"))) const rc_kernel_table* RC_TABLE(RC_ISA)() {
  static const rc_kernel_table table{
      RC_NAME(RC_ISA), rc::paged_attention, rc::store_kv, rc::rope_store_kv, rc::rms_norm, rc::silu_and_mul, rc::matvec,
      rc::W, rc::Vec::BF16_DOT,
  };
  return &table;
}
