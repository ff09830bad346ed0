"""TiledBf16Linear: a bf16 weight packed once as AMX B tiles and x @ W.T on radixlm's
own tile kernel (`cpu_kernels/bf16_tiles.cpp`), where the CPU has AMX-BF16 and the OS
grants the tile state.

It computes what oneDNN's prepacked bf16 GEMM computes (float32 sums of exact bf16
products) but streams the weight with software prefetch: per SmolLM2 layer, weights read
from memory, 1.4-1.6x faster than oneDNN at 1-64 rows, 1.1x at 256, 0.87-0.95x at 1024
(oneDNN blocks large products better; docs/benchmarks.md, "bf16 GEMMs on AMX tiles").

Invariants: `tiles` [ceil(out / 16), in / 32, 16, 32] bf16 is the only copy of the
weight (the last block's missing rows zero); the bias is added in float32 before the one
rounding to bf16 (as oneDNN's fused bias); x of any float dtype is computed in bf16 and
the result returned in x's dtype; a row's result does not depend on the call's rows.
"""

from __future__ import annotations

import torch

from radixlm.cpu_kernels.kernel_ops import kernel_op
from radixlm.models.linear.method import LinearMethod

BLOCK_N = 16  # output channels per B tile
GROUP_K = 32  # input columns per B tile (16 pairs)


def bf16_tiles_kernel():
    """The bf16_tiles C++ kernel module where it built for AMX-BF16 and the OS grants
    the tile state, else None."""
    from radixlm.cpu_kernels.build import load_kernel

    kernel = load_kernel("bf16_tiles")
    return kernel if kernel is not None and kernel.bf16_tiles_path() == 1 else None


def bf16_tiles_fit(weight: torch.Tensor) -> bool:
    """A bf16 CPU weight whose input features come in whole groups of 32, on a CPU that
    runs the kernel."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and weight.dim() == 2 and weight.shape[1] % GROUP_K == 0
            and bf16_tiles_kernel() is not None)


def pack_tiles(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N / 16), K / 32, 16, 32]: tile (b, g) row r lane 2 j + e holds
    W[16 b + j, 32 g + 2 r + e] (AMX's pair-interleaved B layout)."""
    n, k = weight.shape
    nb = -(-n // BLOCK_N)
    w = torch.zeros(nb * BLOCK_N, k, dtype=torch.bfloat16)
    w[:n] = weight
    return (w.view(nb, BLOCK_N, k // GROUP_K, GROUP_K // 2, 2)
            .permute(0, 2, 3, 1, 4).reshape(nb, k // GROUP_K, GROUP_K // 2, 2 * BLOCK_N)
            .contiguous())


def unpack_tiles(tiles: torch.Tensor, n: int) -> torch.Tensor:
    """pack_tiles' inverse: the [n, K] weight."""
    nb, ng = tiles.shape[:2]
    w = tiles.view(nb, ng, GROUP_K // 2, BLOCK_N, 2).permute(0, 3, 1, 2, 4)
    return w.reshape(nb * BLOCK_N, ng * GROUP_K)[:n].contiguous()


# As a torch op for compiled decode graphs (implemented by bf16_tiles.cpp).
@kernel_op("bf16_tiles_matmul(Tensor x, Tensor tiles, int n, Tensor? bias) -> Tensor")
def _(x, tiles, n, bias):
    return x.new_empty(x.shape[0], n)


class TiledBf16Linear(LinearMethod):
    """x @ W.T (+ bias) on AMX tiles, W held once as `tiles` (see the module)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("tiles", pack_tiles(weight.detach()), persistent=False)
        self.format = "dense bfloat16 (AMX tiles)"
        self._kernel = bf16_tiles_kernel()

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.bfloat16:
            x2 = x2.to(torch.bfloat16)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        if torch.compiler.is_dynamo_compiling():
            y = torch.ops.radixlm.bf16_tiles_matmul(x2, self.tiles, self.out_features, bias)
        else:
            y = self._kernel.bf16_tiles_matmul(x2, self.tiles, self.out_features, bias)
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y.reshape(*lead, self.out_features)

    def gated_act_mul(self, x: torch.Tensor, gelu: bool) -> torch.Tensor | None:
        """The kernel's fused epilogue (`bf16_tiles_gated`): a bf16 x [M, in] eagerly,
        halves of whole blocks of 16 channels; else None (forward, then act * up)."""
        half = self.out_features // 2
        if (torch.compiler.is_dynamo_compiling() or x.dtype != torch.bfloat16 or x.dim() != 2
                or self.out_features % (2 * BLOCK_N)):
            return None
        return self._kernel.bf16_tiles_gated(x.contiguous(), self.tiles, half, gelu)

    def dequantized_weight(self) -> torch.Tensor:
        return unpack_tiles(self.tiles, self.out_features)
