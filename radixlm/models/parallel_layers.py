"""Tensor-parallel layers: column/row-parallel linear, vocab-parallel embedding, LM head.

Each layer takes a `ParallelContext` and holds only its rank's slice of the weight; its
`load(param_name, full_tensor, shard)` copies that slice out of a whole checkpoint tensor
(so loaders stay rank-agnostic and a rank never keeps more than one full tensor at a
time). With `tp_size == 1` the slice is the whole tensor and no collective runs: the
layers compute exactly what nn.Linear / nn.Embedding compute.

Megatron pairing (one all-reduce per pair): a ColumnParallelLinear splits the output
features, so its rank holds a block of heads / intermediate features, and the
RowParallelLinear after it splits its input features the same way; each rank computes a
partial sum of the output and the all-reduce adds them. Bias of a row-parallel layer is
added once, after the all-reduce.

More: docs/models.md, "models/parallel_layers.py".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.models.linear import (Int4Groups, Int8Groups, LinearMethod, LinearPolicy,
                                   QuantizedCheckpointTensor, as_dense, make_linear_method)
from radixlm.models.parallel_context import ParallelContext, kv_head_range, split_evenly

CheckpointTensor = "torch.Tensor | QuantizedCheckpointTensor"


@dataclass(frozen=True)
class ColumnShard:
    """One checkpoint tensor of a (possibly fused) column-parallel layer.

    The checkpoint tensor has `full_rows` output rows; this rank keeps rows
    [start, end) of it, stored at the next free rows of the local fused weight (shards
    are laid out in the order given).
    """
    name: str | None
    full_rows: int
    start: int
    end: int


def even_shard(name: str | None, full_rows: int, ctx: ParallelContext, what: str) -> ColumnShard:
    """Rows split evenly: rank r keeps [r*n, (r+1)*n) with n = full_rows / tp."""
    n = split_evenly(full_rows, ctx.tp_size, what)
    return ColumnShard(name, full_rows, ctx.tp_rank * n, (ctx.tp_rank + 1) * n)


def qkv_shards(num_heads: int, num_kv_heads: int, head_dim: int,
               ctx: ParallelContext) -> list[ColumnShard]:
    """q, k, v of a GQA attention: Q heads split evenly; KV heads split, or replicated when
    there are fewer than ranks (`kv_head_range`), so a rank holds the KV heads its Q heads
    use. Rows of head i are [i*head_dim, (i+1)*head_dim)."""
    q = even_shard("q", num_heads * head_dim, ctx, "attention heads")
    k0, k1 = kv_head_range(num_kv_heads, ctx.tp_size, ctx.tp_rank)
    kv_rows = num_kv_heads * head_dim
    return [q, ColumnShard("k", kv_rows, k0 * head_dim, k1 * head_dim),
            ColumnShard("v", kv_rows, k0 * head_dim, k1 * head_dim)]


class _ShardedLinear(nn.Module):
    """weight [out_local, in_local] (+ bias [out_local or out]) until `finalize_linear`,
    then `method`. `_int4` / `_int8` collect the exact int4 / int8 groups of the loaded
    pieces (None for a piece loaded otherwise: then the layer has no complete such form)."""

    def __init__(self, in_local: int, out_local: int, bias_size: int | None,
                 ctx: ParallelContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.weight = nn.Parameter(torch.empty(out_local, in_local))
        self.bias = nn.Parameter(torch.empty(bias_size)) if bias_size is not None else None
        self.method: LinearMethod | None = None
        # method.forward as a plain attribute: a submodule's lookup goes through
        # nn.Module.__getattr__ (121 GEMMs per decode step).
        self.method_forward: Callable[..., torch.Tensor] | None = None
        # method.gated_act_mul where the method fuses act(gate) * up and there is no bias
        # (read by GatedMLP once per call), else None.
        self.method_gated: Callable[..., torch.Tensor | None] | None = None
        self._int4: dict[str | None, Int4Groups | None] = {}
        self._int8: dict[str | None, Int8Groups | None] = {}

    def _gemm(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        forward = self.method_forward
        if forward is None:
            return F.linear(x, self.weight, bias)
        # .forward, not __call__: methods have no hooks, and nn.Module's call path costs
        # a few microseconds x 121 GEMMs per step.
        return forward(x, bias)

    def _int4_weight(self) -> Int4Groups | None:
        """The whole local weight's int4 groups, or None unless every piece had them."""
        raise NotImplementedError

    def _int8_weight(self) -> Int8Groups | None:
        """The whole local weight's int8 groups, or None unless every piece had them."""
        raise NotImplementedError

    @torch.no_grad()
    def finalize_linear(self, policy: LinearPolicy) -> None:
        """Build the method from the loaded weight; the method owns it from now on."""
        if self.method is not None:
            return
        self.method = make_linear_method(self.weight.data, self._int4_weight(), policy,
                                         int8=self._int8_weight())
        self.method_forward = self.method.forward
        self.method_gated = self.method.gated_act_mul if self.bias is None else None
        self._int4, self._int8 = {}, {}
        self.weight = None


