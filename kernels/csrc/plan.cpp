// Builds the attention plan (plan.h). Tasks come in two kinds: a group's shared prefix
// against all its members' query tokens (K/V read once for the group), and each request's
// own keys (past the shared prefix, causal) against its own tokens. Query tokens are cut
// into tiles of about TILE_ROWS rows; key ranges are split when there are too few tasks to
// keep every thread busy. A token covered by more than one task gets a merge entry.
#include "plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace rc {
namespace {

constexpr int32_t TILE_ROWS = 64;  // query rows (tokens x query heads per KV head) per task
constexpr int32_t MIN_SPLIT_KEYS = 256;  // never split a key range into shorter pieces
// tasks wanted per thread: a task runs all its KV heads, so fewer would leave one thread a whole
// task's work more than the other (a decode of 5 ran 5-9 % slower with 2 than with 4)
constexpr int32_t ITEMS_PER_THREAD = 4;

struct Draft {
  int32_t key_req, key_begin, key_end;
  std::vector<rc_segment> segments;
  int32_t tokens;
  bool whole;  // the task's tokens see no key outside its range
};

void fail(const std::string& what) { throw std::invalid_argument(what); }

void check_input(const PlanInput& in) {
  int64_t expected_start = 0;
  for (int32_t b = 0; b < in.batch; ++b) {
    const int64_t prefix = in.prefix_lens[b], extend = in.extend_lens[b];
    if (prefix < 0 || extend < 1) fail("request " + std::to_string(b) + ": needs prefix_len >= 0 and extend_len >= 1");
    if (in.q_starts[b] != expected_start) fail("q_starts must lay requests out back to back");
    expected_start += extend;
    const int64_t pages = (prefix + extend + in.page_size - 1) / in.page_size;
    if (pages > in.table_width) fail("request " + std::to_string(b) + ": its context outgrows its page-table row");
    const int32_t* row = in.page_table + b * in.table_stride;
    for (int64_t p = 0; p < pages; ++p)
      if (row[p] < 0 || row[p] >= in.num_pages)
        fail("request " + std::to_string(b) + ": page " + std::to_string(row[p]) + " is outside the cache");
  }
  if (expected_start != in.num_tokens) fail("extend_lens do not add up to the query rows");
}

// Tokens of the group's members that share the same first pages, up to the claimed length
// (and never past a member's cached prefix: every query must see the whole shared part).
int32_t verified_shared_len(const PlanInput& in, const std::vector<int32_t>& members, int32_t claimed) {
  int64_t len = claimed;
  for (int32_t b : members) len = std::min<int64_t>(len, in.prefix_lens[b]);
  const int32_t* first = in.page_table + members[0] * in.table_stride;
  const int64_t pages = (len + in.page_size - 1) / in.page_size;
  for (int32_t b : members) {
    const int32_t* row = in.page_table + b * in.table_stride;
    for (int64_t p = 0; p < pages; ++p)
      if (row[p] != first[p]) {
        len = std::min<int64_t>(len, p * in.page_size);
        break;
      }
  }
  return int32_t(std::max<int64_t>(len, 0));
}

// Cuts the tokens [begin, end) of each (request, begin, end) into tiles of at most `tile` tokens.
std::vector<std::vector<rc_segment>> tiles(const std::vector<rc_segment>& runs, int32_t tile) {
  std::vector<std::vector<rc_segment>> out(1);
  int32_t filled = 0;
  for (rc_segment run : runs) {
    while (run.token_begin < run.token_end) {
      if (filled == tile) {
        out.emplace_back();
        filled = 0;
      }
      const int32_t take = std::min(run.token_end - run.token_begin, tile - filled);
      out.back().push_back({run.req, run.token_begin, run.token_begin + take});
      run.token_begin += take;
      filled += take;
    }
  }
  return out;
}

int32_t token_count(const std::vector<rc_segment>& segments) {
  int32_t n = 0;
  for (const rc_segment& s : segments) n += s.token_end - s.token_begin;
  return n;
}

std::vector<Draft> draft_tasks(const PlanInput& in, std::vector<int32_t>& shared) {
  const int32_t tile = std::max(1, TILE_ROWS / in.group_heads);
  std::vector<Draft> drafts;
  if (in.groups != nullptr) {
    std::vector<std::vector<int32_t>> members(in.num_groups);
    for (int32_t b = 0; b < in.batch; ++b) {
      const int32_t g = in.groups[b];
      if (g < -1 || g >= in.num_groups) fail("request " + std::to_string(b) + ": no shared-prefix group " + std::to_string(g));
      if (g >= 0) members[g].push_back(b);
    }
    for (int32_t g = 0; g < in.num_groups; ++g) {
      if (members[g].empty()) continue;
      const int32_t len = verified_shared_len(in, members[g], in.group_lens[g]);
      if (len == 0) continue;
      std::vector<rc_segment> runs;
      for (int32_t b : members[g]) {
        shared[b] = len;
        runs.push_back({b, 0, in.extend_lens[b]});
      }
      for (auto& segs : tiles(runs, tile)) drafts.push_back({members[g][0], 0, len, segs, token_count(segs), false});
    }
  }
  for (int32_t b = 0; b < in.batch; ++b) {
    for (auto& segs : tiles({{b, 0, in.extend_lens[b]}}, tile)) {
      const int32_t end = in.prefix_lens[b] + segs.back().token_end;
      drafts.push_back({b, shared[b], end, segs, token_count(segs), shared[b] == 0});
    }
  }
  return drafts;
}

// Splits long key ranges while there are fewer tasks than the threads want.
std::vector<Draft> split_keys(std::vector<Draft> drafts, const PlanInput& in) {
  const int64_t items = int64_t(drafts.size());
  const int64_t wanted = int64_t(in.threads) * ITEMS_PER_THREAD;
  if (items >= wanted) return drafts;
  const int64_t factor = (wanted + items - 1) / items;
  std::vector<Draft> out;
  for (Draft& d : drafts) {
    const int64_t keys = d.key_end - d.key_begin;
    const int64_t pieces = std::max<int64_t>(1, std::min<int64_t>(factor, keys / MIN_SPLIT_KEYS));
    for (int64_t p = 0; p < pieces; ++p) {
      Draft piece = d;
      piece.key_begin = int32_t(d.key_begin + keys * p / pieces);
      piece.key_end = int32_t(d.key_begin + keys * (p + 1) / pieces);
      piece.whole = d.whole && pieces == 1;
      out.push_back(piece);
    }
  }
  return out;
}

}  // namespace

