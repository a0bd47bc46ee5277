"""A deterministic stand-in for the model worker (the only test double of the scheduler tests).

It does what a worker does with a ForwardBatch except the model: applies the page-table
deltas to mirrored tables, writes every new token id into a fake KV pool at
(page, offset), then reads each request's WHOLE context back through its page table and
hashes it into the next token. A wrong page index anywhere gives a wrong token, so
comparing outputs with ``reference_generate`` checks the scheduler's paging end to end.
It also checks the batch's shared-prefix groups: every member of a group holds the shared
tokens, already computed, on the same pages (what the attention kernels rely on).
"""

from __future__ import annotations

import hashlib

import numpy as np

from radixcluster.protocol import ForwardBatch, StepResult, decode, encode

VOCAB = 1000


def next_token(context: np.ndarray) -> int:
    digest = hashlib.blake2b(np.ascontiguousarray(context, dtype=np.int32).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % VOCAB


def reference_generate(
    prompt: np.ndarray, max_new_tokens: int, eos: tuple[int, ...] = (), max_context_len: int = 1 << 30
) -> list[int]:
    """What an exact executor must produce for ``prompt`` (greedy, no cache)."""
    ctx = [int(t) for t in prompt]
    out: list[int] = []
    while len(out) < max_new_tokens and len(ctx) < max_context_len:
        tok = next_token(np.asarray(ctx, dtype=np.int32))
        out.append(tok)
        ctx.append(tok)
        if tok in eos:
            break
    return out


class StandInExecutor:
    def __init__(self, num_pages: int, page_size: int, max_slots: int, max_pages_per_req: int) -> None:
        self.page_size = page_size
        self.kv = np.full((num_pages, page_size), -1, dtype=np.int64)
        self.tables = np.full((max_slots, max_pages_per_req), -1, dtype=np.int64)
        self.steps = 0
        self.tokens_computed = 0
        self.shared_reads = 0  # tokens a group's requests did not each have to read

    def __call__(self, fwd: ForwardBatch) -> StepResult:
        # the batch crosses a process boundary in production: do the same here
        fwd = decode(encode(fwd))
        ps = self.page_size
        pages = fwd.table_pages
        offset = 0
        for slot, start, count in zip(fwd.table_slots, fwd.table_starts, fwd.table_counts):
            self.tables[slot, start : start + count] = pages[offset : offset + count]
            offset += count
        assert offset == len(pages), "page-table deltas do not add up"
        out = np.zeros(len(fwd.slots), dtype=np.int32)
        first = 0
        for i, (slot, prefix, extend) in enumerate(zip(fwd.slots, fwd.prefix_lens, fwd.extend_lens)):
            new = fwd.input_ids[first : first + extend]
            pos = fwd.positions[first : first + extend]
            first += extend
            assert np.array_equal(pos, np.arange(prefix, prefix + extend)), "positions are not contiguous"
            table = self.tables[slot]
            self.kv[table[pos // ps], pos % ps] = new
            ctx_pos = np.arange(prefix + extend)
            ctx_pages = table[ctx_pos // ps]
            assert (ctx_pages >= 0).all(), "context reads an unset page-table entry"
            out[i] = next_token(self.kv[ctx_pages, ctx_pos % ps].astype(np.int32))
        assert first == len(fwd.input_ids)
        self._check_groups(fwd)
        self.steps += 1
        self.tokens_computed += int(fwd.extend_lens.sum())
        return StepResult(step_id=fwd.step_id, next_token_ids=out)

    def _check_groups(self, fwd: ForwardBatch) -> None:
        if fwd.prefix_groups is None:
            assert fwd.prefix_group_lens is None
            return
        ps = self.page_size
        for g, length in enumerate(fwd.prefix_group_lens.tolist()):
            members = np.flatnonzero(fwd.prefix_groups == g)
            assert len(members) >= 2 and 0 < length and length % ps == 0, "a group is two requests sharing pages"
            assert (fwd.prefix_lens[members] >= length).all(), "a shared prefix must be computed already"
            tables = self.tables[fwd.slots[members], : length // ps]
            assert (tables == tables[0]).all(), "a group's requests must share the prefix's pages"
            self.shared_reads += length * (len(members) - 1)
