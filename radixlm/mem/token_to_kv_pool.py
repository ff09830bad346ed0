"""TokenToKVPool: KV slot -> the K and V of that token in every layer.

Per layer, K and V are tensors of shape [size + 1, kv_heads, head_dim]. Row 0 is the
dummy slot: padded positions write there and nothing reads it back.
"""

from __future__ import annotations

import torch


class TokenToKVPool:
    def __init__(self, size: int, num_layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.size = size
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (size + 1, kv_heads, head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of tokens [T, kv_heads, head_dim] into slots `loc` [T]."""
        if k.dtype != self.dtype:  # (a check, not a no-op .to() call per layer)
            k, v = k.to(self.dtype), v.to(self.dtype)
        self.k_buffers[layer_id][loc] = k
        self.v_buffers[layer_id][loc] = v

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]
