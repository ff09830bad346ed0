"""RMSNorm, computed in float32 and cast back before the weight (HF Llama's order).

On the CPU's eager forward one C++ pass per row (`cpu_kernels/norm_rope.cpp`, same
rounding points) replaces the eight small ops below."""

from __future__ import annotations

import torch
from torch import nn

from radixlm.cpu_kernels.ops import eager_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = eager_kernels(x)
        if kernels is not None and self.weight.dtype == x.dtype:
            return kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # Cast before multiplying by the weight: in bf16 this rounds exactly like HF.
        return self.weight * x32.to(dtype)
