"""The weight layout of the int4_bf16 C++ kernel (`cpu_kernels/int4_bf16.cpp`).

Output channels in blocks of 16 (the last block padded with q = 0, d = c = 0), each
block's K columns in chunks of 8; a chunk is 64 bytes, byte 16 t + 8 h1 + s holding in
its low nibble the value of register r = h1 (and in its high nibble that of r = 2 + h1)
at bf16 lane L = 8 t + s: channel L // 2, column 2 r + L % 2 of the chunk (the order in
which `_mm512_unpacklo/hi_epi8` of the low and high nibbles gives 4 registers of
16 channels x 4 column pairs). Scales per block and group: d and c = m - 128 d (the
kernel reads each nibble as 128 + q), [blocks, groups, 16] float32. `pack_bf16_blocks`
and `unpack_bf16_blocks` are exact inverses on the real rows (q values 0..15).
"""

from __future__ import annotations

import torch

GROUP = 32
BLOCK_N = 16


def _byte_sources() -> tuple[torch.Tensor, torch.Tensor]:
    """(channel, column) within a block's chunk of each [64 bytes, 2 nibbles]."""
    b = torch.arange(64)
    t, s, h1 = b // 16, b % 8, (b % 16) // 8
    lane = 8 * t + s
    chan = (lane // 2).unsqueeze(1).expand(64, 2)
    reg = torch.stack([h1, 2 + h1], dim=1)                  # low nibble, high nibble
    col = 2 * reg + (lane % 2).unsqueeze(1)
    return chan, col


def _padded_rows(n: int) -> int:
    return -(-n // BLOCK_N) * BLOCK_N


def pack_bf16_blocks(q: torch.Tensor) -> torch.Tensor:
    """[rows, in] values 0..15 (in a multiple of 32) -> [blocks, in * 8] uint8."""
    rows, cols = q.shape
    qp = torch.zeros(_padded_rows(rows), cols, dtype=torch.uint8)
    qp[:rows] = q.to(torch.uint8)
    nb = qp.shape[0] // BLOCK_N
    qv = qp.view(nb, BLOCK_N, cols // 8, 8).permute(0, 2, 1, 3)   # [nb, chunk, chan, col]
    chan, col = _byte_sources()
    nib = qv[:, :, chan, col]                                     # [nb, chunk, 64, 2]
    return (nib[..., 0] | (nib[..., 1] << 4)).reshape(nb, cols * 8).contiguous()


def unpack_bf16_blocks(p: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of `pack_bf16_blocks`: [blocks, in * 8] -> [rows, in] uint8 0..15."""
    nb, width = p.shape
    cols = width // 8
    nib = torch.stack([p & 15, p >> 4], dim=-1).view(nb, cols // 8, 64, 2)
    chan, col = _byte_sources()
    qv = torch.empty(nb, cols // 8, BLOCK_N, 8, dtype=torch.uint8)
    qv[:, :, chan, col] = nib
    return qv.permute(0, 2, 1, 3).reshape(nb * BLOCK_N, cols)[:rows].contiguous()


def block_scales(d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d, m [rows, groups] -> [blocks, groups, 16] float32 each (padded rows 0)."""
    rows, groups = d.shape
    nb = _padded_rows(rows) // BLOCK_N

    def blocked(t: torch.Tensor) -> torch.Tensor:
        tp = torch.zeros(nb * BLOCK_N, groups, dtype=torch.float32)
        tp[:rows] = t.float()
        return tp.view(nb, BLOCK_N, groups).transpose(1, 2).contiguous()

    return blocked(d), blocked(m)


def unblock_scales(d: torch.Tensor, m: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `block_scales`: (d, m) [rows, groups] float32."""
    nb, groups, _ = d.shape

    def plain(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(nb * BLOCK_N, groups)[:rows].contiguous()

    return plain(d), plain(m)