Plan make_plan(const PlanInput& in) {
  if (in.page_size < 1 || in.group_heads < 1 || in.kv_heads < 1) fail("page_size and head counts must be positive");
  check_input(in);
  std::vector<int32_t> shared(in.batch, 0);
  std::vector<Draft> drafts = split_keys(draft_tasks(in, shared), in);
  // longest first, so dynamic scheduling ends with the short ones
  std::stable_sort(drafts.begin(), drafts.end(), [](const Draft& a, const Draft& b) {
    return int64_t(a.tokens) * (a.key_end - a.key_begin) > int64_t(b.tokens) * (b.key_end - b.key_begin);
  });
  Plan plan;
  std::vector<std::vector<int32_t>> parts(in.num_tokens);
  for (const Draft& d : drafts) {
    rc_task task{d.key_req, d.key_begin, d.key_end, int32_t(plan.segments.size()), 0, d.tokens, -1, 0};
    plan.segments.insert(plan.segments.end(), d.segments.begin(), d.segments.end());
    task.seg_end = int32_t(plan.segments.size());
    if (!d.whole) {
      task.partial_row = plan.partial_rows;
      int32_t row = plan.partial_rows;
      for (const rc_segment& s : d.segments)
        for (int32_t i = s.token_begin; i < s.token_end; ++i) parts[in.q_starts[s.req] + i].push_back(row++);
      plan.partial_rows = row;
    }
    plan.tasks.push_back(task);
  }
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    if (parts[t].empty()) continue;
    const int32_t begin = int32_t(plan.contribs.size());
    plan.contribs.insert(plan.contribs.end(), parts[t].begin(), parts[t].end());
    plan.merges.push_back({int32_t(t), begin, int32_t(plan.contribs.size())});
  }
  return plan;
}

}  // namespace rc
