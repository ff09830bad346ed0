"""Int4Groups: a 4-bit groupwise weight in exact form, as it travels from a checkpoint
into a linear layer.

    w[n, k] = d[n, g] * q[n, k] + m[n, g],   g = k // group_size,  q in 0..15

held as q (uint8, one value per byte while loading) and d, m (float32 holding the
checkpoint's own half-precision values). GGUF's Q4_1 is exactly this form; Q4_0
(w = d * (q - 8)) is m = -8 d. `dequantize()` computes d * q + m in float32, the same
two roundings as the `gguf` package, so the values are bit for bit the file's.

Rows are independent, so tensor-parallel column shards and llama.cpp's Q/K row
un-permutation apply to q, d and m alike (`rows`, `permute_rows`); an input-feature
(row-parallel) shard must start and end on a group boundary (`cols`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from radixlm.models.linear.int8_groups import Int8Groups


@dataclass(frozen=True)
class Int4Groups:
    q: torch.Tensor  # [rows, in] uint8, values 0..15
    d: torch.Tensor  # [rows, in // group_size] float32
    m: torch.Tensor  # [rows, in // group_size] float32
    group_size: int = 32

    def __post_init__(self) -> None:
        rows, cols = self.q.shape
        if cols % self.group_size or self.d.shape != (rows, cols // self.group_size) \
                or self.m.shape != self.d.shape:
            raise ValueError(f"inconsistent int4 groups: q {tuple(self.q.shape)}, d "
                             f"{tuple(self.d.shape)}, m {tuple(self.m.shape)}, group "
                             f"{self.group_size}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> torch.Tensor:
        """[rows, in] float32: d * q + m (the product is exact: an 11-bit d times a
        4-bit q; the sum is the one rounding, as in gguf's numpy code)."""
        rows, cols = self.q.shape
        g = self.q.view(rows, cols // self.group_size, self.group_size).float()
        return (self.d.unsqueeze(-1) * g + self.m.unsqueeze(-1)).view(rows, cols)

    def rows(self, start: int, end: int) -> "Int4Groups":
        return Int4Groups(self.q[start:end], self.d[start:end], self.m[start:end],
                          self.group_size)

    def cols(self, start: int, end: int) -> "Int4Groups | None":
        """Input features [start, end), or None when they cut through a group."""
        gs = self.group_size
        if start % gs or end % gs:
            return None
        return Int4Groups(self.q[:, start:end], self.d[:, start // gs:end // gs],
                          self.m[:, start // gs:end // gs], gs)

    def permute_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Int4Groups":
        """Apply a row permutation `fn` (a function of a [rows, ...] tensor)."""
        return Int4Groups(fn(self.q), fn(self.d), fn(self.m), self.group_size)


@dataclass(frozen=True)
class QuantizedCheckpointTensor:
    """A checkpoint tensor that a loader read in a quantized form: `dense` is its exact
    dequantization in the run dtype (what a dense layer loads), `int4` or `int8` the same
    values in exact groups (what a quantized layer keeps; int8: `linear/int8_groups.py`).
    Loaders yield it in place of a tensor."""
    dense: torch.Tensor
    int4: Int4Groups | None = None
    int8: "Int8Groups | None" = None

    @property
    def shape(self) -> torch.Size:
        return self.dense.shape


def as_dense(t: "torch.Tensor | QuantizedCheckpointTensor") -> torch.Tensor:
    """The dense tensor of a checkpoint tensor, whatever form the loader gave it in."""
    return t.dense if isinstance(t, QuantizedCheckpointTensor) else t
