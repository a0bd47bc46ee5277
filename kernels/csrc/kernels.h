// The kernels every per-ISA library implements (attention.cpp, elementwise.cpp, matvec.cpp), exported
// through its rc_kernel_table (isa_table.cpp).
#pragma once

#include "kernel_api.h"

namespace rc {

void paged_attention(const rc_attention_args* args);
void store_kv(const rc_store_args* args);
void rope_store_kv(const rc_rope_args* args);
void rms_norm(const rc_norm_args* args);
void silu_and_mul(const rc_act_args* args);
void matvec(const rc_matvec_args* args);

}  // namespace rc
