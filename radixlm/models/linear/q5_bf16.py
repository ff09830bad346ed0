"""Q5GroupwiseLinear: 5-bit weights in groups of 32 with a float16 scale, w = d * q for
q in -16..15 (GGUF's Q5_0), kept at their own size (0.6875 bytes a weight).

Calls of at most `max_m` rows run the q5_bf16 C++ kernel (`cpu_kernels/q5_bf16.cpp`,
layout `q5_bf16_blocks.py`; x unquantized: bf16 products, float32 sums); larger calls,
with AMX-BF16, up to `tiles_max_m` rows the groups dequantized into the tile GEMM's B
tiles (the dense copy's products, bit for bit), past that the dense fallback
(`SmallBatchQuantized`; None with every call on the tiles). Built from Int8Groups that
`fits_q5` (the loader's exact Q5_0 groups); `dequantized_weight()` is d * q in float32,
the `gguf` package's dequantization bit for bit. Only where the kernel built with AVX512-BF16
(`q5_bf16_kernel_usable`); elsewhere the policy keeps Int8GroupwiseLinear.
"""

from __future__ import annotations

import torch

from radixlm.cpu_kernels.kernel_ops import kernel_op
from radixlm.models.linear.bf16_tiles import bf16_tiles_kernel
from radixlm.models.linear.int8_groups import Int8Groups
from radixlm.models.linear.method import LinearMethod, SmallBatchQuantized
from radixlm.models.linear.q5_bf16_blocks import (pack_q5_blocks, q5_scales,
                                                   q5_unblock_scales, unpack_q5_blocks)


def q5_bf16_kernel():
    """The q5_bf16 C++ kernel module when it built with AVX512-BF16, else None."""
    from radixlm.cpu_kernels.build import load_kernel

    kernel = load_kernel("q5_bf16")
    return kernel if kernel is not None and kernel.q5_bf16_path() == 1 else None


def q5_bf16_kernel_usable() -> bool:
    """The kernel built with its AVX512-BF16 path (the CPU's flag as -march=native saw it)."""
    return q5_bf16_kernel() is not None


def fits_q5(groups: Int8Groups) -> bool:
    """Are the groups exactly 5-bit: groups of 32, q in -16..15, scales float16 values."""
    if groups.group_size != 32 or groups.q.numel() == 0:
        return False
    lo, hi = torch.aminmax(groups.q)
    s = groups.s.float()
    return int(lo) >= -16 and int(hi) <= 15 and torch.equal(s.half().float(), s)


# As a torch op for compiled decode graphs (implemented by q5_bf16.cpp).
@kernel_op("q5_bf16_matmul(Tensor x, Tensor w, Tensor d, int n) -> Tensor")
def _(x, w, d, n):
    return x.new_empty(x.shape[0], n)


# As a torch op for compiled decode graphs (implemented by bf16_tiles.cpp).
@kernel_op("q5_tiles_matmul(Tensor x, Tensor q5, Tensor d, int n, Tensor? bias) -> Tensor")
def _(x, q5, d, n, bias):
    return x.new_empty(x.shape[0], n)


class Q5GroupwiseLinear(SmallBatchQuantized):
    format = "5-bit groupwise (bf16 kernel)"

    def __init__(self, groups: Int8Groups, fallback: LinearMethod | None, max_m: int,
                 tiles_max_m: int | None = 0) -> None:
        """tiles_max_m: calls up to that many rows on the AMX tiles where the kernel is
        usable (None: every call, and `fallback` may be None), else none."""
        super().__init__(fallback, max_m)
        kernel = q5_bf16_kernel()
        if kernel is None or not fits_q5(groups):
            raise ValueError("Q5GroupwiseLinear: the q5_bf16 kernel is not built for "
                             "AVX512-BF16 here, or the groups are not 5-bit (fits_q5)")
        self._kernel = kernel
        self.out_features, self.in_features = groups.shape
        self.register_buffer("q5", pack_q5_blocks(groups.q.to(torch.int16) + 16),
                             persistent=False)
        self.register_buffer("d", q5_scales(groups.s), persistent=False)
        self._tiles = bf16_tiles_kernel()
        if self._tiles is not None:
            self.use_tiles(tiles_max_m)
        if fallback is None and not self.takes_every_large_call():
            raise ValueError("Q5GroupwiseLinear: no dense fallback needs the AMX tiles for "
                             "every call (tiles_max_m None, the tile kernel usable)")

    def small(self, x: torch.Tensor) -> torch.Tensor:
        xa = x if x.dtype in (torch.float32, torch.bfloat16) else x.float()
        if torch.compiler.is_dynamo_compiling():
            y = torch.ops.radixlm.q5_bf16_matmul(xa, self.q5, self.d, self.out_features)
        else:
            y = self._kernel.q5_bf16_matmul(xa, self.q5, self.d, self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def tiles(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        args = (x, self.q5, self.d, self.out_features, bias)
        if torch.compiler.is_dynamo_compiling():
            return torch.ops.radixlm.q5_tiles_matmul(*args)
        return self._tiles.bf16_tiles_q5_matmul(*args)

    def tiles_gated(self, x: torch.Tensor, gelu: bool) -> torch.Tensor:
        return self._tiles.bf16_tiles_q5_gated(x, self.q5, self.d, self.out_features // 2, gelu)

    def kernel_bytes(self) -> int:
        return self.q5.numel() + self.d.numel() * 2

    def groups(self) -> Int8Groups:
        q = unpack_q5_blocks(self.q5, self.out_features).to(torch.int8) - 16
        return Int8Groups(q, q5_unblock_scales(self.d, self.out_features), 32)

    def dequantized_weight(self) -> torch.Tensor:
        return self.groups().dequantize()
