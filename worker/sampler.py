"""Next-token sampling on TP rank 0: vocab mask, logit biases, penalties, greedy or filtered
sampling, logprobs.

Semantics follow SGLang/vLLM. Per-request parameters come as host (numpy) arrays, so every
decision about which rows need which step is made on the host without a device sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixcluster.protocol import FLOAT32_MAX, SamplingBatch

_MASK64 = (1 << 64) - 1
# argmax_rows splits each row into blocks of the first of these sizes that divides it
_ARGMAX_BLOCKS = (512, 256, 128, 64)
# the logprob a top-K list shows for a token the grammar forbids
MASKED_LOGPROB = -9999.0


@dataclass(slots=True)
class SampleOutput:
    next_token_ids: torch.Tensor  # int64 [B]
    logprobs: torch.Tensor | None  # float32 [B], when params.return_logprob
    top_logprob_ids: torch.Tensor | None  # int64 [B, K], K = max(top_logprobs_num); None when K == 0
    top_logprob_values: torch.Tensor | None  # float32 [B, K]


def sample(
    logits: torch.Tensor, params: SamplingBatch, positions: torch.Tensor, vocab_mask: torch.Tensor | None
) -> SampleOutput:
    """Pick one token per row of ``logits`` (float32 [B, V]); never modifies ``logits``.

    Order: the vocab mask (disallowed tokens -> -inf), then each request's logit biases (added),
    then penalties over each request's output tokens so far (repetition, frequency, presence),
    then greedy argmax for rows with
    temperature 0 or top_k 1, or, for the others, softmax(logits / temperature) filtered by
    top_k, top_p (over the top_k survivors, renormalized) and min_p, and one draw. A mask row
    must allow at least one token.

    A row with ``seed != -1`` draws from noise that depends only on (seed, position, V), so the
    same seed at the same position gives the same token whatever else is in the batch; other
    rows use torch's global generator.

    Logprobs are those of the distribution the grammar allows: log_softmax of the logits after
    the vocab mask, before biases, penalties and temperature (as SGLang and vLLM give them), at
    the chosen token and for the top K; a token the mask forbids reads MASKED_LOGPROB (vLLM's
    value: JSON has no -inf).
    """
    allowed = logits if vocab_mask is None else apply_vocab_mask(logits, vocab_mask)
    x = apply_penalties(apply_logit_bias(allowed, params), params)
    next_ids = argmax_rows(x)
    sampled_rows = np.flatnonzero((params.temperature > 0) & (params.top_k != 1))
    if sampled_rows.size:
        rows = torch.from_numpy(sampled_rows).to(logits.device)
        drawn = _draw(x.index_select(0, rows), params, sampled_rows, positions)
        next_ids = next_ids.index_copy(0, rows, drawn)
    return _with_logprobs(allowed, next_ids, params)


def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> torch.Tensor:
    """Set to -inf every token whose bit is clear in ``vocab_mask`` (int32 [B, ceil(V/32)],
    bit j of word w allows token 32*w + j, xgrammar's layout)."""
    vocab = logits.shape[-1]
    if vocab_mask.shape[-1] * 32 < vocab:
        raise ValueError(f"vocab mask has {vocab_mask.shape[-1]} words, {vocab} tokens need {-(-vocab // 32)}")
    shifts = torch.arange(32, device=vocab_mask.device, dtype=torch.int32)
    bits = (vocab_mask.unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(vocab_mask.shape[0], -1)[:, :vocab].bool().to(logits.device)
    return logits.masked_fill(~allowed, float("-inf"))


def apply_logit_bias(logits: torch.Tensor, params: SamplingBatch) -> torch.Tensor:
    """Add each request's biases (``bias_ids``/``bias_values`` segments) to its row's logits.
    Returns ``logits`` itself when no row has one, a new tensor otherwise."""
    if params.bias_ids.size == 0:
        return logits
    device = logits.device
    rows = np.repeat(np.arange(params.bias_lens.size), params.bias_lens)
    return logits.index_put(
        (_tensor(rows, torch.int64, device), _tensor(params.bias_ids, torch.int64, device)),
        _tensor(params.bias_values, logits.dtype, device),
        accumulate=True,
    )


def apply_penalties(logits: torch.Tensor, params: SamplingBatch) -> torch.Tensor:
    """Penalize tokens each request already produced (``penalty_ids`` segments), and for the
    repetition penalty the tokens of its prompt too (``prompt_penalty_ids``), as transformers,
    vLLM and SGLang do.

    Repetition (HF/CTRL): a seen token's logit is divided by p if positive, multiplied by p
    otherwise. Then frequency subtracts p * count and presence subtracts p once, counting output
    tokens only (OpenAI's definition). Returns ``logits`` itself when no row has an active
    penalty, a new tensor otherwise.
    """
    lens = np.asarray(params.penalty_lens, dtype=np.int64)
    prompt_lens = np.asarray(params.prompt_penalty_lens, dtype=np.int64)
    repetition = params.repetition_penalty != 1
    active = ((lens > 0) & (repetition | (params.frequency_penalty != 0) | (params.presence_penalty != 0))) | (
        (prompt_lens > 0) & repetition
    )
    if not active.any():
        return logits
    device = logits.device
    rows_np = np.flatnonzero(active)
    counts = _counts(params.penalty_ids, lens, active, logits)
    seen = counts > 0
    repeated = seen | (_counts(params.prompt_penalty_ids, prompt_lens, active, logits) > 0)
    rows = _tensor(rows_np, torch.int64, device)
    sub = logits.index_select(0, rows)
    rep = _tensor(params.repetition_penalty[rows_np], logits.dtype, device).unsqueeze(1)
    # a penalty near 0 divides a positive logit past float32's range: inf would make the draw's
    # softmax nan, so it stops at the largest float (the penalized tokens then tie, as in the limit)
    boosted = (sub / rep).clamp(max=FLOAT32_MAX)
    sub = torch.where(repeated, torch.where(sub > 0, boosted, sub * rep), sub)
    sub = sub - _tensor(params.frequency_penalty[rows_np], logits.dtype, device).unsqueeze(1) * counts
    sub = sub - _tensor(params.presence_penalty[rows_np], logits.dtype, device).unsqueeze(1) * seen
    return logits.index_copy(0, rows, sub)


def _counts(ids: np.ndarray, lens: np.ndarray, active: np.ndarray, logits: torch.Tensor) -> torch.Tensor:
    """[active rows, vocab]: how often each token occurs in each active row's segment of ``ids``
    (segments of ``lens`` tokens, request after request)."""
    owner = np.repeat(np.arange(lens.size), lens)
    keep = active[owner]
    # compact row index of each kept id: its owner's rank among the active rows
    compact = np.cumsum(active) - 1
    counts = torch.zeros(int(active.sum()), logits.shape[-1], device=logits.device, dtype=logits.dtype)
    counts.index_put_(
        (_tensor(compact[owner[keep]], torch.int64, logits.device), _tensor(ids[keep], torch.int64, logits.device)),
        torch.ones(int(keep.sum()), device=logits.device, dtype=logits.dtype),
        accumulate=True,
    )
    return counts


def filtered_probs(
    logits: torch.Tensor, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray
) -> torch.Tensor:
    """softmax(logits / temperature) with the tokens top_k, top_p and min_p drop set to 0,
    not renormalized (the draw is scale-free). Parameters are numpy [B]; top_k <= 0 is off."""
    device = logits.device
    # each row's maximum to 0 first: a temperature near 0 then sends the other logits to -inf
    # (the limit, greedy) where dividing first would send several to inf (inf - inf is nan)
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted / _tensor(temperature, logits.dtype, device).unsqueeze(1), dim=-1)
    vocab = probs.shape[-1]
    use_top_k = (top_k > 0) & (top_k < vocab)
    use_top_p = top_p < 1
    if use_top_k.any() or use_top_p.any():
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        ks = _tensor(np.where(use_top_k, top_k, vocab), torch.int64, device).unsqueeze(1)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        sorted_probs = sorted_probs.masked_fill(ranks >= ks, 0.0)
        cumulative = sorted_probs.cumsum(dim=-1)
        # a token stays while the mass strictly before it is under top_p of the top_k mass;
        # the most likely token always stays
        ps = _tensor(np.where(use_top_p, top_p, 2.0), logits.dtype, device).unsqueeze(1)
        beyond_p = (cumulative - sorted_probs >= ps * cumulative[:, -1:]) & (ranks > 0)
        sorted_probs = sorted_probs.masked_fill(beyond_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    if (min_p > 0).any():
        floor = _tensor(min_p, logits.dtype, device).unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
    return probs


def _draw(logits: torch.Tensor, params: SamplingBatch, rows: np.ndarray, positions: torch.Tensor) -> torch.Tensor:
    """One token for each of ``logits``' rows (batch rows ``rows``) by the exponential race:
    argmax(p / E) with E ~ Exp(1) i.i.d. picks token i with probability p_i / sum(p)."""
    probs = filtered_probs(logits, params.temperature[rows], params.top_k[rows], params.top_p[rows], params.min_p[rows])
    noise = torch.empty_like(probs).exponential_()
    seeds = params.seed[rows]
    seeded = np.flatnonzero(seeds != -1)
    if seeded.size:
        generator = torch.Generator(device=probs.device)
        seeded_positions = positions[torch.from_numpy(rows[seeded]).to(positions.device)].tolist()
        for i, position in zip(seeded.tolist(), seeded_positions):
            generator.manual_seed(row_seed(int(seeds[i]), int(position)))
            noise[i].exponential_(generator=generator)
    # E == 0 would turn a filtered 0 into 0/0 = nan, which argmax would pick
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return argmax_rows(probs / noise)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of a 2-D tensor, first maximum (NaN counting as the largest), in two
    vectorised passes: torch's CPU argmax over a long row runs a scalar loop, 5-8x slower than
    taking each block's max, then the argmax of the first block that holds the row's max."""
    rows, width = x.shape
    block = next((b for b in _ARGMAX_BLOCKS if width % b == 0 and width > b), None)
    if block is None:
        return x.argmax(dim=-1)
    blocks = x.view(rows, width // block, block)
    first_block = blocks.amax(dim=-1).argmax(dim=-1)
    within = blocks[torch.arange(rows, device=x.device), first_block].argmax(dim=-1)
    return first_block * block + within


def row_seed(seed: int, position: int) -> int:
    """A well-mixed 63-bit generator seed for (request seed, position) (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def _with_logprobs(logits: torch.Tensor, next_ids: torch.Tensor, params: SamplingBatch) -> SampleOutput:
    k = int(np.max(params.top_logprobs_num, initial=0))
    if not params.return_logprob and k == 0:
        return SampleOutput(next_ids, None, None, None)
    logp = torch.log_softmax(logits.float(), dim=-1).clamp_(min=MASKED_LOGPROB)
    chosen = logp.gather(1, next_ids.unsqueeze(1)).squeeze(1) if params.return_logprob else None
    if k == 0:
        return SampleOutput(next_ids, chosen, None, None)
    values, ids = logp.topk(k, dim=-1)
    return SampleOutput(next_ids, chosen, ids, values)


def _tensor(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # copies: arrays decoded from msgpack are read-only views of the frame
    return torch.tensor(np.asarray(array), dtype=dtype, device=device)
