"""The weight layout of the q5_bf16 C++ kernel (`cpu_kernels/q5_bf16.cpp`): 5-bit values
q (0..31) in 0.625 bytes a weight, plus float16 scales.

Output channels in blocks of 16 (the last padded with q = 0, d = 0); per block and group
of 32 columns 320 bytes: the group's 4 chunks of 8 columns as the int4_bf16 kernel lays
out 4-bit values (`int4_bf16_blocks.pack_bf16_blocks` of q & 15: 4 x 64 bytes), then per
chunk two 8-byte little-endian masks: bit b of the first is bit 4 of the value in byte b's
low nibble, of the second that of byte b's high nibble. Scales d: [blocks, groups, 16]
float16 (`int4_bf16_blocks.block_scales`' order). `pack_q5_blocks` / `unpack_q5_blocks`
are exact inverses on the real rows.
"""

from __future__ import annotations

import torch

from radixlm.models.linear.int4_bf16_blocks import (BLOCK_N, GROUP, block_scales,
                                                     pack_bf16_blocks, unblock_scales,
                                                     unpack_bf16_blocks)

GROUP_BYTES = 320  # 4 chunks x (64 nibble bytes + 16 mask bytes)
_SHIFTS = torch.arange(8, dtype=torch.uint8)


def _bits_to_bytes(bits: torch.Tensor) -> torch.Tensor:
    """[..., 64] values 0/1 -> [..., 8] uint8, bit b in byte b // 8 at bit b % 8."""
    b = bits.reshape(*bits.shape[:-1], 8, 8) << _SHIFTS
    return b.sum(dim=-1, dtype=torch.uint8)


def _bytes_to_bits(b: torch.Tensor) -> torch.Tensor:
    """The inverse of `_bits_to_bytes`: [..., 8] -> [..., 64] uint8 0/1."""
    return ((b.unsqueeze(-1) >> _SHIFTS) & 1).reshape(*b.shape[:-1], 64)


def pack_q5_blocks(q: torch.Tensor) -> torch.Tensor:
    """[rows, in] values 0..31 (in a multiple of 32) -> [blocks, in / 32 * 320] uint8."""
    rows, cols = q.shape
    q = q.to(torch.uint8)
    groups = cols // GROUP
    nib = pack_bf16_blocks(q & 15)                    # [nb, cols * 8]
    nb = nib.shape[0]
    high = pack_bf16_blocks(q >> 4).view(nb, groups, 4, 64)  # nibbles 0/1 at nib's places
    masks = torch.cat([_bits_to_bytes(high & 1), _bits_to_bytes(high >> 4)], dim=-1)
    out = torch.cat([nib.view(nb, groups, 256), masks.reshape(nb, groups, 64)], dim=-1)
    return out.reshape(nb, groups * GROUP_BYTES).contiguous()


def unpack_q5_blocks(p: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of `pack_q5_blocks`: [blocks, in / 32 * 320] -> [rows, in] uint8 0..31."""
    nb, width = p.shape
    groups = width // GROUP_BYTES
    g = p.view(nb, groups, GROUP_BYTES)
    nib = g[..., :256].reshape(nb, groups * 256)
    masks = g[..., 256:].reshape(nb, groups, 4, 2, 8)
    high = _bytes_to_bits(masks[..., 0, :]) | (_bytes_to_bits(masks[..., 1, :]) << 4)
    low = unpack_bf16_blocks(nib, rows)
    return low | (unpack_bf16_blocks(high.reshape(nb, groups * 256), rows) << 4)


def q5_scales(d: torch.Tensor) -> torch.Tensor:
    """d [rows, groups] (float16 values) -> [blocks, groups, 16] float16 (padded rows 0)."""
    blocked, _ = block_scales(d, d)
    return blocked.half()


def q5_unblock_scales(d: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of `q5_scales`: [rows, groups] float32."""
    plain, _ = unblock_scales(d.float(), d.float(), rows)
    return plain


def q5_bytes(rows: int, cols: int) -> int:
    """Bytes the kernel reads for a [rows, cols] weight (rows padded to 16)."""
    padded = -(-rows // BLOCK_N) * BLOCK_N
    return padded * cols // GROUP * (GROUP_BYTES // BLOCK_N + 2)
