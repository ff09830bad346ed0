"""Int8Groups and Int8GroupwiseLinear: int8 weights with one float32 scale per group of
`group_size` input features, w[n, k] = q[n, k] * s[n, k // group_size].

GGUF's Q8_0 (groups of 32), Q5_0 (32, q - 16) and Q6_K (16, s = d * sc) are exactly this
form: q * s is exact in float32 (at most 24 significant bits), so `dequantize()` is the
`gguf` package's dequantization bit for bit. The method computes with the C++ kernel
`cpu_kernels/int8_groups.cpp` for calls of at most `max_m` rows: the activations
quantized per group to int8 at run time (scale max|x| / 127, as llama.cpp's Q8_0 x Q8_0),
int32 dot products per group, one read of the weight per call; larger calls go to
`fallback`, a dense method holding the same values (the policy always gives one), or,
built without one, the groups dequantized
`_CHUNK_ROWS` rows at a time into a transient bf16 block. A tied embedding reads its rows
from the same groups (`lookup`), equal to the dense lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from radixlm.models.linear.method import LinearMethod, SmallBatchQuantized

# Rows of a head dequantized per block when a large call has no dense fallback
# (16384 x hidden bf16: 21 MB at hidden 640, the only transient such a call allocates).
_CHUNK_ROWS = 16384


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
        g = q.view(*q.shape[:-1], -1, self.group_size).float()
        return (g * s.unsqueeze(-1)).view(q.shape)

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


@torch.library.custom_op("radixlm::int8_group_matmul", mutates_args=(), device_types="cpu")
def int8_group_matmul(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    """The int8_groups kernel as an op compiled decode graphs can hold (eager calls go to
    the kernel straight: no op dispatch). float32 [M, N]."""
    return int8_groups_kernel().int8_group_matmul(x, q, s, group_size)


@int8_group_matmul.register_fake
def _(x, q, s, group_size):
    return x.new_empty(x.shape[0], q.shape[0], dtype=torch.float32)


def int8_groups_kernel_runs_on(device: torch.device) -> bool:
    return device.type == "cpu" and int8_groups_kernel() is not None


class Int8GroupwiseLinear(SmallBatchQuantized):
    format = "int8 groupwise"

    def __init__(self, groups: Int8Groups, fallback: LinearMethod | None, max_m: int,
                 act_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(fallback, max_m)
        self.group_size = groups.group_size
        self.out_features, self.in_features = groups.shape
        self.register_buffer("q", groups.q.contiguous(), persistent=False)
        self.register_buffer("s", groups.s.float().contiguous(), persistent=False)
        self.act_dtype = act_dtype
        self._kernel = int8_groups_kernel()

    def groups(self) -> Int8Groups:
        return Int8Groups(self.q, self.s, self.group_size)

    def small(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        if torch.compiler.is_compiling():
            y = torch.ops.radixlm.int8_group_matmul(x.contiguous(), self.q, self.s,
                                                    self.group_size)
        else:
            y = self._kernel.int8_group_matmul(x.contiguous(), self.q, self.s, self.group_size)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _chunked(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T with W dequantized `_CHUNK_ROWS` rows at a time (no kept dense copy)."""
        y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        g = self.groups()
        for r0 in range(0, self.out_features, _CHUNK_ROWS):
            r1 = min(r0 + _CHUNK_ROWS, self.out_features)
            w = g.dequantize_rows(self.q[r0:r1], self.s[r0:r1]).to(x.dtype)
            y[:, r0:r1] = F.linear(x, w)
        return y

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[0] > self.max_m:
            if self.fallback is not None:
                return self.fallback.forward(x, bias)
            y = self._chunked(x)
        else:
            y = self.small(x.contiguous())
        return y + bias if bias is not None else y

    def kernel_bytes(self) -> int:
        return self.q.numel() + self.s.numel() * 4

    def bytes_read(self, rows: int) -> int:
        if rows > self.max_m and self.fallback is not None:
            return self.fallback.bytes_read(rows)
        return self.kernel_bytes()

    def lookup(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Embedding rows `ids` in `dtype`: the dequantized rows, rounded once."""
        return self.groups().dequantize_rows(self.q[ids], self.s[ids]).to(dtype)

    def dequantized_weight(self) -> torch.Tensor:
        return self.groups().dequantize()
