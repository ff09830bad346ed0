"""The weight layout of the int4_groups C++ kernel (`cpu_kernels/int4_groups.cpp`).

A row's groups of 32 go in blocks of W = 4 groups, then one block of 2 and one of 1 for
the rest; a block is 16 W bytes, byte 4 l + j (l < 4 W, j < 4) holding column
4 (l // W) + j of group l % W in its low nibble and column 16 + 4 (l // W) + j in its
high nibble. `pack_blocks` and `unpack_blocks` are exact inverses (q values 0..15);
d and m travel beside it as [rows, groups] float16 when that is exact (GGUF's Q4_0/Q4_1
half values), else float32 (Q4_K's d * sc).
"""

from __future__ import annotations

import torch

GROUP = 32


def _widths(groups: int) -> list[int]:
    """Block widths of a row of `groups` groups, in order."""
    return [4] * (groups // 4) + ([2] if groups % 4 >= 2 else []) + ([1] if groups % 2 else [])


def _runs(groups: int) -> list[tuple[int, int, int]]:
    """(first group, width, number of blocks) per run of equal-width blocks."""
    runs, g0 = [], 0
    for w in (4, 2, 1):
        count = sum(1 for x in _widths(groups) if x == w)
        if count:
            runs.append((g0, w, count))
            g0 += w * count
    return runs


def pack_blocks(q: torch.Tensor) -> torch.Tensor:
    """[rows, in] values 0..15 (in a multiple of 32) -> [rows, in / 2] uint8 blocks."""
    rows, cols = q.shape
    q = q.to(torch.uint8)
    parts = []
    for g0, w, count in _runs(cols // GROUP):
        t = q[:, g0 * GROUP:(g0 + w * count) * GROUP].reshape(rows, count, w, 2, 4, 4)
        b = t[:, :, :, 0] | (t[:, :, :, 1] << 4)           # [rows, count, g, r, j]
        parts.append(b.permute(0, 1, 3, 2, 4).reshape(rows, -1))
    return torch.cat(parts, dim=1).contiguous()


def unpack_blocks(p: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_blocks`: [rows, in / 2] uint8 -> [rows, in] uint8 0..15."""
    rows, half = p.shape
    parts, off = [], 0
    for g0, w, count in _runs(half * 2 // GROUP):
        n = 16 * w * count
        b = p[:, off:off + n].reshape(rows, count, 4, w, 4).permute(0, 1, 3, 2, 4)
        t = torch.stack([b & 15, b >> 4], dim=3)            # [rows, count, g, 2, r, j]
        parts.append(t.reshape(rows, -1))
        off += n
    return torch.cat(parts, dim=1).contiguous()


def compact_scales(d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d, m as float16 when every value survives the round trip, else float32."""
    d, m = d.float().contiguous(), m.float().contiguous()
    d16, m16 = d.half(), m.half()
    if torch.equal(d16.float(), d) and torch.equal(m16.float(), m):
        return d16, m16
    return d, m
