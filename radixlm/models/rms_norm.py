"""RMSNorm variants: Llama's (float32 normalize, cast back, then * w: HF Llama's order)
and Gemma's (* (1 + w) in float32, then cast).

On the CPU's eager forward one C++ pass per row (`cpu_kernels/norm_rope.cpp`, same
rounding points) replaces the eight small ops below; Llama's `add_forward` also takes in
the residual add before the norm, Gemma's `norm_add_forward` the block output's norm, the
residual add and the next block's input norm."""

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
    arrives in the same convention and the 1 is added exactly once, here. The kernel
    path reads 1 + w from a float32 copy (`_one_plus_w`, not state: rebuilt after
    loading and whenever `weight`'s storage or version changes), the same float32
    numbers the torch code computes on each call.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps
        self._w1: torch.Tensor | None = None
        self._w1_key: tuple[int, int] | None = None

    def process_weights_after_loading(self) -> None:
        """Loaders write `weight.data` in place (no version bump): rebuild 1 + w."""
        self._w1_key = None

    def _one_plus_w(self) -> torch.Tensor:
        weight = self.weight
        key = (weight.data_ptr(), weight._version)
        if key != self._w1_key:
            self._w1 = (1.0 + weight.detach().float()).contiguous()
            self._w1_key = key
        return self._w1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalizes the last dim; on the kernel path x may be [T, n] or [T, heads, d]
        (Gemma's per-head q/k norms; rows may be strided views)."""
        # (the strided view only eagerly: a traced graph takes the torch code below)
        traced = torch.compiler.is_dynamo_compiling()
        rows = None if traced else x if x.dim() == 2 else _head_rows(x)
        kernels = eager_kernels(rows) if rows is not None else None
        if kernels is not None:
            return kernels.gemma_rms_norm(rows, self._one_plus_w(), self.eps).view(x.shape)
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def norm_add_forward(self, residual: torch.Tensor, delta: torch.Tensor,
                         next_norm: "GemmaRMSNorm | None" = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(residual + self(delta), next_norm of that sum or None): a sandwich block's
        output norm and residual add, and the next block's input norm, in one pass where
        the kernel applies."""
        kernels = eager_kernels(residual)
        if kernels is not None and delta.dim() == 2 and residual.dtype == delta.dtype:
            w_next = (next_norm._one_plus_w() if next_norm is not None
                      else residual.new_empty(0, dtype=torch.float32))
            summed, normed = kernels.gemma_norm_add_norm(residual, delta, self._one_plus_w(),
                                                         w_next, self.eps)
            return summed, (normed if next_norm is not None else None)
        summed = residual + self.forward(delta)
        return summed, (next_norm.forward(summed) if next_norm is not None else None)


def _head_rows(x: torch.Tensor) -> torch.Tensor | None:
    """[T, heads, d] with contiguous heads inside (possibly strided) rows, as the view
    [T, heads * d] the kernel normalizes d at a time; None for other layouts."""
    if x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.size(2):
        return None
    return x.as_strided((x.size(0), x.size(1) * x.size(2)), (x.stride(0), 1), x.storage_offset())


def make_rms_norm(hidden_size: int, eps: float, gemma: bool) -> nn.Module:
    return GemmaRMSNorm(hidden_size, eps) if gemma else RMSNorm(hidden_size, eps)
