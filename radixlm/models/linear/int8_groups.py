"""Int8Groups and Int8GroupwiseLinear: int8 weights with one float32 scale per group of
`group_size` input features, w[n, k] = q[n, k] * s[n, k // group_size].

GGUF's Q8_0 (groups of 32), Q5_0 (32, q - 16) and Q6_K (16, s = d * sc) are exactly this
form: q * s is exact in float32 (at most 24 significant bits), so `dequantize()` is the
`gguf` package's dequantization bit for bit. The C++ kernel `cpu_kernels/int8_groups.cpp`
takes calls of at most `max_m` rows: x quantized per group to int8 at run time (as
llama.cpp's Q8_0 x Q8_0), int32 dot products per group, one read of the weight per call.
Larger calls: with AMX-BF16 (`tiles_max_m`), the groups dequantized into the tile GEMM's B
tiles per call (`cpu_kernels/bf16_tiles.cpp`: the dense bf16 products, bit for bit); past that,
`fallback`, a dense method holding the same values, or, built without one and without the
tiles, the groups dequantized `_CHUNK_ROWS` rows at a time into a transient bf16 block.
A tied embedding reads its rows from the same groups (`lookup`), equal to the dense lookup.
float32 runs (`use_f32`, e.g. on AVX2) take the groups_f32 kernel (`groups_f32.py`), x
unquantized; without a fallback it takes calls of every size.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from radixlm.cpu_kernels.kernel_ops import kernel_op
from radixlm.models.linear.bf16_tiles import bf16_tiles_kernel
from radixlm.models.linear.groups_f32 import (block_scales_f32, groups_f32_kernel,
                                              int8_f32_rows, pack_int8_f32,
                                              unblock_scales_f32, unpack_int8_f32)
from radixlm.models.linear.method import LinearMethod, SmallBatchQuantized

# Rows of a head dequantized per block when a large call has no dense fallback
# (16384 x hidden bf16: 21 MB at hidden 640, the only transient such a call allocates).
_CHUNK_ROWS = 16384


def dequantize_group_rows(q: torch.Tensor, s: torch.Tensor, group_size: int) -> torch.Tensor:
    """q [..., in] int8, s [..., in / group_size] -> float32 [..., in] (exact products)."""
    g = q.view(*q.shape[:-1], -1, group_size).float()
    return (g * s.unsqueeze(-1)).view(q.shape)


@dataclass(frozen=True)
class Int8Groups:
    q: torch.Tensor  # [rows, in] int8
    s: torch.Tensor  # [rows, in // group_size] float32
    group_size: int = 32

    def __post_init__(self) -> None:
        rows, cols = self.q.shape
        if (self.q.dtype != torch.int8 or cols % self.group_size
                or self.s.shape != (rows, cols // self.group_size)):
            raise ValueError(f"inconsistent int8 groups: q {tuple(self.q.shape)} "
                             f"{self.q.dtype}, s {tuple(self.s.shape)}, group {self.group_size}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize_rows(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """q [..., in], s [..., groups] -> float32 [..., in] (exact products)."""
        return dequantize_group_rows(q, s, self.group_size)

    def dequantize(self) -> torch.Tensor:
        return self.dequantize_rows(self.q, self.s)

    def rows(self, start: int, end: int) -> "Int8Groups":
        return Int8Groups(self.q[start:end], self.s[start:end], self.group_size)

    def cols(self, start: int, end: int) -> "Int8Groups | None":
        gs = self.group_size
        if start % gs or end % gs:
            return None
        return Int8Groups(self.q[:, start:end], self.s[:, start // gs:end // gs], gs)

    def permute_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Int8Groups":
        return Int8Groups(fn(self.q), fn(self.s), self.group_size)

    @staticmethod
    def cat(parts: "list[Int8Groups]") -> "Int8Groups | None":
        """Row-wise concatenation; None when the parts' group sizes differ."""
        if len({p.group_size for p in parts}) != 1:
            return None
        return Int8Groups(torch.cat([p.q for p in parts]), torch.cat([p.s for p in parts]),
                          parts[0].group_size)


def int8_groups_kernel():
    """The built kernel module, or None (no compiler: callers keep dense weights)."""
    from radixlm.cpu_kernels.build import load_kernel

    return load_kernel("int8_groups")


# As a torch op for compiled decode graphs (implemented by int8_groups.cpp).
@kernel_op("int8_group_matmul(Tensor x, Tensor q, Tensor s, int group_size) -> Tensor")
def _(x, q, s, group_size):
    return x.new_empty(x.shape[0], q.shape[0], dtype=torch.float32)


# As a torch op for compiled decode graphs (implemented by bf16_tiles.cpp).
@kernel_op("int8_tiles_matmul(Tensor x, Tensor q, Tensor s, int group_size, "
           "Tensor? bias) -> Tensor")
def _(x, q, s, group_size, bias):
    return x.new_empty(x.shape[0], q.shape[0])


