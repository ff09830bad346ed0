"""TokenToKVPool: KV slot -> the K and V of that token in every layer.

Per layer, K and V are tensors of shape [size + 1, kv_heads, head_dim]. Row 0 is the
dummy slot: padded positions write there and nothing reads it back.
"""

from __future__ import annotations

import torch

from radixlm.runtime.host_malloc import zeros_on_huge_pages


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
        self.k_buffers = [self._zeros(shape) for _ in range(num_layers)]
        self.v_buffers = [self._zeros(shape) for _ in range(num_layers)]

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.device.type == "cpu":  # decode attention walks it: fewer TLB misses
            return zeros_on_huge_pages(shape, self.dtype)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

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
