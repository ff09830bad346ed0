"""LinearMethod: how one linear layer holds its weight and computes x @ W.T + b.

A layer (models/parallel_layers.py) loads its rank's dense weight, and, when the
checkpoint has them, its exact int4 groups; `models/linear/policy.py` then picks one
method per layer, once, at load. The model code calls `layer(x)` and never branches on
the format. Each method is an nn.Module whose buffers are the bytes it keeps, so the
memory planner counts them (`weight_bytes_by_format`), and says its `format` name.

Dense methods here: `DenseLinear` (F.linear, or another GEMM with the same signature,
e.g. the batch-invariant one of deterministic inference) and `PrepackedLinear` (the
weight reordered once for oneDNN's blocked layout: on the CPU the same product without
the per-call reorder, 1.4-2x faster at decode sizes; docs/benchmarks.md).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

Gemm = Callable[..., torch.Tensor]


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    """Identifies a tensor's memory, so that tensors sharing it are counted once (oneDNN's
    packed weights are opaque: no data pointer, their own memory)."""
    try:
        return (t.data_ptr(), t.numel())
    except RuntimeError:
        return (id(t), -1)


class LinearMethod(nn.Module):
    """forward(x [M, in], bias [out] | None) -> [M, out] in x's dtype."""

    format: str = "dense"

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def dequantized_weight(self) -> torch.Tensor:
        """[out, in]: the weight this method computes with, as a dense tensor (tests,
        diagnostics; may allocate)."""
        raise NotImplementedError

    # For a gated MLP's gate_up weight ([gate; up] rows): None where the method has no
    # fused path, else gated_act_mul(x, gelu) -> act(gate) * up [M, out / 2] in one call,
    # rounded as forward() then the act * up kernel round it (act: SiLU, tanh-GELU with
    # `gelu`), or None for an x it does not take (then forward, then act * up).
    gated_act_mul: Callable[[torch.Tensor, bool], torch.Tensor | None] | None = None

    def own_bytes(self) -> int:
        """Bytes of this method's own buffers and parameters (not its children's)."""
        return sum(t.numel() * t.element_size()
                   for t in [*self.parameters(recurse=False), *self.buffers(recurse=False)])

    def bytes_read(self, rows: int) -> int:
        """Weight bytes one call of `rows` rows reads (the decode roofline's numerator)."""
        return self.own_bytes()


class DenseLinear(LinearMethod):
    """F.linear on the weight (the layer's own Parameter: no copy)."""

    def __init__(self, weight: torch.Tensor, gemm: Gemm = F.linear,
                 format: str | None = None) -> None:
        super().__init__()
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(
            weight, requires_grad=False)
        self.gemm = gemm
        self.format = format or f"dense {str(weight.dtype).removeprefix('torch.')}"

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.gemm(x, self.weight, bias)

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight.detach()


def onednn_prepack_available(dtype: torch.dtype, device: torch.device) -> bool:
    """float32 on any x86 CPU oneDNN runs on; bfloat16 only where oneDNN has bf16 GEMMs
    (AVX-512 or AMX: `_linear_pointwise` refuses bf16 on an AVX2-only CPU)."""
    if not (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PrepackedLinear(LinearMethod):
    """The weight in oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, packed once)
    and `mkldnn._linear_pointwise` per call. CPU, float32 or bfloat16."""

    def __init__(self, weight: torch.Tensor, batch_hint: int = 1) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(
            weight.detach().contiguous(), batch_hint), persistent=False)
        self.format = f"dense {str(weight.dtype).removeprefix('torch.')} (oneDNN prepacked)"

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed,
                                               bias, "none", [], "")
        return y.reshape(*lead, self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        # x = I picks the weight's columns out exactly (each output is one product by 1).
        eye = torch.eye(self.in_features, dtype=self.packed.dtype)
        return self.forward(eye).t().contiguous()


class SmallBatchQuantized(LinearMethod):
    """A weight-only quantized kernel for calls of at most `max_m` rows; past them, up to
    `tiles_max_m` rows, the same groups dequantized into AMX B tiles per call (`tiles`,
    where a subclass has that path: `use_tiles`), and a dense method (the same weights,
    dequantized once at load: `fallback`) for larger calls.

    PyTorch's CPU int4/int8 weight-only kernels read 4x/2x fewer bytes than bf16 and win
    while a call is bound by reading the weight (decode of a few requests), but they are
    several times slower than oneDNN's bf16 GEMM from about 8 rows on (docs/benchmarks.md):
    so prefill and large decode batches take the tiles or the dense path. Subclasses define
    `small(x) -> x @ W.T` and keep their buffers. Invariant: a method without a fallback
    takes every call past max_m on its tiles (`takes_every_large_call`), or, for
    Int8GroupwiseLinear's head, on its own large path."""

    def __init__(self, fallback: LinearMethod | None, max_m: int) -> None:
        """fallback None: no dense path (the tiles, or the subclass, take large calls)."""
        super().__init__()
        self.fallback = fallback
        self.max_m = max_m
        self.tiles_max_m = max_m  # rows up to which no call takes the fallback
        if fallback is not None and fallback.gated_act_mul is not None:
            # the fallback's fused path, for the calls past max_m rows it serves
            self.gated_act_mul = self._gated_past_kernel

    def use_tiles(self, tiles_max_m: int | None) -> None:
        """Take calls past max_m up to `tiles_max_m` rows (None: every call) on `tiles` /
        `tiles_gated`; at or below max_m: off."""
        if tiles_max_m is not None and tiles_max_m <= self.max_m:
            return
        self.tiles_max_m = sys.maxsize if tiles_max_m is None else tiles_max_m
        if self.gated_act_mul is None:
            self.gated_act_mul = self._gated_past_kernel

    def takes_every_large_call(self) -> bool:
        """Do the tiles take every call past max_m (what a method without fallback needs)?"""
        return self.tiles_max_m == sys.maxsize

    def small(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def tiles(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, in] bf16 contiguous -> x @ W.T (+ bias) [M, out] bf16 on AMX tiles."""
        raise NotImplementedError

    def tiles_gated(self, x: torch.Tensor, gelu: bool) -> torch.Tensor:
        """act(gate) * up [M, out / 2] bf16 for x [M, in] bf16 contiguous on AMX tiles."""
        raise NotImplementedError

    def kernel_bytes(self) -> int:
        """Bytes the small-batch kernel (and the tiles) read per call."""
        raise NotImplementedError

    def bytes_read(self, rows: int) -> int:
        if rows <= self.tiles_max_m or self.fallback is None:
            return self.kernel_bytes()
        return self.fallback.bytes_read(rows)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.shape[0]
        if rows <= self.max_m:
            y = self.small(x.contiguous())
            return y + bias if bias is not None else y
        if rows <= self.tiles_max_m:
            xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
            y = self.tiles(xb.contiguous(), bias)
            return y if y.dtype == x.dtype else y.to(x.dtype)
        return self.fallback.forward(x, bias)

    def _gated_past_kernel(self, x: torch.Tensor, gelu: bool) -> torch.Tensor | None:
        rows = x.shape[0]
        if rows <= self.max_m or torch.compiler.is_dynamo_compiling():
            return None
        if rows <= self.tiles_max_m:
            if x.dtype != torch.bfloat16 or x.dim() != 2 or self.out_features % 32:
                return None
            return self.tiles_gated(x.contiguous(), gelu)
        if self.fallback is None or self.fallback.gated_act_mul is None:
            return None
        return self.fallback.gated_act_mul(x, gelu)
