"""Sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router and E gated experts.

Routing (per token): softmax over the router's E logits in float32, the top k
probabilities, renormalized to sum to 1 when `norm_topk_prob` (Mixtral always; Qwen3-MoE
per its config), cast back to the hidden dtype.

Experts run per token group, not per token: the T*k (token, expert) assignments are
sorted by expert (a stable argsort), so expert e's tokens are one contiguous slice
[starts[e], starts[e] + counts[e]) of the gathered inputs, and each expert with tokens
runs one GEMM pair on its slice. Python loops over experts (E iterations), never over
tokens; the counts are read on the host once per layer (a device sync on CUDA, so MoE
models are not captured in CUDA graphs). Results are permuted back to (token, choice)
order and each token's k outputs summed with their weights, in a fixed order.

More: docs/models.md, "models/moe.py".
"""

from __future__ import annotations

import torch
from torch import nn

from radixlm.models.mlp import GatedMLP
from radixlm.models.model_config import ModelConfig
from radixlm.models.parallel_context import ParallelContext
from radixlm.models.parallel_layers import ColumnParallelLinear, ColumnShard


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        # Replicated: every rank keeps all E rows (shard [0, E) whatever the rank).
        self.gate = ColumnParallelLinear(
            config.hidden_size, [ColumnShard(None, config.num_experts, 0, config.num_experts)],
            bias=False, ctx=ctx)
        self.experts = nn.ModuleList(
            GatedMLP(config, ctx, config.moe_intermediate_size, reduce=False)
            for _ in range(config.num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in x's dtype, expert ids [T, k])."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        flat_ids = ids.reshape(-1)  # assignment a = token a // k, its (a % k)-th choice
        order = torch.argsort(flat_ids, stable=True)
        token_of = order // self.top_k  # the token of each sorted assignment
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        xs = x[token_of]  # [T*k, hidden], grouped by expert
        ys = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                ys[start:start + n] = self.experts[e](xs[start:start + n])
                start += n
        # Back to assignment order [T, k, hidden], then each token's weighted sum over
        # its k experts (a fixed order: no scatter-add).
        back = torch.empty_like(ys)
        back[order] = ys
        out = (back.view(-1, self.top_k, x.shape[-1]) * weights.unsqueeze(-1)).sum(dim=1)
        return self.ctx.all_reduce(out) if self.ctx.is_parallel else out