class ColumnParallelLinear(_ShardedLinear):
    """y_local = x @ W_local.T + b_local: the rank's slice of the output features, not
    gathered (the next layer consumes it split). `shards` lists the checkpoint tensors
    fused into this layer (e.g. q, k, v), each contributing its rows [start, end)."""

    def __init__(self, in_features: int, shards: Sequence[ColumnShard], bias: bool,
                 ctx: ParallelContext) -> None:
        out_local = sum(s.end - s.start for s in shards)
        super().__init__(in_features, out_local, out_local if bias else None, ctx)
        self.in_features = in_features
        self.shards = {s.name: s for s in shards}
        # Shard name -> first local row; shard rows are contiguous in the given order.
        self.offsets: dict[str | None, int] = {}
        row = 0
        for s in shards:
            self.offsets[s.name] = row
            row += s.end - s.start
        self.local_sizes = [s.end - s.start for s in shards]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._gemm(x, self.bias)

    @torch.no_grad()
    def load(self, param_name: str, tensor: CheckpointTensor, shard: str | None) -> None:
        s = self.shards[shard]
        want = (s.full_rows, self.in_features) if param_name == "weight" else (s.full_rows,)
        _check_shape(tensor, want, shard)
        dst = getattr(self, param_name).data
        off = self.offsets[shard]
        dst[off:off + s.end - s.start].copy_(as_dense(tensor)[s.start:s.end])
        if param_name == "weight":
            q = tensor if isinstance(tensor, QuantizedCheckpointTensor) else None
            self._int4[shard] = q.int4.rows(s.start, s.end) if q and q.int4 else None
            self._int8[shard] = q.int8.rows(s.start, s.end) if q and q.int8 else None

    def _int4_weight(self) -> Int4Groups | None:
        # Shards are stacked in the order given (self.offsets): concatenate their rows.
        parts = [self._int4.get(name) for name in self.shards]
        if not parts or any(p is None for p in parts):
            return None
        return Int4Groups(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]),
                          torch.cat([p.m for p in parts]), parts[0].group_size)

    def _int8_weight(self) -> Int8Groups | None:
        parts = [self._int8.get(name) for name in self.shards]
        if not parts or any(p is None for p in parts):
            return None
        return Int8Groups.cat(parts)


