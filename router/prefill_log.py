"""SGLang's INFO line for each prefill step, the one users grep to see the cache at work:
``Prefill batch. #new-seq: 2, #new-token: 96, #cached-token: 620, token usage: 0.03,
#running-req: 4, #queue-req: 0`` (its fields: the requests it prefills, a chunked prompt's later
chunks included as SGLang counts them, the prompt tokens it computes, what the cache gave the
requests whose prefill starts here, the KV pool's share in use)."""

from __future__ import annotations

import logging

from radixcluster.protocol import ForwardBatch
from radixcluster.router.request import ReqState, Request

logger = logging.getLogger(__name__)


def log_prefill(forward: ForwardBatch, requests: list[Request], running: int, queued: int, pool_used: float) -> None:
    """One line for a prefill step (``requests`` in the batch's order, decoding riders after)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    new_seqs = new_tokens = cached = 0
    for req, prefix_len, extend_len in zip(requests, forward.prefix_lens, forward.extend_lens):
        if req.state is not ReqState.PREFILLING:
            continue  # a running request's next token, riding along
        new_seqs += 1
        new_tokens += int(extend_len)
        if prefix_len == req.cached_tokens:  # its first chunk: what it found in the cache
            cached += int(prefix_len)
    logger.info(
        "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f, "
        "#running-req: %d, #queue-req: %d",
        new_seqs,
        new_tokens,
        cached,
        pool_used,
        running,
        queued,
    )
