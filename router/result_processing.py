"""Turns a StepResult into request state: sampled tokens, output and prompt logprobs."""

from __future__ import annotations

from typing import Any

from radixcluster.protocol import StepResult
from radixcluster.router.batch_builder import ScheduledBatch
from radixcluster.router.request import Request


def apply_token(req: Request, token: int, i: int, result: StepResult, max_context_len: int) -> dict[str, Any] | None:
    """Append request ``i``'s sampled token (and its logprobs), advance its grammar; return
    its finish reason (a grammar that ended is a stop, whatever ignore_eos or min_new_tokens say)."""
    req.output_ids.append(token)
    if req.return_logprob and result.logprobs is not None:
        top: list[list[Any]] = []
        k = req.top_logprobs_num
        if k and result.top_logprob_ids is not None and result.top_logprob_values is not None:
            ids = result.top_logprob_ids[i, :k].tolist()
            values = result.top_logprob_values[i, :k].tolist()
            top = [[v, t] for v, t in zip(values, ids)]
        req.output_logprobs.append([float(result.logprobs[i]), token, top])
    ended = None if req.grammar is None else req.grammar.accept(token)
    return ended or req.check_finish(max_context_len)


def record_input_logprobs(batch: ScheduledBatch, result: StepResult) -> None:
    """Store the prompt logprobs of a prefill step. The worker returns, request after request,
    one value per new token from that request's ``logprob_starts`` entry on, its last new
    token excepted unless ``logprob_next_ids`` names the prompt token after it (a chunk of
    the prompt). ``req.input_logprobs[i]`` scores prompt token ``logprob_start_len + 1 + i``;
    the list is complete once the prefill is."""
    fwd = batch.forward
    if fwd.logprob_starts is None or result.input_logprobs is None:
        return
    values = result.input_logprobs
    assert fwd.logprob_next_ids is not None, "logprob_next_ids comes with logprob_starts"
    next_ids = fwd.logprob_next_ids.tolist()
    offset = 0
    for req, start, prefix, extend, next_id in zip(
        batch.requests, fwd.logprob_starts.tolist(), fwd.prefix_lens.tolist(), fwd.extend_lens.tolist(), next_ids
    ):
        if start < 0:
            continue
        n = max(0, extend - 1 - start) + (next_id >= 0)
        first, end = prefix + start, prefix + extend
        # keep positions whose next token is a prompt token: value i scores prompt token first + i + 1
        keep = max(0, min(n, req.prompt_len - 1 - first))
        if not req.finished:
            req.input_logprobs.extend(values[offset : offset + keep].tolist())
            if req.top_logprobs_num and result.input_top_logprob_ids is not None:
                req.input_top_logprobs.extend(_top_rows(result, offset, keep, req.top_logprobs_num))
            req.input_logprob_next = min(end, req.prompt_len)
        offset += n


def _top_rows(result: StepResult, offset: int, count: int, k: int) -> list[list[list[Any]] | None]:
    """``[[top logprob, top id], ...]`` (``k`` of them) of input rows ``offset .. offset + count``."""
    assert result.input_top_logprob_ids is not None and result.input_top_logprob_values is not None
    ids = result.input_top_logprob_ids[offset : offset + count, :k].tolist()
    values = result.input_top_logprob_values[offset : offset + count, :k].tolist()
    return [[[v, t] for v, t in zip(vs, ts)] for vs, ts in zip(values, ids)]
