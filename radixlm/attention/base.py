"""The AttentionBackend interface and the registry that picks one by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.attention.radix_attention import RadixAttention
    from radixlm.executor.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Precompute per-pass metadata (index tensors, masks) shared by all layers."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layer: "RadixAttention", forward_batch: "ForwardBatch") -> torch.Tensor:
        """q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] of the new tokens.

        Writes k, v into token_to_kv_pool at forward_batch.out_cache_loc (mutates the
        pool), then returns the attention output [T, heads, head_dim].
        """


def create_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        from radixlm.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; available: torch")