def int8_tiles_fit(groups: Int8Groups) -> bool:
    """Can the groups' large calls run on the AMX tiles here (the tile kernel usable,
    groups of 16 or 32)? Then the policy keeps no dense copy by default."""
    return (groups.group_size in (16, 32) and groups.shape[1] % 32 == 0
            and bf16_tiles_kernel() is not None)


def int8_groups_kernel_runs_on(device: torch.device) -> bool:
    return device.type == "cpu" and int8_groups_kernel() is not None


class Int8GroupwiseLinear(SmallBatchQuantized):
    format = "int8 groupwise"

    def __init__(self, groups: Int8Groups, fallback: LinearMethod | None, max_m: int,
                 act_dtype: torch.dtype = torch.bfloat16, tiles_max_m: int | None = 0,
                 use_f32: bool = False) -> None:
        """tiles_max_m: calls up to that many rows on the AMX tiles where they fit
        (`int8_tiles_fit`; None: every call), else none. use_f32: float32 x on the
        groups_f32 kernel (groups of 16 or 32), every call without a fallback."""
        super().__init__(fallback, max_m if fallback is not None or not use_f32
                         else sys.maxsize)
        self.group_size = groups.group_size
        self.out_features, self.in_features = groups.shape
        self.act_dtype = act_dtype
        self._f32 = groups_f32_kernel() if use_f32 else None
        self._tiles = None
        if use_f32:
            if self._f32 is None or groups.group_size not in (16, 32):
                raise RuntimeError("use_f32: the groups_f32 kernel is not built for AVX2 "
                                   "here, or the groups are not of 16 or 32")
            self.register_buffer("q_f32", pack_int8_f32(groups.q), persistent=False)
            (s,) = block_scales_f32(groups.s)
            self.register_buffer("s_f32", s, persistent=False)
            self._kernel = None
            return
        self.register_buffer("q", groups.q.contiguous(), persistent=False)
        self.register_buffer("s", groups.s.float().contiguous(), persistent=False)
        self._kernel = int8_groups_kernel()
        self._tiles = bf16_tiles_kernel() if int8_tiles_fit(groups) else None
        if self._tiles is not None:
            self.use_tiles(tiles_max_m)

    def groups(self) -> Int8Groups:
        if self._f32 is not None:
            return Int8Groups(unpack_int8_f32(self.q_f32, self.out_features),
                              unblock_scales_f32(self.s_f32, self.out_features),
                              self.group_size)
        return Int8Groups(self.q, self.s, self.group_size)

    def small(self, x: torch.Tensor) -> torch.Tensor:
        if self._f32 is not None:
            args = (x, self.q_f32, self.s_f32, self.group_size, self.out_features)
            if torch.compiler.is_dynamo_compiling():
                return torch.ops.radixlm.int8_f32_matmul(*args)
            return self._f32.int8_f32_matmul(*args)
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        if torch.compiler.is_dynamo_compiling():
            y = torch.ops.radixlm.int8_group_matmul(x.contiguous(), self.q, self.s,
                                                    self.group_size)
        else:
            y = self._kernel.int8_group_matmul(x.contiguous(), self.q, self.s, self.group_size)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _chunked(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T with W dequantized `_CHUNK_ROWS` rows at a time (no kept dense copy)."""
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        for r0 in range(0, self.out_features, _CHUNK_ROWS):
            r1 = min(r0 + _CHUNK_ROWS, self.out_features)
            w = dequantize_group_rows(self.q[r0:r1], self.s[r0:r1], self.group_size).to(x.dtype)
            y[:, r0:r1] = F.linear(x, w)
        return y

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.fallback is None and x.shape[0] > self.tiles_max_m:
            y = self._chunked(x)
            return y + bias if bias is not None else y
        return super().forward(x, bias)

    def tiles(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        args = (x, self.q, self.s, self.group_size, bias)
        if torch.compiler.is_dynamo_compiling():
            return torch.ops.radixlm.int8_tiles_matmul(*args)
        return self._tiles.bf16_tiles_q8_matmul(*args)

    def tiles_gated(self, x: torch.Tensor, gelu: bool) -> torch.Tensor:
        return self._tiles.bf16_tiles_q8_gated(x, self.q, self.s, self.group_size, gelu)

    def kernel_bytes(self) -> int:
        if self._f32 is not None:
            return self.q_f32.numel() + self.s_f32.numel() * self.s_f32.element_size()
        return self.q.numel() + self.s.numel() * 4

    def lookup(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Embedding rows `ids` in `dtype`: the dequantized rows, rounded once."""
        if self._f32 is not None:
            flat = ids.reshape(-1)
            q, s = int8_f32_rows(self.q_f32, self.s_f32, flat)
            rows = dequantize_group_rows(q, s, self.group_size)
            return rows.view(*ids.shape, self.in_features).to(dtype)
        return dequantize_group_rows(self.q[ids], self.s[ids], self.group_size).to(dtype)

    def dequantized_weight(self) -> torch.Tensor:
        return self.groups().dequantize()
