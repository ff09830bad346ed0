"""The AttentionBackend interface (picking one by name: attention/factory.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.attention.radix_attention import RadixAttention
    from radixlm.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    # Decode metadata computed on the device from the batch's tensors alone (no host
    # values, shapes fixed by the batch size): what a captured CUDA graph or a compiled
    # decode graph (executor/decode_graph_runner.py) needs.
    supports_decode_graphs: bool = False

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Precompute per-pass metadata (index tensors, masks) shared by all layers."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: "RadixAttention", forward_batch: "ForwardBatch") -> torch.Tensor:
        """q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] of the new tokens.

        Writes k, v into token_to_kv_pool at forward_batch.out_cache_loc (mutates the
        pool), then returns the attention output [T, heads, head_dim].
        """
