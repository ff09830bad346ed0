"""RadixAttention: the attention layer a model holds; the math lives in the backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from radixlm.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    """`sliding_window`: a query at position p sees keys at positions (p - window, p]
    (HF's `kv_idx > q_idx - sliding_window`); None = all keys up to p."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float,
                 layer_id: int, sliding_window: int | None = None) -> None:
        super().__init__()
        self.sliding_window = sliding_window
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                forward_batch: "ForwardBatch") -> torch.Tensor:
        """q: [T, heads*head_dim], k/v: [T, kv_heads*head_dim] -> [T, heads*head_dim]."""
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        out = forward_batch.attn_backend.forward(q, k, v, self, forward_batch)
        return out.reshape(t, self.num_heads * self.head_dim)
