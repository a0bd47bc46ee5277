// The attention plan of one step, built once and used by every layer: which query rows meet
// which keys in which task, so that a shared prefix is read once per group and long contexts
// are split across threads. Pure bookkeeping over the batch's lengths and page tables.
#pragma once

#include <cstdint>
#include <vector>

#include "kernel_api.h"

namespace rc {

struct PlanInput {
  const int32_t* q_starts;  // [batch]
  const int32_t* prefix_lens;
  const int32_t* extend_lens;
  int32_t batch;
  int64_t num_tokens;  // query rows of the step
  const int32_t* page_table;  // [batch, table_width], row stride table_stride
  int64_t table_stride;
  int64_t table_width;
  int32_t page_size;
  int64_t num_pages;  // pages of the cache
  const int32_t* groups;  // [batch]: each request's shared-prefix group, -1 for none; may be null
  const int32_t* group_lens;  // [num_groups]: tokens the group's requests share
  int32_t num_groups;
  int32_t group_heads;  // query heads per KV head
  int32_t kv_heads;
  int32_t threads;
};

struct Plan {
  std::vector<rc_task> tasks;
  std::vector<rc_segment> segments;
  std::vector<rc_merge> merges;
  std::vector<int32_t> contribs;
  int32_t partial_rows = 0;
};

// Throws std::invalid_argument, saying what is wrong, on lengths or page tables that do not fit.
Plan make_plan(const PlanInput& in);

}  // namespace rc
