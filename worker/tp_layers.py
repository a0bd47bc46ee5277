"""Tensor-parallel layers; each parameter carries the ``weight_loader`` that cuts its shard.

Loaders receive the full (unsharded) checkpoint tensor, narrow it to this rank's part and
copy it in, casting to the parameter's dtype. Layers that multiply by a weight hold their
``fast`` paths once ``prepare_linears`` ran (worker/packed_linear.py), None before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixcluster.worker.packed_linear import FastLinear, linear
from radixcluster.worker.parallel import TPGroup, split_evenly


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """A replicated parameter: copy the whole tensor."""
    if param.shape != loaded.shape:
        raise ValueError(f"weight of shape {tuple(loaded.shape)} for a parameter of shape {tuple(param.shape)}")
    param.data.copy_(loaded)


def _param(*shape: int, loader) -> nn.Parameter:
    param = nn.Parameter(torch.empty(*shape), requires_grad=False)
    param.weight_loader = loader  # type: ignore[attr-defined]  # each parameter cuts its own shard
    return param


class MergedColumnParallelLinear(nn.Module):
    """``x @ [A_0; A_1; ...]^T``: each stacked matrix ``A_i`` (and its bias) split by output
    rows across ranks; a rank's output is its pieces side by side, no communication."""

    def __init__(self, in_features: int, out_features: list[int], bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.local_sizes = [split_evenly(n, tp.size, "a column-parallel output") for n in out_features]
        self.weight = _param(sum(self.local_sizes), in_features, loader=self.weight_loader)
        self.bias = _param(sum(self.local_sizes), loader=self.weight_loader) if bias else None
        self.fast: FastLinear | None = None

    def shard_start(self, shard: int) -> int:
        """First row of this rank's piece of matrix ``shard`` in the full checkpoint tensor."""
        return self.tp.rank * self.local_sizes[shard]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int) -> None:
        size = self.local_sizes[shard]
        offset = sum(self.local_sizes[:shard])
        param.data[offset : offset + size].copy_(loaded.narrow(0, self.shard_start(shard), size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.fast, self.bias)


class QKVParallelLinear(MergedColumnParallelLinear):
    """Merged Q, K, V projections split by heads; when ranks outnumber KV heads, each rank
    holds the one KV head its query heads read (KV heads replicated)."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, tp: TPGroup) -> None:
        split_evenly(num_heads, tp.size, "the number of attention heads")
        if tp.size > num_kv_heads:
            split_evenly(tp.size, num_kv_heads, "tp size (beyond the KV heads, each is replicated)")
        else:
            split_evenly(num_kv_heads, tp.size, "the number of KV heads")
        kv_replicas = max(1, tp.size // num_kv_heads)
        kv_out = num_kv_heads * kv_replicas * head_dim
        super().__init__(hidden, [num_heads * head_dim, kv_out, kv_out], bias, tp)
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim

    def shard_start(self, shard: int) -> int:
        if shard == 0:
            return super().shard_start(0)
        first_kv_head = self.tp.rank * self.num_kv_heads // self.tp.size
        return first_kv_head * self.head_dim


class RowParallelLinear(nn.Module):
    """``x @ W^T`` with ``W`` split by input columns: each rank multiplies its slice of ``x``
    and the partial sums are all-reduced."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.local_in = split_evenly(in_features, tp.size, "a row-parallel input")
        self.weight = _param(out_features, self.local_in, loader=self.weight_loader)
        self.fast: FastLinear | None = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded.narrow(1, self.tp.rank * self.local_in, self.local_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(linear(x, self.weight, self.fast))


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split across ranks (the last shard zero-padded): each rank looks up
    the ids it owns, zeros the rest, and the all-reduce assembles the rows."""

    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.shard_rows = -(-vocab_size // tp.size)
        self.start = tp.rank * self.shard_rows
        self.weight = _param(self.shard_rows, hidden, loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        rows = loaded[self.start : self.start + self.shard_rows]
        param.data.zero_()
        param.data[: len(rows)].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        owned = (local >= 0) & (local < self.shard_rows)
        out = F.embedding(local.masked_fill(~owned, 0), self.weight)
        out.masked_fill_(~owned[:, None], 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over this rank's vocabulary shard, gathered on rank 0 (None elsewhere).
    Tied embeddings share the embedding's shard instead of loading their own."""

    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup, tied_to: VocabParallelEmbedding | None) -> None:
        super().__init__(vocab_size, hidden, tp)
        if tied_to is not None:
            self.weight = tied_to.weight
        self.fast: FastLinear | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:  # type: ignore[override]  # rank 0 only
        logits = self.tp.gather_last_dim(linear(hidden, self.weight, self.fast))
        return None if logits is None else logits[:, : self.vocab_size]
