"""One rank's model step: mirror the page tables, run the forward pass over the paged KV
cache, and (on rank 0) sample the next tokens into a ``StepResult``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from radixcluster.kernels.attention import build_attention_metadata
from radixcluster.kernels.attention_backend import select_attention_backend
from radixcluster.model_config import load_model_config
from radixcluster.protocol import ForwardBatch, StepResult
from radixcluster.worker.kv_pool import KVPool
from radixcluster.worker.llama import LlamaForCausalLM
from radixcluster.worker.packed_linear import prepare_linears
from radixcluster.worker.parallel import TPGroup
from radixcluster.worker.sampler import sample
from radixcluster.worker.weights import iter_weights

logger = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class RunnerConfig:
    """What one rank runs: the model, its place in the TP group, and the KV pool's size.
    ``dtype`` None means float32 on CPU, bfloat16 on CUDA; ``kv_cache_dtype`` None means
    ``dtype``, or an fp8 one; ``attention_backend`` is
    ``auto`` (Triton on CUDA, the native kernels on the CPU when they build, else torch),
    ``torch``, ``native`` or ``triton``; ``prepack_weights`` adds oneDNN-packed copies of
    the linear weights on CPU, and the native backend brings its one-row product (packed_linear.py);
    ``random_seed`` seeds the generator that requests without a seed of their own sample from."""

    model_path: Path
    tp_rank: int = 0
    tp_size: int = 1
    num_pages: int
    page_size: int
    max_slots: int
    max_context_len: int
    dtype: torch.dtype | None = None
    kv_cache_dtype: torch.dtype | None = None
    device: str = "cpu"
    attention_backend: str = "auto"
    prepack_weights: bool = True
    random_seed: int | None = None


@dataclass(slots=True)
class _Logits:
    last: torch.Tensor  # float32 [B, V]: at each request's last new token
    prompt: torch.Tensor  # float32 [P, V]: at the prompt positions whose logprob is asked
    prompt_targets: torch.Tensor  # int64 [P]: the prompt token each of those predicts


class ModelRunner:
    """Holds this rank's model shard and KV pool. With ``tp_size > 1`` the caller has
    initialised the default process group (``init_tensor_parallel``), and every rank calls
    ``forward``/``step`` with the same batch."""

    def __init__(self, config: RunnerConfig, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """``weights``: full checkpoint tensors by transformers name; None reads
        ``config.model_path`` with ``iter_weights``."""
        self.config = config
        self.model_config = load_model_config(config.model_path)
        self.device = torch.device(config.device)
        self.dtype = config.dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tp = TPGroup(config.tp_rank, config.tp_size)
        self.attention = select_attention_backend(self.device, config.attention_backend, self.model_config.head_dim)
        _check_fp8_on_the_gpu(config.kv_cache_dtype, self.device, self.attention.name)
        detail = f" ({self.attention.detail})" if self.attention.detail else ""
        logger.info("rank %d runs the %s attention path%s", config.tp_rank, self.attention.name, detail)
        with torch.device(self.device):
            self.model = LlamaForCausalLM(self.model_config, self.tp, self.attention)
        self.model.to(self.dtype).eval()
        with torch.inference_mode():
            self.model.load_weights(
                weights if weights is not None else iter_weights(config.model_path, self.model_config)
            )
        if self.device.type == "cpu":
            prepare_linears(self.model, config.prepack_weights, self.attention.layer_ops)
        self.kv_pool = KVPool(
            num_layers=self.model_config.num_layers,
            num_pages=config.num_pages,
            page_size=config.page_size,
            num_kv_heads=self.model.model.local_kv_heads,
            head_dim=self.model_config.head_dim,
            max_slots=config.max_slots,
            max_pages_per_request=-(-config.max_context_len // config.page_size),
            dtype=config.kv_cache_dtype or self.dtype,
            device=self.device,
        )
        if config.random_seed is not None:
            torch.manual_seed(config.random_seed)  # last: building the model draws from the generator

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | None:
        """Apply the batch's page-table deltas and run it; the float32 logits ``[B, V]`` of
        each request's last new token on rank 0, None on other ranks."""
        logits = self._run(batch)
        return None if logits is None else logits.last

    @torch.inference_mode()
    def step(self, batch: ForwardBatch) -> StepResult | None:
        """``forward``, then sampling on rank 0 (None on other ranks). With
        ``batch.logprob_starts``, ``input_logprobs`` holds, request after request, the
        logprob of the next prompt token at each new position from the request's start
        on, its last new token excepted unless ``batch.logprob_next_ids`` names the token
        after it."""
        logits = self._run(batch)
        if logits is None:
            return None
        positions = _tensor(batch.prefix_lens.astype(np.int64) + batch.extend_lens, torch.int64, self.device)
        mask = None if batch.vocab_mask is None else _tensor(batch.vocab_mask, torch.int32, self.device)
        out = sample(logits.last, batch.sampling, positions, mask)
        input_logprobs = input_top_ids = input_top_values = None
        if batch.logprob_starts is not None:
            prompt_logp = torch.log_softmax(logits.prompt, dim=-1)
            input_logprobs = _numpy(prompt_logp.gather(1, logits.prompt_targets[:, None])[:, 0], np.float32)
            k = int(np.max(batch.sampling.top_logprobs_num[batch.logprob_starts >= 0], initial=0))
            if k > 0:
                values, ids = prompt_logp.topk(k, dim=-1)
                input_top_ids, input_top_values = _numpy(ids, np.int32), _numpy(values, np.float32)
        return StepResult(
            step_id=batch.step_id,
            next_token_ids=out.next_token_ids.cpu().numpy().astype(np.int32),
            logprobs=_numpy(out.logprobs, np.float32),
            top_logprob_ids=_numpy(out.top_logprob_ids, np.int32),
            top_logprob_values=_numpy(out.top_logprob_values, np.float32),
            input_logprobs=input_logprobs,
            input_top_logprob_ids=input_top_ids,
            input_top_logprob_values=input_top_values,
        )

    def _run(self, batch: ForwardBatch) -> _Logits | None:
        self.kv_pool.apply_deltas(batch)
        meta = build_attention_metadata(
            self.kv_pool.rows(batch.slots),
            torch.tensor(batch.prefix_lens),
            torch.tensor(batch.extend_lens),
            self.config.page_size,
            self.device,
            gather_rows=self.attention.gather_rows,
            shared_groups=batch.prefix_groups,
            shared_lens=batch.prefix_group_lens,
        )
        last_rows = np.cumsum(batch.extend_lens, dtype=np.int64) - 1
        prompt_rows, targets = _prompt_rows(batch)
        input_ids = _tensor(batch.input_ids, torch.int64, self.device)
        logits = self.model(
            input_ids,
            _tensor(batch.positions, torch.int64, self.device),
            meta,
            self.kv_pool,
            _tensor(np.concatenate([last_rows, prompt_rows]), torch.int64, self.device),
        )
        if logits is None:
            return None
        logits = logits.float()
        num_requests = len(last_rows)
        return _Logits(logits[:num_requests], logits[num_requests:], _tensor(targets, torch.int64, self.device))