class RowParallelLinear(_ShardedLinear):
    """y = all_reduce(x_local @ W_local.T) + b: x arrives split along its features (rank r
    holds features [r*n, (r+1)*n), n = in_features / tp), W is split the same way along
    dim 1; the bias is replicated and added once, after the sum. `reduce=False`: the
    rank's partial sum (no bias allowed), which the caller all-reduces (MoE experts)."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 ctx: ParallelContext, what: str = "input features",
                 reduce: bool = True) -> None:
        self.in_local = split_evenly(in_features, ctx.tp_size, what)
        if bias and not reduce:
            raise ValueError("a row-parallel layer without its all-reduce takes no bias")
        super().__init__(self.in_local, out_features, out_features if bias else None, ctx)
        self.in_features, self.out_features = in_features, out_features
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ctx.is_parallel or not self.reduce:
            return self._gemm(x, self.bias)
        y = self.ctx.all_reduce(self._gemm(x, None))
        return y + self.bias if self.bias is not None else y

    @torch.no_grad()
    def load(self, param_name: str, tensor: CheckpointTensor, shard: str | None) -> None:
        if param_name == "bias":
            _check_shape(tensor, (self.out_features,), shard)
            self.bias.data.copy_(as_dense(tensor))
            return
        _check_shape(tensor, (self.out_features, self.in_features), shard)
        c0 = self.ctx.tp_rank * self.in_local
        self.weight.data.copy_(as_dense(tensor)[:, c0:c0 + self.in_local])
        # An input-feature shard that cuts through a group has no int4 form (dense).
        q = tensor if isinstance(tensor, QuantizedCheckpointTensor) else None
        self._int4[None] = q.int4.cols(c0, c0 + self.in_local) if q and q.int4 else None
        self._int8[None] = q.int8.cols(c0, c0 + self.in_local) if q and q.int8 else None

    def _int4_weight(self) -> Int4Groups | None:
        return self._int4.get(None)

    def _int8_weight(self) -> Int8Groups | None:
        return self._int8.get(None)


class _VocabSharded(nn.Module):
    """weight [n, hidden], n = ceil(vocab / tp): rank r holds the rows of token ids
    [r*n, min((r+1)*n, vocab)); the last rank's rows past the vocabulary are zero padding
    (never looked up; their logits are cut off after the gather). `int8`: the table's exact
    int8 groups when the checkpoint had them and there is one rank (the LM head's method
    may then own them: `use_quantized_rows`, and the weight is dropped)."""

    def __init__(self, vocab_size: int, hidden_size: int, ctx: ParallelContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.rows_per_rank = -(-vocab_size // ctx.tp_size)
        self.vocab_start = ctx.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, vocab_size)
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size))
        self.int8: Int8Groups | None = None
        # Set by use_quantized_rows: lookups read this method's rows (no dense table).
        self.rows_method: LinearMethod | None = None

    @torch.no_grad()
    def load(self, param_name: str, tensor: CheckpointTensor, shard: str | None) -> None:
        _check_shape(tensor, (self.vocab_size, self.hidden_size), shard)
        if isinstance(tensor, QuantizedCheckpointTensor) and not self.ctx.is_parallel:
            self.int8 = tensor.int8
        tensor = as_dense(tensor)
        n = max(0, self.vocab_end - self.vocab_start)
        self.weight.data[:n].copy_(tensor[self.vocab_start:self.vocab_start + n])
        self.weight.data[n:].zero_()


class VocabParallelEmbedding(_VocabSharded):
    def use_quantized_rows(self, method: LinearMethod) -> None:
        """Look rows up in `method` (with a `lookup(ids, dtype)`, e.g. the tied head's
        Int8GroupwiseLinear) and drop the dense table."""
        self.rows_method = method
        self.dtype = self.weight.dtype
        self.weight = None
        self.int8 = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.rows_method is not None:
            return self.rows_method.lookup(ids, self.dtype)
        if not self.ctx.is_parallel:
            return F.embedding(ids, self.weight)
        # Ids outside this rank's range look up row 0 and are zeroed; exactly one rank
        # owns each id, so the sum over ranks is that rank's row (plus exact zeros).
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = torch.where(outside, torch.zeros_like(ids), ids - self.vocab_start)
        out = F.embedding(local, self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.ctx.all_reduce(out)


class ParallelLMHead(_VocabSharded):
    """The untied output projection, sharded like the embedding; `parallel_logits` runs it
    (a tied model passes the VocabParallelEmbedding's weight instead)."""


def parallel_logits(hidden: torch.Tensor, method: LinearMethod, vocab_size: int,
                    ctx: ParallelContext) -> torch.Tensor:
    """Logits [T, vocab] on every rank: each rank projects onto its vocabulary rows
    (`method` holds this rank's [n, hidden] rows), the all-gather concatenates the ranks'
    columns in rank order (rank r's at [r*n, (r+1)*n), the ids it owns), the padding
    columns are cut off."""
    local = method.forward(hidden)
    if not ctx.is_parallel:
        return local
    return ctx.all_gather_last_dim(local)[..., :vocab_size]


def _check_shape(tensor: torch.Tensor, want: tuple[int, ...], shard: str | None) -> None:
    if tuple(tensor.shape) != tuple(want):
        raise ValueError(f"shape mismatch{f' for shard {shard}' if shard else ''}: "
                         f"checkpoint {tuple(tensor.shape)}, expected {tuple(want)}")
