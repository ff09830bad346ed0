"""RMSNorm variants: Llama's (float32 normalize, cast back, then * w: HF Llama's order)
and Gemma's (* (1 + w) in float32, then cast).

On the CPU's eager forward one C++ pass per row (`cpu_kernels/norm_rope.cpp`, same
rounding points) replaces the eight small ops below, and `add_forward` also takes in the
residual add before the norm."""

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
        kernels, weight = eager_kernels(x), self.weight
        if kernels is not None and weight.dtype == x.dtype:
            return kernels.rms_norm(x, weight, self.eps)
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # Cast before multiplying by the weight: in bf16 this rounds exactly like HF.
        return self.weight * x32.to(dtype)

    def add_forward(self, residual: torch.Tensor,
                    delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + delta, its RMSNorm): a pre-norm block's residual add and the next
        block's input norm, in one pass where the kernel applies."""
        # (`weight` read once: a Parameter's lookup goes through nn.Module.__getattr__)
        kernels, weight = eager_kernels(residual), self.weight
        if kernels is not None and weight.dtype == residual.dtype == delta.dtype:
            summed, normed = kernels.add_rms_norm(residual, delta, weight, self.eps)
            return summed, normed
        summed = residual + delta
        return summed, self.forward(summed)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x_normalized * (1 + w), all in float32, then cast (HF's order).

    `weight` holds w as HF checkpoints store it (zero-centred); GGUF files store 1 + w
    and the GGUF loader subtracts the 1 (models/gguf_loader.py), so every checkpoint
    arrives in the same convention and the 1 is added exactly once, here.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def make_rms_norm(hidden_size: int, eps: float, gemma: bool) -> nn.Module:
    return GemmaRMSNorm(hidden_size, eps) if gemma else RMSNorm(hidden_size, eps)