def _prompt_rows(batch: ForwardBatch) -> tuple[np.ndarray, np.ndarray]:
    """Token rows whose next prompt token's logprob is asked, and that token: per request,
    its new tokens from its logprob start up to its last, which only counts when
    ``logprob_next_ids`` names the token after it."""
    if batch.logprob_starts is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    extend_lens = batch.extend_lens
    ends = np.cumsum(extend_lens, dtype=np.int64)
    next_ids = batch.logprob_next_ids
    assert next_ids is not None, "logprob_next_ids comes with logprob_starts"
    # the token after each row: the next row's, or at a request's last row its logprob_next_id
    following = np.append(batch.input_ids[1:], -1).astype(np.int64)
    following[ends - 1] = next_ids
    spans = [
        np.arange(end - length + start, end - (nxt < 0), dtype=np.int64)
        for end, start, length, nxt in zip(
            ends.tolist(), batch.logprob_starts.tolist(), extend_lens.tolist(), next_ids.tolist()
        )
        if start >= 0
    ]
    rows = np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)
    return rows, following[rows]


def _tensor(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # a copy: arrays decoded from a frame are read-only views of it
    return torch.tensor(array, dtype=dtype, device=device)


def _numpy(x: torch.Tensor | None, dtype: type) -> np.ndarray | None:
    return None if x is None else x.cpu().numpy().astype(dtype)


def _check_fp8_on_the_gpu(kv_cache_dtype: torch.dtype | None, device: torch.device, backend: str) -> None:
    """Triton converts to e4m3 on compute capability 8.9 and later only (e5m2 everywhere)."""
    if kv_cache_dtype != torch.float8_e4m3fn or backend != "triton" or device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise ValueError(
            f"--kv-cache-dtype fp8_e4m3 on the Triton kernels needs a GPU of compute capability 8.9 or later, "
            f"this one is {capability[0]}.{capability[1]}: use fp8_e5m2"
        )
